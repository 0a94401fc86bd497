"""isojax.spectral.spectral_map against numpy SVD references and float64 central finite differences."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from isojax.spectral import spectral_map
from spectral_helpers import central_difference, orthogonal, rel_err, with_spectrum


def g_jax(s, p):
    return p * jnp.log1p(s) + 0.5  # g(0) = 0.5 != 0: null-space vectors would leak without the null rule


def g_np(s, p):
    return p * np.log1p(s) + 0.5


def reference(x, p, rank=None):
    """numpy: U diag(g(s)) Vᵀ over the thin SVD, keeping the first ``rank`` triplets (all by default)."""
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    r = s.size if rank is None else rank
    return (u[..., :, :r] * g_np(s[..., :r], p)[..., None, :]) @ vt[..., :r, :]




@pytest.mark.parametrize("shape", [(5, 7), (7, 5), (6, 6), (2, 3, 4, 9)])
def test_forward_matches_numpy(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y, s = jax.jit(lambda x: spectral_map(x, g_jax, 0.7))(x)
    chex.assert_shape(y, shape)
    chex.assert_shape(s, shape[:-1][:-1] + (min(shape[-2:]),))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y, reference(x64, 0.7), atol=2e-6)
    np.testing.assert_allclose(s, np.linalg.svd(x64, compute_uv=False), rtol=1e-5)


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


@pytest.mark.parametrize("case", list(_spectra()))
def test_derivatives_match_finite_differences(case):
    x = _spectra()[case]
    rng = np.random.default_rng(2)
    w, direction = rng.standard_normal(x.shape), rng.standard_normal(x.shape)
    p = 0.7
    with jax.enable_x64(True):
        loss = lambda x, p: jnp.sum(spectral_map(x, g_jax, p).y * w)  # noqa: E731
        gx, gp = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(x), jnp.asarray(p))
        _, jvp = jax.jit(lambda x, dx: jax.jvp(lambda z: spectral_map(z, g_jax, p).y, (x,), (dx,)))(
            jnp.asarray(x), jnp.asarray(direction))
    fd_x = central_difference(lambda z: np.sum(reference(z, p) * w), x)
    fd_p = (np.sum(reference(x, p + 1e-6) * w) - np.sum(reference(x, p - 1e-6) * w)) / 2e-6
    fd_dir = (reference(x + 1e-6 * direction, p) - reference(x - 1e-6 * direction, p)) / 2e-6
    assert rel_err(gx, fd_x) < 1e-6
    assert abs(float(gp) - fd_p) < 1e-6 * abs(fd_p)
    assert rel_err(jvp, fd_dir) < 1e-6


def test_singular_value_output_derivative():
    x = np.random.default_rng(3).standard_normal((4, 6))
    with jax.enable_x64(True):
        grad = jax.jit(jax.grad(lambda x: jnp.sum(spectral_map(x, g_jax, 1.0).s ** 3)))(jnp.asarray(x))
    fd = central_difference(lambda z: np.sum(np.linalg.svd(z, compute_uv=False) ** 3), x)
    assert rel_err(grad, fd) < 1e-6


def test_null_space_is_basis_independent():
    """Rank-deficient input, g(0) != 0: the output names no null-space vector, so it is equivariant under
    rotations and row permutations, while the literal thin-SVD map U g(S) Vᵀ is not (it depends on the basis
    LAPACK happens to return for the zero singular values)."""
    rng = np.random.default_rng(4)
    x = with_spectrum(rng, 6, 9, [3.0, 1.0, 0.5])          # rank 3 of min(n, d) = 6
    x = np.concatenate([x, x[:2]])                           # 8 rows: two duplicated rows, still rank 3
    q, r = orthogonal(rng, 8), orthogonal(rng, 9)
    perm = rng.permutation(8)
    with jax.enable_x64(True):
        fun = jax.jit(lambda x: spectral_map(x, g_jax, 0.7).y)
        y, y_rot, y_perm = (np.asarray(fun(z)) for z in (x, q @ x @ r.T, x[perm]))
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


def test_mask_leaves_rows_out():
    rng = np.random.default_rng(5)
    real = rng.standard_normal((5, 8)).astype(np.float32)
    x = np.concatenate([real, np.full((3, 8), np.nan, np.float32)])
    mask = np.arange(8) < 5
    w = rng.standard_normal(x.shape).astype(np.float32)
    fun = jax.jit(lambda x: spectral_map(x, g_jax, 0.7, mask=mask).y)
    y = fun(x)
    np.testing.assert_allclose(y[:5], reference(real.astype(np.float64), 0.7), atol=2e-6)
    np.testing.assert_array_equal(y[5:], 0)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(fun(x) * w)))(x)
    assert np.isfinite(grad).all()
    np.testing.assert_array_equal(grad[5:], 0)


def _degenerate():
    rng = np.random.default_rng(6)
    base = rng.standard_normal((40, 64))
    return {
        "zeros": np.zeros((6, 8)),
        "rank-1": np.outer(rng.standard_normal(6), rng.standard_normal(8)),
        "repeated-rows": np.tile(rng.standard_normal((1, 8)), (6, 1)),
        "40-rows+88-padding": np.concatenate([base, np.tile(base[:1], (88, 1))]),
        "scaled-1e-6": 1e-6 * rng.standard_normal((6, 8)),
        "scaled-1e6": 1e6 * rng.standard_normal((6, 8)),
    }


@pytest.mark.parametrize("case", list(_degenerate()))
def test_finite_gradients_on_degenerate_input(case):
    x = jnp.asarray(_degenerate()[case], jnp.float32)
    w = jnp.asarray(np.random.default_rng(7).standard_normal(x.shape), jnp.float32)
    gx, gp = jax.jit(jax.grad(lambda x, p: jnp.sum(spectral_map(x, g_jax, p).y * w), argnums=(0, 1)))(x, 0.7)
    assert np.isfinite(gx).all() and np.isfinite(gp)


def test_bfloat16_is_decomposed_in_float32():
    x = jnp.asarray(np.random.default_rng(8).standard_normal((3, 6, 10)), jnp.bfloat16)
    y, s = jax.jit(lambda x: spectral_map(x, g_jax, 0.7))(x)
    assert y.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    ref = reference(np.asarray(x, np.float64), 0.7)
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, atol=2 ** -7 * np.abs(ref).max())
    grad = jax.jit(jax.grad(lambda x: jnp.sum(spectral_map(x, g_jax, 0.7).y.astype(jnp.float32))))(x)
    assert grad.dtype == jnp.bfloat16 and np.isfinite(np.asarray(grad, np.float32)).all()


def test_jit_and_vmap_agree_with_batched_call():
    x = jnp.asarray(np.random.default_rng(9).standard_normal((4, 5, 7)), jnp.float32)
    loss = lambda m: jnp.sum(spectral_map(m, g_jax, 0.7).y)  # noqa: E731
    batched = jax.jit(lambda m: spectral_map(m, g_jax, 0.7).y)(x)
    mapped = jax.jit(jax.vmap(lambda m, p: spectral_map(m, g_jax, p).y, in_axes=(0, None)))(x, 0.7)
    np.testing.assert_allclose(mapped, batched, atol=1e-5)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(loss)))(x), jax.jit(jax.grad(loss))(x), atol=1e-5)


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
