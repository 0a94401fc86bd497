"""isojax.spectral against numpy SVD references, float64 central finite differences and dense Jacobians, for
every decomposition strategy this backend lowers."""

import re
from types import SimpleNamespace

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
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
    y_tolerance,
)

from experiments.benchmarks.decompositions import method_for
from isojax.softdecay import soft_decay
from isojax.spectral import (
    SpectralMap,
    available_methods,
    current_platform,
    select_method,
    spectral_derivative,
    spectral_map,
    thin_svd,
)


def g_jax(s, p):
    return p * jnp.log1p(s) + 0.5  # g(0) = 0.5 != 0: null-space vectors would leak without the null rule


def g_np(s, p):
    return p * np.log1p(s) + 0.5


def reference(x, p, rank=None):
    """numpy: U diag(g(s)) Vᵀ over the thin SVD, keeping the first ``rank`` triplets (all by default)."""
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    r = s.size if rank is None else rank
    return (u[..., :, :r] * g_np(s[..., :r], p)[..., None, :]) @ vt[..., :r, :]


@pytest.mark.parametrize("method", ALL_METHODS)
def test_forward_matches_numpy(method):
    rng = np.random.default_rng(0)
    shapes = [(5, 7), (7, 5), (6, 6), (2, 3, 4, 9)]
    xs = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    outs = jax.jit(lambda xs: [spectral_map(x, g_jax, 0.7, method=method) for x in xs])(xs)
    for x, (y, s) in zip(xs, outs):
        chex.assert_shape(y, x.shape)
        chex.assert_shape(s, x.shape[:-2] + (min(x.shape[-2:]),))
        x64 = x.astype(np.float64)
        np.testing.assert_allclose(y, reference(x64, 0.7), atol=2e-6)
        np.testing.assert_allclose(s, np.linalg.svd(x64, compute_uv=False), rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_thin_svd_is_an_svd(method, dtype):
    """U and V orthonormal, s the singular values, U diag(s) Vᵀ = X, for a wide, a tall and a rank-deficient matrix."""
    rng = np.random.default_rng(10)
    xs = [rng.standard_normal((6, 9)), rng.standard_normal((9, 6)), with_spectrum(rng, 7, 8, [3.0, 2.0, 2.0, 0.5])]
    eps = np.finfo(dtype).eps
    with jax.enable_x64(dtype == np.float64):
        outs = jax.tree.map(
            np.asarray, jax.jit(lambda xs: [thin_svd(x, method) for x in xs])([x.astype(dtype) for x in xs])
        )
    for x, (u, s, vt) in zip(xs, outs):
        assert u.dtype == s.dtype == vt.dtype == dtype
        k = min(x.shape)
        np.testing.assert_allclose(u.T @ u, np.eye(k), atol=100 * eps)
        np.testing.assert_allclose(vt @ vt.T, np.eye(k), atol=100 * eps)
        ref = np.linalg.svd(x.astype(dtype).astype(np.float64), compute_uv=False)
        np.testing.assert_allclose(s, ref, atol=100 * eps * ref[0])
        np.testing.assert_allclose((u * s) @ vt, x, atol=100 * eps * ref[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_accuracy_against_condition_number(method, dtype):
    """Each strategy meets its accuracy (spectral_helpers.y_tolerance: eps·κ, the SVD's, which the automatic choice
    assumes; eps_G·κ² on top for the Gram route) on [16, 48] matrices with geometric spectra, κ = 10 … 1e4."""
    rng = np.random.default_rng(11)
    kappas = [1e1, 1e2, 1e3, 1e4]
    xs = [with_spectrum(rng, 16, 48, np.geomspace(3.0, 3.0 / kappa, 16)).astype(dtype) for kappa in kappas]
    with jax.enable_x64(dtype == np.float64):
        ys = [np.asarray(y) for y in jax.jit(lambda xs: [spectral_map(x, g_jax, 0.7, method=method).y for x in xs])(xs)]
    for kappa, x, y in zip(kappas, xs, ys):
        assert rel_err(y, reference(x.astype(np.float64), 0.7)) < y_tolerance(method, dtype, kappa), kappa


def test_float32_gram_eigh_loses_the_small_values_the_svd_keeps():
    """The documented limit: at κ = 1e3 the float32 Gram route is off by more than 1e-4 (> eps·κ, the SVD's
    bound) while the SVD, the QR-first route and the float64 Gram route stay below 1e-5."""
    x = with_spectrum(np.random.default_rng(12), 16, 48, np.geomspace(3.0, 3e-3, 16)).astype(np.float32)
    ref = reference(x.astype(np.float64), 0.7)
    methods = {m: method_for(m) for m in ("svd", "qr_svd", "gram_eigh", "gram_eigh_f64")}
    errors = {
        name: rel_err(jax.jit(lambda x, m=m: spectral_map(x, g_jax, 0.7, method=m).y)(x), ref)
        for name, m in methods.items()
    }
    assert errors["gram_eigh"] > 1e-4
    assert max(errors["svd"], errors["qr_svd"], errors["gram_eigh_f64"]) < 1e-5, errors


def _spectra():
    rng = np.random.default_rng(1)
    return {
        "wide": rng.standard_normal((5, 7)),
        "tall": rng.standard_normal((7, 5)),
        "square": rng.standard_normal((5, 5)),
        # exactly repeated singular values (jnp.linalg.svd's own gradient is NaN here)
        "repeated-wide": with_spectrum(rng, 6, 8, [3.0, 2.0, 2.0, 2.0, 1.0, 0.5]),
        "repeated-tall": with_spectrum(rng, 8, 5, [4.0, 1.5, 1.5, 0.7, 0.7]),
        "repeated-square": with_spectrum(rng, 5, 5, [2.5, 2.5, 1.0, 1.0, 1.0]),
    }


@pytest.mark.parametrize("method", METHODS)
def test_derivatives_match_finite_differences(method):
    cases = list(_spectra().values())
    rng = np.random.default_rng(2)
    ws, directions = ([rng.standard_normal(x.shape) for x in cases] for _ in range(2))
    p = 0.7

    def derivatives(xs, ws, directions, p):
        out = []
        for x, w, dx in zip(xs, ws, directions):
            loss = lambda x, p: jnp.sum(spectral_map(x, g_jax, p, method=method).y * w)  # noqa: E731
            jvp = jax.jvp(lambda z: spectral_map(z, g_jax, p, method=method).y, (x,), (dx,))[1]
            out.append((*jax.grad(loss, argnums=(0, 1))(x, p), jvp))
        return out

    with jax.enable_x64(True):
        results = jax.tree.map(np.asarray, jax.jit(derivatives)(cases, ws, directions, jnp.float64(p)))
    for x, w, direction, (gx, gp, jvp) in zip(cases, ws, directions, results):
        fd_x = central_difference(lambda z: np.sum(reference(z, p) * w), x)
        fd_p = (np.sum(reference(x, p + 1e-6) * w) - np.sum(reference(x, p - 1e-6) * w)) / 2e-6
        fd_dir = directional_difference(lambda z: reference(z, p), x, direction)
        assert rel_err(gx, fd_x) < 1e-6
        assert abs(float(gp) - fd_p) < 1e-6 * abs(fd_p)
        assert rel_err(jvp, fd_dir) < 1e-6


def _degenerate():
    """Float64 matrices with (numerical) rank, mask or scale at the edges; (x, mask) with mask None = all rows."""
    rng = np.random.default_rng(6)
    base = rng.standard_normal((5, 7))
    padded = np.concatenate([base, np.tile(base[:1], (7, 1))])  # 5 rows + 7 copies of row 1: rank 5
    return {
        "zeros": (np.zeros((6, 8)), None),
        "rank-1": (np.outer(rng.standard_normal(6), rng.standard_normal(8)), None),
        "repeated-rows": (np.tile(rng.standard_normal((1, 8)), (6, 1)), None),
        "5-rows+7-copies": (padded, None),
        "5-rows+7-masked": (padded, np.arange(12) < 5),
        "scaled-1e-6": (1e-6 * rng.standard_normal((6, 8)), None),
        "scaled-1e6": (1e6 * rng.standard_normal((6, 8)), None),
    }


@pytest.mark.parametrize("method", METHODS)
def test_degenerate_derivatives_match_finite_differences(method):
    """Float64 derivatives on the degenerate set against central differences of the numpy map restricted to the
    matrix's rank r (the top-r triplets, the map whose derivative the null rule defines; see the module
    docstring): along random directions, for the JVP and for the gradient of ⟨W, Y⟩ in x and in p."""
    cases = _degenerate()
    rng = np.random.default_rng(7)
    ws, directions = ([rng.standard_normal(x.shape) for x, _ in cases.values()] for _ in range(2))
    p = 0.7

    def derivatives(xs, masks, ws, directions, p):
        out = []
        for x, mask, w, dx in zip(xs, masks, ws, directions):

            def y_of(z, p, mask=mask):
                return spectral_map(z, g_jax, p, mask=mask, method=method).y

            jvp = jax.jvp(lambda z: y_of(z, p), (x,), (dx,))[1]
            out.append((*jax.grad(lambda z, p: jnp.sum(y_of(z, p) * w), argnums=(0, 1))(x, p), jvp))
        return out

    xs, masks = zip(*cases.values())
    with jax.enable_x64(True):
        results = jax.tree.map(np.asarray, jax.jit(derivatives)(list(xs), list(masks), ws, directions, jnp.float64(p)))
    for (case, (x, mask)), w, direction, (gx, gp, jvp) in zip(cases.items(), ws, directions, results):
        rows = slice(None) if mask is None else mask
        real = x[rows]
        rank = np.linalg.matrix_rank(real)
        scale = np.abs(real).max() if rank else 1.0
        ref = lambda z, p: reference(z, p, rank=rank)  # noqa: E731
        h = 1e-6 * scale
        fd_dir = directional_difference(lambda z: ref(z, p), real, direction[rows], h)
        fd_loss = directional_difference(lambda z: np.sum(ref(z, p) * w[rows]), real, direction[rows], h)
        # g is linear in p, so a large step is exact and keeps rounding out (scaled-1e-6: Y ≈ 0.5·UVᵀ)
        fd_p = (np.sum(ref(real, p + 1e-2) * w[rows]) - np.sum(ref(real, p - 1e-2) * w[rows])) / 2e-2
        assert np.isfinite(gx).all() and np.isfinite(jvp).all(), case
        tol = 1e-6 * max(np.abs(fd_dir).max(), 1e-12 * scale)
        assert np.abs(jvp[rows] - fd_dir).max() < tol, case
        assert abs(np.sum(gx * direction) - fd_loss) <= 1e-6 * max(abs(fd_loss), np.abs(gx).max()), case
        assert abs(float(gp) - fd_p) <= 1e-6 * abs(fd_p), case
        if mask is not None:
            np.testing.assert_array_equal(np.asarray(gx)[~mask], 0)
            np.testing.assert_array_equal(np.asarray(jvp)[~mask], 0)


@pytest.mark.parametrize("method", METHODS)
def test_singular_value_output_derivative(method):
    x = np.random.default_rng(3).standard_normal((4, 6))
    with jax.enable_x64(True):
        grad = jax.jit(jax.grad(lambda x: jnp.sum(spectral_map(x, g_jax, 1.0, method=method).s ** 3)))(jnp.asarray(x))
    fd = central_difference(lambda z: np.sum(np.linalg.svd(z, compute_uv=False) ** 3), x)
    assert rel_err(grad, fd) < 1e-6


@pytest.mark.parametrize("method", METHODS)
def test_null_space_is_basis_independent(method):
    """Rank-deficient input, g(0) != 0: the output names no null-space vector, so it is equivariant under
    rotations and row permutations, while the literal thin-SVD map U g(S) Vᵀ is not (it depends on the basis
    LAPACK happens to return for the zero singular values)."""
    rng = np.random.default_rng(4)
    x = with_spectrum(rng, 6, 9, [3.0, 1.0, 0.5])  # rank 3 of min(n, d) = 6
    x = np.concatenate([x, x[:2]])  # 8 rows: two duplicated rows, still rank 3
    q, r = orthogonal(rng, 8), orthogonal(rng, 9)
    perm = rng.permutation(8)
    with jax.enable_x64(True):
        y, y_rot, y_perm = (
            np.asarray(y)
            for y in jax.jit(lambda xs: [spectral_map(z, g_jax, 0.7, method=method).y for z in xs])(
                [x, q @ x @ r.T, x[perm]]
            )
        )
    np.testing.assert_allclose(y, reference(x, 0.7, rank=3), atol=1e-12)
    np.testing.assert_allclose(q.T @ y_rot @ r, y, atol=1e-12)
    np.testing.assert_allclose(y_perm, y[perm], atol=1e-12)
    # the literal map leaks g(0) times an arbitrary partial isometry between the null spaces
    assert np.abs(q.T @ reference(q @ x @ r.T, 0.7) @ r - reference(x, 0.7)).max() > 1e-2
    # rotating the null-space basis of an explicit thin SVD changes the literal map, not spectral_map
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    rot = np.eye(8)
    rot[3:, 3:] = orthogonal(rng, 5)
    literal = lambda u, vt: (u * g_np(s, 0.7)) @ vt  # noqa: E731
    assert np.abs(literal(u, vt) - literal(u, rot @ vt)).max() > 1e-2
    np.testing.assert_allclose(y, literal(u, vt) - (u[:, 3:] * g_np(s[3:], 0.7)) @ vt[3:], atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_mask_leaves_rows_out(method):
    rng = np.random.default_rng(5)
    real = rng.standard_normal((5, 8)).astype(np.float32)
    x = np.concatenate([real, np.full((3, 8), np.nan, np.float32)])
    mask = np.arange(8) < 5
    w = rng.standard_normal(x.shape).astype(np.float32)
    fun = lambda x: spectral_map(x, g_jax, 0.7, mask=mask, method=method).y  # noqa: E731
    y, grad = jax.jit(lambda x: (fun(x), jax.grad(lambda x: jnp.sum(fun(x) * w))(x)))(x)
    np.testing.assert_allclose(y[:5], reference(real.astype(np.float64), 0.7), atol=2e-6)
    np.testing.assert_array_equal(y[5:], 0)
    assert np.isfinite(grad).all()
    np.testing.assert_array_equal(grad[5:], 0)


@pytest.mark.parametrize("method", METHODS)
def test_finite_gradients_on_degenerate_float32_input(method):
    cases = {
        **{k: x for k, (x, _) in _degenerate().items()},
        "40-rows+88-copies": np.concatenate(
            [b := np.random.default_rng(8).standard_normal((40, 64)), np.tile(b[:1], (88, 1))]
        ),
    }
    xs = [jnp.asarray(x, jnp.float32) for x in cases.values()]
    ws = [jnp.asarray(np.random.default_rng(7).standard_normal(x.shape), jnp.float32) for x in xs]
    grads = jax.jit(
        lambda xs, ws, p: [
            jax.grad(lambda x, p: jnp.sum(spectral_map(x, g_jax, p, method=method).y * w), argnums=(0, 1))(x, p)
            for x, w in zip(xs, ws)
        ]
    )(xs, ws, 0.7)
    for case, (gx, gp) in zip(cases, grads):
        assert np.isfinite(gx).all() and np.isfinite(gp), case


@pytest.mark.parametrize("method", METHODS)
def test_bfloat16_is_decomposed_in_float32(method):
    x = jnp.asarray(np.random.default_rng(8).standard_normal((3, 6, 10)), jnp.bfloat16)
    fun = lambda x: spectral_map(x, g_jax, 0.7, method=method)  # noqa: E731
    (y, s), grad = jax.jit(lambda x: (fun(x), jax.grad(lambda x: jnp.sum(fun(x).y.astype(jnp.float32)))(x)))(x)
    assert y.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    ref = reference(np.asarray(x, np.float64), 0.7)
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, atol=2**-7 * np.abs(ref).max())
    assert grad.dtype == jnp.bfloat16 and np.isfinite(np.asarray(grad, np.float32)).all()


@pytest.mark.parametrize("method", METHODS)
def test_jit_and_vmap_agree_with_batched_call(method):
    x = jnp.asarray(np.random.default_rng(9).standard_normal((4, 5, 7)), jnp.float32)
    loss = lambda m: jnp.sum(spectral_map(m, g_jax, 0.7, method=method).y)  # noqa: E731

    @jax.jit
    def variants(x):
        return (
            spectral_map(x, g_jax, 0.7, method=method).y,
            jax.vmap(lambda m, p: spectral_map(m, g_jax, p, method=method).y, in_axes=(0, None))(x, 0.7),
            jax.vmap(jax.grad(loss))(x),
            jax.grad(loss)(x),
        )

    batched, mapped, grad_mapped, grad = variants(x)
    np.testing.assert_allclose(mapped, batched, atol=1e-5)
    np.testing.assert_allclose(grad_mapped, grad, atol=1e-5)


def test_bad_input_raises():
    x = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match="fn"):
        spectral_map(x, "log")
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        spectral_map(np.ones((4, 3), np.int32), jnp.log1p)
    with pytest.raises(ValueError, match=r"x must have shape \[..., n, d\]"):
        spectral_map(np.ones(3, np.float32), jnp.log1p)
    with pytest.raises(ValueError, match="mask must have shape"):
        spectral_map(x, jnp.log1p, mask=np.ones(3, bool))
    with pytest.raises(ValueError, match="rtol"):
        spectral_map(x, jnp.log1p, rtol=-1.0)
    with pytest.raises(ValueError, match=r"method must be 'auto', one of \['svd', 'gram_eigh_f64'\] or a .*'lapack'"):
        spectral_map(x, jnp.log1p, method="lapack")
    with pytest.raises(ValueError, match="method must be"):
        thin_svd(x, method="eig")


def test_a_strategy_isojax_left_to_the_benchmark_is_refused_by_name():
    """The strategies measured and not chosen (svd_polar, qr_svd, float32 gram_eigh, ...) are no longer names isojax
    accepts: refused with a ValueError that names the method and points to the benchmark that keeps them, eagerly,
    under jit and under vmap; the benchmark's callable for the same name runs."""
    x = np.random.default_rng(0).standard_normal((2, 6, 4)).astype(np.float32)
    for call in (
        lambda m: spectral_map(x, jnp.log1p, method=m),
        lambda m: jax.jit(lambda x: spectral_map(x, jnp.log1p, method=m).y)(x),
        lambda m: jax.vmap(lambda x: soft_decay(x, -0.6, method=m))(x),
        lambda m: thin_svd(x, m),
    ):
        with pytest.raises(ValueError, match=r"got 'svd_polar' .*experiments/benchmarks/decompositions\.py"):
            call("svd_polar")
    np.testing.assert_allclose(
        spectral_map(x, jnp.log1p, method=method_for("qr_svd")).y, spectral_map(x, jnp.log1p).y, atol=1e-5
    )


def test_auto_rule():
    """The documented rule: LAPACK's SVD on CPU and TPU; on GPUs the float64 Gram route unless both sides are at
    most 32, where cuSOLVER's batched Jacobi SVD runs."""
    for shape in [(32, 128, 768), (2758, 384), (4, 16, 32)]:
        assert select_method("auto", shape, "cpu") == "svd"
        assert select_method("auto", shape, "tpu") == "svd"
    assert select_method("auto", (32, 128, 768), "cuda") == "gram_eigh_f64"
    assert select_method("auto", (2758, 384), "rocm") == "gram_eigh_f64"
    assert select_method("auto", (64, 16, 32), "cuda") == "svd"
    for platform in ["cpu", "cuda", "rocm", "tpu"]:
        for shape in [(32, 128, 768), (8, 8)]:
            assert select_method("auto", shape, platform) in available_methods(platform)
    with pytest.raises(ValueError, match=re.escape("'gram_eigh_f64' does not lower on tpu (only on cpu, cuda, rocm)")):
        select_method("gram_eigh_f64", (4, 4), "tpu")
    with pytest.raises(ValueError, match="platform must be one of"):
        select_method("auto", (4, 4), "gpu")


def test_current_platform_tells_cuda_from_rocm(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    for version, expected in [("PJRT C API\ncuda 12080", "cuda"), ("PJRT C API\nrocm 60300", "rocm")]:
        monkeypatch.setattr(jax.extend.backend, "get_backend", lambda v=version: SimpleNamespace(platform_version=v))
        assert current_platform() == expected
        assert select_method("auto", (8, 64, 64)) == "gram_eigh_f64"  # the GPU rule, from the current platform


# The derivative as an operator (isojax.spectral.SpectralDerivative).


def _operator_cases():
    rng = np.random.default_rng(20)
    return {**operator_cases(rng, 2.0), "batched": (rng.standard_normal((2, 3, 4)), None)}


@pytest.mark.parametrize("method", METHODS)
def test_operator_matches_jvp_vjp_and_dense_jacobian(method):
    """jvp == jax.jvp (x and p), vjp == jax.vjp (y and s cotangents), ⟨J dX, W⟩ == ⟨dX, Jᵀ W⟩, and the singular
    values, norm and condition number == those of the dense float64 Jacobian."""

    @jax.jit
    def compute(x, mask, dx, w, ds, p):
        fun = lambda z, p: spectral_map(z, g_jax, p, mask=mask, method=method)  # noqa: E731
        op = spectral_derivative(x, g_jax, p, mask=mask, method=method)
        out = {
            "op_y": op.y,
            "jvp": op.jvp(dx, 0.3),
            "jvp_ref": jax.jvp(fun, (x, p), (dx, jnp.float64(0.3))),
            "vjp": op.vjp(w, ds),
            "vjp_ref": jax.vjp(fun, x, p)[1](SpectralMap(w, ds)),
            "inner": (jnp.vdot(op.jvp(dx).y, w), jnp.vdot(dx, op.vjp(w)[0])),
        }
        if x.ndim == 2:
            out.update(sv=op.singular_values(), norm=op.norm(), cond=op.cond())
        return out

    rng = np.random.default_rng(21)
    for case, (x, mask) in _operator_cases().items():
        k = min(x.shape[-2:])
        dx, w, ds = rng.standard_normal(x.shape), rng.standard_normal(x.shape), rng.standard_normal(x.shape[:-2] + (k,))
        with jax.enable_x64(True):
            out = jax.tree.map(np.asarray, compute(x, mask, dx, w, ds, jnp.float64(0.7)))
        (y, s), (dy_ref, ds_ref) = out["jvp_ref"]
        dy, ds_op = out["jvp"]
        np.testing.assert_allclose(out["op_y"], y, atol=1e-12)
        np.testing.assert_allclose(dy, dy_ref, atol=1e-10 * np.abs(dy_ref).max(), err_msg=case)
        np.testing.assert_allclose(ds_op, ds_ref, atol=1e-10 * np.abs(ds_ref).max(), err_msg=case)
        for got, ref in zip(out["vjp"], out["vjp_ref"], strict=True):
            np.testing.assert_allclose(got, ref, atol=1e-10 * np.abs(ref).max(), err_msg=case)
        np.testing.assert_allclose(*out["inner"], rtol=1e-10)
        if "sv" in out:  # one matrix: against its dense Jacobian
            assert_operator_spectrum(
                out["sv"], out["norm"], out["cond"], lambda z, rank: reference(z, 0.7, rank=rank), x, mask
            )


def test_operator_structure_and_jit():
    """A, B symmetric with the divided differences of g, h = g/s; the operator is a pytree that jit returns and
    vmap maps over."""
    x = np.random.default_rng(22).standard_normal((3, 4, 6))
    with jax.enable_x64(True):
        op = jax.jit(lambda x: spectral_derivative(x, g_jax, 0.7))(jnp.asarray(x))
        u, s, vt = np.linalg.svd(x, full_matrices=False)
        g = g_np(s, 0.7)
        np.testing.assert_allclose(op.s, s, rtol=1e-12)
        i, j = np.triu_indices(4, 1)
        np.testing.assert_allclose(op.a[:, i, j], (g[:, i] - g[:, j]) / (s[:, i] - s[:, j]), rtol=1e-6)
        np.testing.assert_allclose(op.b[:, i, j], (g[:, i] + g[:, j]) / (s[:, i] + s[:, j]), rtol=1e-12)
        np.testing.assert_allclose(op.a, np.swapaxes(op.a, -1, -2), rtol=1e-12)
        np.testing.assert_allclose(op.h, g / s, rtol=1e-12)
        np.testing.assert_allclose(np.diagonal(op.a, axis1=-2, axis2=-1), 0.7 / (1 + s), rtol=1e-12)
        dx = jnp.asarray(np.random.default_rng(23).standard_normal(x.shape))
        per_matrix = jax.vmap(lambda o, d: o.jvp(d).y)(op, dx)
        np.testing.assert_allclose(per_matrix, op.jvp(dx).y, atol=1e-12)
