"""SoftDecay against a direct numpy implementation of Algorithm 1, float64 finite differences, dense Jacobians and
properties, for every decomposition strategy this backend lowers."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from spectral_helpers import (
    ALL_METHODS,
    METHODS,
    assert_operator_spectrum,
    central_difference,
    directional_difference,
    operator_cases,
    orthogonal,
    rel_err,
    with_spectrum,
)

from isojax.softdecay import SoftDecay, alpha_from_param, decay_curve, soft_decay, softdecay_derivative


def algorithm1(x, alpha, rescale=True, rank=None):
    """numpy, float64, Algorithm 1 of the paper taken literally (thin SVD, eq. 2, K = max σ / max f(σ)), on the
    top ``rank`` singular triplets (all by default)."""
    u, s, vt = np.linalg.svd(np.asarray(x, np.float64), full_matrices=False)
    r = s.shape[-1] if rank is None else rank
    u, s, vt = u[..., :r], s[..., :r], vt[..., :r, :]
    f = -np.log(1 - alpha * (s + alpha)) / alpha
    k = s.max(-1, keepdims=True) / f.max(-1, keepdims=True) if rescale else 1.0
    return (u * (k * f)[..., None, :]) @ vt


@functools.partial(jax.jit, static_argnames=("rescale", "method"))
def soft_decay_jit(x, alpha, mask=None, *, rescale=True, method="auto"):
    return soft_decay(x, alpha, mask=mask, rescale=rescale, method=method)


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("rescale", [True, False])
def test_matches_numpy_algorithm1(method, rescale):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape).astype(np.float32) for shape in [(3, 16, 48), (64, 24)]]  # per sequence, [N, d]
    alphas = np.array([-0.2, -0.6, -1.0], np.float32)
    ys = jax.jit(
        lambda xs, alphas: [
            jax.vmap(lambda a, x=x: soft_decay(x, a, rescale=rescale, method=method))(alphas) for x in xs
        ]
    )(xs, alphas)
    for x, y in zip(xs, ys):
        assert y.dtype == jnp.float32 and y.shape == (3, *x.shape)
        for alpha, y_alpha in zip(alphas, y):
            np.testing.assert_allclose(y_alpha, algorithm1(x, alpha, rescale), rtol=0, atol=1e-5)  # |ref| <= 5


@pytest.mark.parametrize("method", METHODS)
def test_mask_is_algorithm1_on_the_real_rows(method):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 12, 20)).astype(np.float32)
    lengths = np.array([12, 7, 2])
    mask = np.arange(12)[None] < lengths[:, None]
    y = soft_decay_jit(x, -0.4, mask, method=method)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(y[b, :n], algorithm1(x[b, :n], -0.4), rtol=0, atol=1e-5)
        np.testing.assert_array_equal(y[b, n:], 0)


@pytest.mark.parametrize("method", METHODS)
def test_rank_deficient_output_is_basis_independent(method):
    """Token matrix with repeated tokens (rank 4 of 10 rows): the output equals Algorithm 1 restricted to the
    non-zero singular triplets and is equivariant under row permutations and rotations of both sides."""
    rng = np.random.default_rng(2)
    x = with_spectrum(rng, 4, 16, [9.0, 5.0, 3.0, 2.0])
    x = x[[0, 1, 2, 3, 0, 0, 1, 2, 3, 3]]
    q, r, perm = orthogonal(rng, 10), orthogonal(rng, 16), rng.permutation(10)
    with jax.enable_x64(True):
        y, y_rot, y_perm = (np.asarray(soft_decay_jit(z, -0.5, method=method)) for z in (x, q @ x @ r.T, x[perm]))
    np.testing.assert_allclose(y, algorithm1(x, -0.5, rank=4), atol=1e-12)
    np.testing.assert_allclose(q.T @ y_rot @ r, y, atol=1e-12)
    np.testing.assert_allclose(y_perm, y[perm], atol=1e-12)


def _fd_cases():
    rng = np.random.default_rng(3)
    return {
        "wide": rng.standard_normal((5, 8)),
        "tall": rng.standard_normal((9, 4)),
        # exactly repeated singular values below the (simple) largest one
        "repeated-wide": with_spectrum(rng, 6, 9, [6.0, 3.0, 3.0, 3.0, 1.5, 1.5]),
        "repeated-tall": with_spectrum(rng, 9, 5, [5.0, 2.0, 2.0, 2.0, 0.8]),
    }


def _grads(method):
    """jitted: for each (x, w) and each alpha, the gradients of ⟨w, soft_decay(x, alpha)⟩ in x and alpha."""

    def grads(xs, ws, alphas):
        loss = lambda x, a, w: jnp.sum(soft_decay(x, a, method=method) * w)  # noqa: E731
        return [jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, 0, None))(x, alphas, w) for x, w in zip(xs, ws)]

    return jax.jit(grads)


@pytest.mark.parametrize("method", METHODS)
def test_gradients_match_finite_differences(method):
    xs = list(_fd_cases().values())
    ws = [np.random.default_rng(4).standard_normal(x.shape) for x in xs]
    alphas = [-0.3, -1.0]
    with jax.enable_x64(True):
        results = jax.tree.map(np.asarray, _grads(method)(xs, ws, jnp.asarray(alphas, jnp.float64)))
    for x, w, (gxs, gas) in zip(xs, ws, results):
        for alpha, gx, ga in zip(alphas, gxs, gas):
            fd_x = central_difference(lambda z: np.sum(algorithm1(z, alpha) * w), x)
            fd_a = (np.sum(algorithm1(x, alpha + 1e-6) * w) - np.sum(algorithm1(x, alpha - 1e-6) * w)) / 2e-6
            assert rel_err(gx, fd_x) < 1e-6
            assert abs(float(ga) - fd_a) < 1e-6 * abs(fd_a)


def _degenerate():
    """Degenerate token matrices as two stacks of equal shape ``(x [b, n, d], mask [b, n], case names)``: one
    compilation per stack (an all-true mask is the unmasked case)."""
    rng = np.random.default_rng(5)
    small = {
        "zeros": np.zeros((2, 12, 16)),
        "rank-1": np.broadcast_to(np.outer(rng.standard_normal(12), rng.standard_normal(16)), (2, 12, 16)),
        "repeated-rows": np.tile(rng.standard_normal((2, 1, 16)), (1, 12, 1)),
        "scaled-1e-6": 1e-6 * rng.standard_normal((2, 12, 16)),
        "scaled-1e6": 1e6 * rng.standard_normal((2, 12, 16)),
        "sigma-max-equals-alpha": np.broadcast_to(0.2 * np.eye(12, 16), (2, 12, 16)),
    }
    base = rng.standard_normal((40, 64)) * 3
    with_padding = np.concatenate([base, np.tile(base[:1], (88, 1))])  # [128, 64] of rank 40: 24 null values
    return [
        (np.concatenate(list(small.values())), np.ones((12, 12), bool), [k for k in small for _ in range(2)]),
        (
            np.stack([with_padding, with_padding]),
            np.stack([np.ones(128, bool), np.arange(128) < 40]),
            ["40-rows+88-padding", "40-rows+88-padding-masked"],
        ),
    ]


@functools.partial(jax.jit, static_argnames="method")
def _value_and_grads(xs, masks, ws, alpha, method):
    def loss(x, alpha, mask, w):
        y = soft_decay(x, alpha, mask=mask, method=method)
        return jnp.sum(y.astype(jnp.float32) * w), y

    per_matrix = jax.vmap(jax.grad(loss, argnums=(0, 1), has_aux=True), in_axes=(0, None, 0, 0))
    return [per_matrix(x, alpha, m, w) for x, m, w in zip(xs, masks, ws)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("method", METHODS)
def test_finite_gradients_on_degenerate_input(method, dtype):
    stacks = _degenerate()
    xs = [jnp.asarray(x, dtype) for x, _, _ in stacks]
    masks = [m for _, m, _ in stacks]
    ws = [jnp.asarray(np.random.default_rng(6).standard_normal(x.shape), jnp.float32) for x in xs]
    for (_, mask, names), ((g_x, g_alpha), y) in zip(
        stacks, _value_and_grads(xs, masks, ws, jnp.float32(-0.2), method)
    ):
        assert y.dtype == dtype and g_x.dtype == dtype
        y, g_x = np.asarray(y, np.float32), np.asarray(g_x, np.float32)
        for i, case in enumerate(names):
            assert np.isfinite(y[i]).all(), case
            assert np.isfinite(g_x[i]).all() and np.isfinite(g_alpha[i]), case
            np.testing.assert_array_equal(g_x[i][~mask[i]], 0)


def _degenerate_float64():
    """Float64 cases whose derivative central differences can check (not the pole σ_max = |α| of K), as stacks of
    equal shape ``(x [b, n, d], mask [b, n], case names)``."""
    rng = np.random.default_rng(13)
    small = {
        "rank-1": np.outer(rng.standard_normal(6), rng.standard_normal(8)),
        "repeated-rows": np.tile(rng.standard_normal((1, 8)), (6, 1)),
        "repeated-values": with_spectrum(rng, 6, 8, [5.0, 2.0, 2.0, 2.0]),
        "scaled-1e-6": 1e-6 * rng.standard_normal((6, 8)),
        "scaled-1e6": 1e6 * rng.standard_normal((6, 8)),
    }
    base = 3 * rng.standard_normal((5, 7))
    padded = np.concatenate([base, np.tile(base[:1], (7, 1))])  # 5 rows + 7 copies of row 1: rank 5
    return [
        (np.stack(list(small.values())), np.ones((5, 6), bool), list(small)),
        (
            np.stack([padded, padded]),
            np.stack([np.ones(12, bool), np.arange(12) < 5]),
            ["5-rows+7-copies", "5-rows+7-masked"],
        ),
    ]


@pytest.mark.parametrize("method", METHODS)
def test_degenerate_derivatives_match_finite_differences(method):
    """Float64: on the degenerate set the JVP, the gradient of ⟨W, X̃⟩ (along random directions) and ∂/∂α match
    central differences of numpy Algorithm 1 on the matrix's top-r triplets (r = its rank: the map the null rule
    defines, isojax.spectral)."""
    stacks = _degenerate_float64()
    rng = np.random.default_rng(14)
    alpha = -0.3

    @jax.jit
    def derivatives(xs, masks, ws, directions, alpha):
        def one(x, mask, w, dx):
            def y_of(z, a):
                return soft_decay(z, a, mask=mask, method=method)

            jvp = jax.jvp(lambda z: y_of(z, alpha), (x,), (dx,))[1]
            return (*jax.grad(lambda z, a: jnp.sum(y_of(z, a) * w), argnums=(0, 1))(x, alpha), jvp)

        return [jax.vmap(one)(*args) for args in zip(xs, masks, ws, directions)]

    xs, masks, _ = zip(*stacks)
    ws, directions = ([rng.standard_normal(x.shape) for x in xs] for _ in range(2))
    with jax.enable_x64(True):
        results = jax.tree.map(np.asarray, derivatives(list(xs), list(masks), ws, directions, jnp.float64(alpha)))
    for (x, mask, names), w, direction, (gx, ga, jvp) in zip(stacks, ws, directions, results):
        for i, case in enumerate(names):
            rows = mask[i]
            real, w_i, d_i = x[i][rows], w[i][rows], direction[i][rows]
            rank = np.linalg.matrix_rank(real)
            ref = lambda z, a: algorithm1(z, a, rank=rank)  # noqa: E731
            h = 1e-6 * np.abs(real).max()
            fd_dir = directional_difference(lambda z: ref(z, alpha), real, d_i, h)
            fd_loss = directional_difference(lambda z: np.sum(ref(z, alpha) * w_i), real, d_i, h)
            fd_a = (np.sum(ref(real, alpha + 1e-4) * w_i) - np.sum(ref(real, alpha - 1e-4) * w_i)) / 2e-4
            assert np.isfinite(gx[i]).all() and np.isfinite(jvp[i]).all(), case
            assert np.abs(jvp[i][rows] - fd_dir).max() <= 1e-6 * np.abs(fd_dir).max(), case
            assert abs(np.sum(gx[i][rows] * d_i) - fd_loss) <= 1e-6 * np.abs(gx[i]).max() * np.abs(d_i).sum(), case
            assert abs(float(ga[i]) - fd_a) <= 1e-6 * max(abs(fd_a), np.abs(ref(real, alpha) * w_i).sum()), case
            np.testing.assert_array_equal(gx[i][~rows], 0)
            np.testing.assert_array_equal(jvp[i][~rows], 0)


@pytest.mark.parametrize("method", METHODS)
def test_bfloat16_matches_float32_within_rounding(method):
    x = np.random.default_rng(7).standard_normal((2, 16, 32)).astype(np.float32)
    x16 = jnp.asarray(x, jnp.bfloat16)
    ref = algorithm1(np.asarray(x16, np.float64), -0.2)
    y = soft_decay_jit(x16, -0.2, method=method)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, atol=2**-8 * np.abs(ref).max())


@pytest.mark.parametrize("method", METHODS)
def test_jit_vmap_grad_agree(method):
    x = jnp.asarray(np.random.default_rng(8).standard_normal((4, 10, 24)), jnp.float32)
    alphas = [-0.2, -0.5, -0.8]
    sd = functools.partial(soft_decay, method=method)
    loss = lambda x, a: jnp.sum(sd(x, a) ** 2)  # noqa: E731

    @jax.jit  # one compilation for all the variants
    def variants(x, alphas):
        return (
            sd(x, -0.5),
            jax.vmap(lambda m: sd(m, -0.5))(x),
            jax.vmap(lambda a: sd(x, a))(alphas),
            jax.grad(loss, argnums=(0, 1))(x, -0.5),
            jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, None))(x, -0.5),
        )

    batched, per_example, per_alpha, (gx, ga), (gx_v, ga_v) = variants(x, jnp.asarray(alphas))
    np.testing.assert_allclose(per_example, batched, atol=1e-5)
    for i, a in enumerate(alphas):
        ref = algorithm1(x, a)
        assert np.abs(per_alpha[i] - ref).max() <= 1e-5 * np.abs(ref).max()
    np.testing.assert_allclose(gx_v, gx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ga_v.sum(), ga, rtol=1e-4)


@pytest.mark.parametrize("method", METHODS)
def test_sharded_training_step_matches_single_device(method):
    n_dev = jax.device_count()
    mesh = jax.make_mesh((n_dev,), ("data",), axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2 * n_dev, 16, 32)).astype(np.float32)
    mask = np.arange(16)[None] < rng.integers(4, 17, (2 * n_dev, 1))
    target = rng.standard_normal(x.shape).astype(np.float32)
    module = SoftDecay(method=method)
    params = jax.jit(module.init)(jax.random.key(0), x, mask)["params"]
    opt = optax.adam(1e-2)

    def step(params, opt_state, x, mask, target):
        def loss(params):
            return jnp.mean((module.apply({"params": params}, x, mask) - target) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    batch = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    args = (x, mask, target)
    sharded_args = (params, opt.init(params), *(jax.device_put(a, batch) for a in args))
    compiled = jax.jit(step, in_shardings=(replicated, replicated, batch, batch, batch)).lower(*sharded_args).compile()
    assert "all-gather" not in compiled.as_text()  # each device decomposes its own examples
    out = compiled(*sharded_args)
    ref = jax.jit(step)(params, opt.init(params), *args)
    assert out[2].sharding.is_fully_replicated
    chex.assert_trees_all_close(out, ref, rtol=1e-5, atol=1e-6)
    assert out[0]["theta"] != 0  # the step did train alpha


# Property tests. Spectra in [e, 1000]: f(σ)/σ decreases for σ >= e for every α in [-1, 0) (its maximiser
# σ*(α) lies in [√2, e]), which is where the paper's properties hold (see soft_decay's docstring).
spectra = st.lists(st.floats(np.e, 1e3), min_size=5, max_size=5).map(lambda v: np.sort(v)[::-1])


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=30, deadline=None)
@given(sigma=spectra, alpha=st.floats(-1.0, -0.01), seed=st.integers(0, 2**31 - 1))
def test_transformed_singular_values_keep_order_max_and_rise(method, sigma, alpha, seed):
    rng = np.random.default_rng(seed)
    u, v = orthogonal(rng, 5), orthogonal(rng, 7)[:, :5]
    x = (u * sigma) @ v.T
    with jax.enable_x64(True):
        y = np.asarray(soft_decay_jit(x, alpha, method=method))
    t = u.T @ y @ v  # y = U diag(t) Vᵀ in x's own singular bases
    np.testing.assert_allclose(t - np.diag(np.diag(t)), 0, atol=1e-9 * sigma[0])
    t = np.diag(t)
    assert np.all(np.diff(t) <= 1e-9 * sigma[0])  # order kept
    np.testing.assert_allclose(t[0], sigma[0], rtol=1e-12)  # largest unchanged
    assert np.all(t / t[0] >= sigma / sigma[0] - 1e-12)  # smaller ones rise relative to it
    np.testing.assert_allclose(np.linalg.svd(y, compute_uv=False), t, rtol=1e-9)


@pytest.fixture(scope="module")
def optimise():
    """Jitted: ``steps`` optax steps on θ for loss ``sign · α(θ)`` (pushing α towards 0 or towards −1)."""
    x = jnp.asarray(np.random.default_rng(10).standard_normal((2, 6, 8)), jnp.float32)

    def run(opt_name, lr, sign, alpha_init):
        opt = {"sgd": optax.sgd, "adam": optax.adam}[opt_name](lr)
        module = SoftDecay(alpha_init=alpha_init)

        def step(carry, _):
            params, state = carry
            grads = jax.grad(lambda p: sign * alpha_from_param(p["theta"], alpha_init))(params)
            updates, state = opt.update(grads, state, params)
            params = optax.apply_updates(params, updates)
            return (params, state), alpha_from_param(params["theta"], alpha_init)

        params = module.init(jax.random.key(0), x)["params"]
        (params, _), alphas = jax.lax.scan(step, (params, opt.init(params)), length=60)
        return alphas, module.apply({"params": params}, x)

    return jax.jit(run, static_argnums=(0, 3))


@settings(max_examples=20, deadline=None)
@given(
    opt_name=st.sampled_from(["sgd", "adam"]),
    log_lr=st.floats(-3, 3),
    sign=st.sampled_from([-1.0, 1.0]),
    alpha_init=st.sampled_from([-0.2, -0.6, -0.95]),
)
def test_alpha_stays_negative_under_optimisation(optimise, opt_name, log_lr, sign, alpha_init):
    alphas, y = optimise(opt_name, 10.0**log_lr, sign, alpha_init)
    alphas = np.asarray(alphas)
    assert np.all(alphas < 0) and np.all(alphas >= -1)
    assert np.isfinite(np.asarray(y)).all()


@pytest.mark.parametrize("alpha_init", [-0.2, -0.4, -0.6, -0.8, -0.05, -0.999, -0.3, -0.123])
def test_module_init_gives_exactly_alpha_init(alpha_init):
    module = SoftDecay(alpha_init=alpha_init)
    x = np.random.default_rng(11).standard_normal((2, 6, 9)).astype(np.float32)
    params = jax.jit(module.init)(jax.random.key(0), x)["params"]
    assert jax.tree.map(jnp.shape, params) == {"theta": ()}
    assert alpha_from_param(params["theta"], alpha_init) == np.float32(alpha_init)
    y = jax.jit(module.apply)({"params": params}, x)
    np.testing.assert_allclose(y, soft_decay_jit(x, np.float32(alpha_init)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_module_method_is_soft_decay_method(method):
    x = np.random.default_rng(15).standard_normal((2, 6, 9)).astype(np.float32)
    module = SoftDecay(method=method)
    params = jax.jit(module.init)(jax.random.key(0), x)["params"]
    y = jax.jit(module.apply)({"params": params}, x)
    np.testing.assert_allclose(y, soft_decay_jit(x, np.float32(-0.2), method=method), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y, algorithm1(x, np.float32(-0.2)), atol=1e-5)


def test_decay_curve_is_accurate_in_float32():
    """Against float64 eq. 2, including α near 0 (log1p branch) and α = −1 at small σ (log branch)."""
    s = np.geomspace(1e-4, 1e4, 200)
    for alpha in [-1e-5, -0.2, -0.7, -0.99, -1.0]:
        ref = -np.log(1 - alpha * (s + alpha)) / alpha
        got = np.asarray(decay_curve(jnp.asarray(s, jnp.float32), jnp.float32(alpha)), np.float64)
        valid = np.abs(ref) > 1e-3 * np.abs(ref).max()  # relative error is meaningless at f's root σ = |α|
        assert np.max(np.abs(got - ref)[valid] / np.abs(ref)[valid]) < 2e-6, alpha


def test_bad_input_raises():
    x = np.ones((2, 4, 3), np.float32)
    for alpha in [0.0, 0.3, -1.5]:
        with pytest.raises(ValueError, match="alpha must satisfy -1 <= alpha < 0"):
            soft_decay(x, alpha)
    with pytest.raises(ValueError, match="alpha must be a scalar"):
        soft_decay(x, np.full(2, -0.2, np.float32))
    with pytest.raises(TypeError, match="alpha must have a floating dtype"):
        soft_decay(x, np.int32(-1))
    with pytest.raises(ValueError, match="mask must have shape"):
        soft_decay(x, -0.2, mask=np.ones((2, 3), bool))
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        soft_decay(x.astype(np.int32), -0.2)
    with pytest.raises(ValueError, match="alpha_init"):
        SoftDecay(alpha_init=0.1).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="method must be 'auto', one of .* got 'gesvd'"):
        soft_decay(x, -0.2, method="gesvd")
    with pytest.raises(ValueError, match="method must be 'auto', one of .* got 'gesvd'"):
        SoftDecay(method="gesvd").init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="method must be 'auto', one of .* got 'gesvd'"):
        softdecay_derivative(x, -0.2, method="gesvd")


def test_traced_alpha_outside_domain_gives_nan_not_a_clamped_value():
    x = np.random.default_rng(12).standard_normal((2, 4, 3)).astype(np.float32)
    assert np.isnan(np.asarray(soft_decay_jit(x, 0.2))).all()
    assert np.isnan(np.asarray(soft_decay_jit(x, -1.5))).all()


# SoftDecay's derivative as an operator (isojax.softdecay.softdecay_derivative).


@pytest.mark.parametrize(
    ("method", "rescale"),
    [pytest.param(m.values[0], True, id=f"{m.id}-True") for m in METHODS]
    + [pytest.param("svd", False, id="svd-False")],
)
def test_operator_matches_jvp_vjp_and_dense_jacobian(method, rescale):
    """op.jvp == jax.jvp in x and α, op.vjp == jax.vjp, ⟨J dX, W⟩ == ⟨dX, Jᵀ W⟩, op.jvp(0, 1) == ∂X̃/∂α, and (with
    the rank-one term of K when rescaling) singular values, norm and condition number == the dense Jacobian's.
    Without the rescale the operator is spectral_derivative's, tested for every strategy in test_spectral."""

    @jax.jit
    def compute(x, mask, dx, w, alpha):
        fun = lambda z, a: soft_decay(z, a, mask=mask, rescale=rescale, method=method)  # noqa: E731
        op = softdecay_derivative(x, alpha, mask=mask, rescale=rescale, method=method)
        out = {
            "y": (op.output, fun(x, alpha)),
            "jvp": (op.jvp(dx, 0.3).y, jax.jvp(fun, (x, alpha), (dx, 0.3))[1]),
            "vjp": (op.vjp(w), jax.vjp(fun, x, alpha)[1](w)),
            "d_alpha": (op.jvp(0.0, 1.0).y, jax.jvp(lambda a: fun(x, a), (alpha,), (1.0,))[1]),
            "inner": (jnp.vdot(op.jvp(dx).y, w), jnp.vdot(dx, op.vjp(w)[0])),
        }
        if x.ndim == 2:
            out.update(sv=op.singular_values(), norm=op.norm(), cond=op.cond())
        return out

    rng = np.random.default_rng(17)
    for case, (x, mask) in operator_cases(np.random.default_rng(16), 3.0).items():  # batches: test_spectral
        dx, w = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
        with jax.enable_x64(True):
            out = jax.tree.map(np.asarray, compute(x, mask, dx, w, jnp.float64(-0.4)))
        for key in ("y", "jvp", "d_alpha"):
            got, ref = out[key]
            np.testing.assert_allclose(got, ref, atol=1e-10 * np.abs(ref).max(), err_msg=f"{case} {key}")
        for got, ref in zip(*out["vjp"], strict=True):
            np.testing.assert_allclose(got, ref, atol=1e-10 * np.abs(ref).max(), err_msg=f"{case} vjp")
        np.testing.assert_allclose(*out["inner"], rtol=1e-10)
        if "sv" in out:  # one matrix: against its dense Jacobian
            assert_operator_spectrum(
                out["sv"], out["norm"], out["cond"], lambda z, rank: algorithm1(z, -0.4, rescale, rank=rank), x, mask
            )


def test_operator_d_alpha_closed_form():
    """∂X̃/∂α = K U diag(∂f/∂α) Vᵀ + Y ∂K/∂α with ∂K/∂α = −σ_max ∂f/∂α(σ_max)/f(σ_max)² (the docstring's formula),
    written out in numpy with ∂f/∂α from eq. 2 by hand, against op.jvp(0, 1)."""
    x = np.random.default_rng(18).standard_normal((5, 7))
    alpha = -0.4
    with jax.enable_x64(True):
        d_alpha = np.asarray(jax.jit(lambda x: softdecay_derivative(x, alpha).jvp(jnp.zeros_like(x), 1.0).y)(x))
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    arg = 1 - alpha * (s + alpha)
    f = -np.log(arg) / alpha
    df_da = np.log(arg) / alpha**2 + (s + 2 * alpha) / (alpha * arg)
    k = s[0] / f[0]
    dk_da = -s[0] * df_da[0] / f[0] ** 2
    np.testing.assert_allclose(d_alpha, k * (u * df_da) @ vt + dk_da * (u * f) @ vt, atol=1e-12)
