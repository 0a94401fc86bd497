"""SoftDecay against a direct numpy implementation of Algorithm 1, float64 finite differences and properties."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from isojax.softdecay import SoftDecay, alpha_from_param, decay_curve, soft_decay
from spectral_helpers import central_difference, orthogonal, rel_err, with_spectrum


def algorithm1(x, alpha, rescale=True):
    """numpy, float64, Algorithm 1 of the paper taken literally (thin SVD, eq. 2, K = max σ / max f(σ))."""
    u, s, vt = np.linalg.svd(np.asarray(x, np.float64), full_matrices=False)
    f = -np.log(1 - alpha * (s + alpha)) / alpha
    k = s.max(-1, keepdims=True) / f.max(-1, keepdims=True) if rescale else 1.0
    return (u * (k * f)[..., None, :]) @ vt




soft_decay_jit = jax.jit(soft_decay, static_argnames="rescale")


@pytest.mark.parametrize("shape", [(3, 16, 48), (64, 24)], ids=["per-sequence", "embedding-matrix"])
@pytest.mark.parametrize("alpha", [-0.2, -0.6, -1.0])
@pytest.mark.parametrize("rescale", [True, False])
def test_matches_numpy_algorithm1(shape, alpha, rescale):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y = soft_decay_jit(x, alpha, rescale=rescale)
    ref = algorithm1(x, alpha, rescale)
    assert y.dtype == jnp.float32 and y.shape == shape
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5)  # entries are O(1): |ref| <= 5


def test_mask_is_algorithm1_on_the_real_rows():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 12, 20)).astype(np.float32)
    lengths = np.array([12, 7, 2])
    mask = np.arange(12)[None] < lengths[:, None]
    y = soft_decay_jit(x, -0.4, mask=mask)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(y[b, :n], algorithm1(x[b, :n], -0.4), rtol=0, atol=1e-5)
        np.testing.assert_array_equal(y[b, n:], 0)


def test_rank_deficient_output_is_basis_independent():
    """Token matrix with repeated tokens (rank 4 of 10 rows): the output equals Algorithm 1 restricted to the
    non-zero singular triplets and is equivariant under row permutations and rotations of both sides."""
    rng = np.random.default_rng(2)
    x = with_spectrum(rng, 4, 16, [9.0, 5.0, 3.0, 2.0])
    x = x[[0, 1, 2, 3, 0, 0, 1, 2, 3, 3]]
    q, r, perm = orthogonal(rng, 10), orthogonal(rng, 16), rng.permutation(10)
    with jax.enable_x64(True):
        y, y_rot, y_perm = (np.asarray(soft_decay_jit(z, -0.5)) for z in (x, q @ x @ r.T, x[perm]))
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    f = -np.log(1 - (-0.5) * (s[:4] + (-0.5))) / (-0.5)
    np.testing.assert_allclose(y, (u[:, :4] * (s[0] / f[0] * f)) @ vt[:4], atol=1e-12)
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


_grads = jax.jit(jax.grad(lambda x, a, w: jnp.sum(soft_decay(x, a) * w), argnums=(0, 1)))


@pytest.mark.parametrize("case", list(_fd_cases()))
@pytest.mark.parametrize("alpha", [-0.3, -1.0])
def test_gradients_match_finite_differences(case, alpha):
    x = _fd_cases()[case]
    w = np.random.default_rng(4).standard_normal(x.shape)
    with jax.enable_x64(True):
        gx, ga = _grads(jnp.asarray(x), jnp.asarray(alpha), jnp.asarray(w))
    fd_x = central_difference(lambda z: np.sum(algorithm1(z, alpha) * w), x)
    fd_a = (np.sum(algorithm1(x, alpha + 1e-6) * w) - np.sum(algorithm1(x, alpha - 1e-6) * w)) / 2e-6
    assert rel_err(gx, fd_x) < 1e-6
    assert abs(float(ga) - fd_a) < 1e-6 * abs(fd_a)


def _degenerate():
    """(x, mask); an all-true mask is the unmasked case (same matrices, and fewer compilations)."""
    rng = np.random.default_rng(5)
    small, padded = np.ones((2, 12), bool), np.ones((1, 128), bool)
    base = rng.standard_normal((40, 64)) * 3
    with_padding = np.concatenate([base, np.tile(base[:1], (88, 1))])[None]  # [128, 64] of rank 41: 23 null values
    return {
        "zeros": (np.zeros((2, 12, 16)), small),
        "rank-1": (np.broadcast_to(np.outer(rng.standard_normal(12), rng.standard_normal(16)), (2, 12, 16)), small),
        "repeated-rows": (np.tile(rng.standard_normal((2, 1, 16)), (1, 12, 1)), small),
        "scaled-1e-6": (1e-6 * rng.standard_normal((2, 12, 16)), small),
        "scaled-1e6": (1e6 * rng.standard_normal((2, 12, 16)), small),
        "sigma-max-equals-alpha": (np.broadcast_to(0.2 * np.eye(12, 16), (2, 12, 16)), small),
        "40-rows+88-padding": (with_padding, padded),
        "40-rows+88-padding-masked": (with_padding, np.arange(128)[None] < 40),
    }


@jax.jit
def _value_and_grads(x, alpha, mask, w):
    def loss(x, alpha):
        y = soft_decay(x, alpha, mask=mask)
        return jnp.sum(y.astype(jnp.float32) * w), y
    return jax.grad(loss, argnums=(0, 1), has_aux=True)(x, alpha)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("case", list(_degenerate()))
def test_finite_gradients_on_degenerate_input(case, dtype):
    x, mask = _degenerate()[case]
    x = jnp.asarray(x, dtype)
    w = jnp.asarray(np.random.default_rng(6).standard_normal(x.shape), jnp.float32)
    (g_x, g_alpha), y = _value_and_grads(x, jnp.float32(-0.2), mask, w)
    assert y.dtype == dtype and g_x.dtype == dtype
    assert np.isfinite(np.asarray(y, np.float32)).all()
    assert np.isfinite(np.asarray(g_x, np.float32)).all() and np.isfinite(g_alpha)
    np.testing.assert_array_equal(np.asarray(g_x, np.float32)[~mask], 0)


def test_bfloat16_matches_float32_within_rounding():
    x = np.random.default_rng(7).standard_normal((2, 16, 32)).astype(np.float32)
    x16 = jnp.asarray(x, jnp.bfloat16)
    ref = algorithm1(np.asarray(x16, np.float64), -0.2)
    y = soft_decay_jit(x16, -0.2)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, atol=2 ** -8 * np.abs(ref).max())


def test_jit_vmap_grad_agree():
    x = jnp.asarray(np.random.default_rng(8).standard_normal((4, 10, 24)), jnp.float32)
    alphas = [-0.2, -0.5, -0.8]
    loss = lambda x, a: jnp.sum(soft_decay(x, a) ** 2)  # noqa: E731

    @jax.jit  # one compilation for all the variants
    def variants(x, alphas):
        return (soft_decay(x, -0.5), jax.vmap(lambda m: soft_decay(m, -0.5))(x),
                jax.vmap(lambda a: soft_decay(x, a))(alphas),
                jax.grad(loss, argnums=(0, 1))(x, -0.5),
                jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(0, None))(x, -0.5))

    batched, per_example, per_alpha, (gx, ga), (gx_v, ga_v) = variants(x, jnp.asarray(alphas))
    np.testing.assert_allclose(per_example, batched, atol=1e-5)
    for i, a in enumerate(alphas):
        ref = algorithm1(x, a)
        assert np.abs(per_alpha[i] - ref).max() <= 1e-5 * np.abs(ref).max()
    np.testing.assert_allclose(gx_v, gx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ga_v.sum(), ga, rtol=1e-4)


def test_sharded_training_step_matches_single_device():
    n_dev = jax.device_count()
    mesh = jax.make_mesh((n_dev,), ("data",), axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2 * n_dev, 16, 32)).astype(np.float32)
    mask = np.arange(16)[None] < rng.integers(4, 17, (2 * n_dev, 1))
    target = rng.standard_normal(x.shape).astype(np.float32)
    module = SoftDecay()
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


@settings(max_examples=30, deadline=None)
@given(sigma=spectra, alpha=st.floats(-1.0, -0.01), seed=st.integers(0, 2**31 - 1))
def test_transformed_singular_values_keep_order_max_and_rise(sigma, alpha, seed):
    rng = np.random.default_rng(seed)
    u, v = orthogonal(rng, 5), orthogonal(rng, 7)[:, :5]
    x = (u * sigma) @ v.T
    with jax.enable_x64(True):
        y = np.asarray(soft_decay_jit(x, alpha))
    t = u.T @ y @ v  # y = U diag(t) Vᵀ in x's own singular bases
    np.testing.assert_allclose(t - np.diag(np.diag(t)), 0, atol=1e-9 * sigma[0])
    t = np.diag(t)
    assert np.all(np.diff(t) <= 1e-9 * sigma[0])                      # order kept
    np.testing.assert_allclose(t[0], sigma[0], rtol=1e-12)            # largest unchanged
    assert np.all(t / t[0] >= sigma / sigma[0] - 1e-12)               # smaller ones rise relative to it
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
@given(opt_name=st.sampled_from(["sgd", "adam"]), log_lr=st.floats(-3, 3), sign=st.sampled_from([-1.0, 1.0]),
       alpha_init=st.sampled_from([-0.2, -0.6, -0.95]))
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


def test_traced_alpha_outside_domain_gives_nan_not_a_clamped_value():
    x = np.random.default_rng(12).standard_normal((2, 4, 3)).astype(np.float32)
    assert np.isnan(np.asarray(soft_decay_jit(x, 0.2))).all()
    assert np.isnan(np.asarray(soft_decay_jit(x, -1.5))).all()
