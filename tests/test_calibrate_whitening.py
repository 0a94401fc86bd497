"""BERT-whitening against a numpy transcription of the authors' ``compute_kernel_bias`` (np.cov + np.linalg.svd)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from isojax.calibrate import WhiteningState, apply_whitening, fit_whitening
from isojax.calibrate.whitening import eigh_descending

# Compiled once per shape: cheaper than op-by-op dispatch, and it exercises the jit path.
fit_whitening = jax.jit(fit_whitening, static_argnames=("k", "eps"))
apply_whitening = jax.jit(apply_whitening, static_argnames=("normalize",))


def _sign_fix(u):
    """The documented convention: each eigenvector's largest-magnitude entry is positive."""
    idx = np.argmax(np.abs(u), axis=0)
    return u * np.sign(u[idx, np.arange(u.shape[1])])


def np_whitening(x, k):
    """BERT-whitening as in the authors' code: W = U diag(1/sqrt(s)) from SVD(np.cov(x.T)), bias -mu."""
    mu = x.mean(axis=0)
    u, s, _ = np.linalg.svd(np.cov(x.T))
    W = _sign_fix(u) / np.sqrt(s)
    return mu, W[:, :k], (x - mu) @ W[:, :k]


def correlated_cloud(rng, n, d, *, dtype=np.float64):
    A = rng.normal(size=(d, d)) * np.geomspace(3.0, 0.3, d) + 2 * np.eye(d)
    return (rng.normal(size=(n, d)) @ A.T + rng.normal(size=d) * 5).astype(dtype)


@pytest.mark.parametrize("k", [None, 3])
def test_matches_numpy_reference_float64(k):
    x = correlated_cloud(np.random.default_rng(0), 200, 7)
    mu, W, y = np_whitening(x, 7 if k is None else k)
    with jax.enable_x64(True):
        state = fit_whitening(jnp.asarray(x), k=k, eps=0.0)
        out = apply_whitening(state, jnp.asarray(x))
        np.testing.assert_allclose(state.mean, mu, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(state.W, W, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(out, y, rtol=1e-9, atol=1e-10)


def test_float32_default_eps_close_to_reference():
    x = correlated_cloud(np.random.default_rng(1), 500, 16)
    _, _, y = np_whitening(x, 16)
    out = apply_whitening(fit_whitening(x.astype(np.float32)), x.astype(np.float32))
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, y, rtol=1e-3, atol=1e-3)


def test_gaussian_cloud_whitens_to_identity_covariance():
    rng = np.random.default_rng(2)
    d = 8
    A = rng.normal(size=(d, d))
    cov = A @ A.T + 0.5 * np.eye(d)
    mean = rng.normal(size=d) * 3
    fit_x = rng.multivariate_normal(mean, cov, size=20_000).astype(np.float32)
    fresh = rng.multivariate_normal(mean, cov, size=20_000).astype(np.float32)
    state = fit_whitening(fit_x)
    # On the fitted sample: identity up to float32 rounding; on a fresh sample: up to sampling error.
    np.testing.assert_allclose(np.cov(np.asarray(apply_whitening(state, fit_x)).T), np.eye(d), atol=2e-4)
    np.testing.assert_allclose(np.cov(np.asarray(apply_whitening(state, fresh)).T), np.eye(d), atol=0.06)
    np.testing.assert_allclose(np.asarray(apply_whitening(state, fresh)).mean(0), np.zeros(d), atol=0.05)


def test_mask_ignores_padded_rows():
    rng = np.random.default_rng(3)
    x = correlated_cloud(rng, 60, 5, dtype=np.float32)
    padded = np.concatenate([x, rng.normal(size=(20, 5)).astype(np.float32) * 1e3])
    mask = np.arange(80) < 60
    ref, got = fit_whitening(x), fit_whitening(padded, mask=mask)
    chex.assert_trees_all_close(got, ref, rtol=1e-4, atol=1e-5)


def test_batched_fit_equals_separate_fits_and_jits():
    rng = np.random.default_rng(4)
    x = np.stack([correlated_cloud(rng, 40, 6, dtype=np.float32) for _ in range(3)])
    mask = rng.random((3, 40)) < 0.8
    batched = fit_whitening(x, k=4, mask=mask)
    assert batched.mean.shape == (3, 6) and batched.W.shape == (3, 6, 4)
    for b in range(3):
        single = fit_whitening(x[b][mask[b]], k=4)
        chex.assert_trees_all_close(jax.tree.map(lambda a: a[b], batched), single, rtol=1e-4, atol=1e-5)
    y = apply_whitening(batched, x)
    assert y.shape == (3, 40, 4)
    np.testing.assert_allclose(y[1], apply_whitening(jax.tree.map(lambda a: a[1], batched), x[1]), rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(jax.vmap(apply_whitening)(batched, x), y, rtol=1e-5, atol=1e-5)


def test_normalize_gives_unit_rows_and_keeps_zero_rows():
    rng = np.random.default_rng(5)
    x = correlated_cloud(rng, 30, 4, dtype=np.float32)
    state = fit_whitening(x)
    probe = np.concatenate([x[:3], state.mean[None]])  # the last row whitens to exactly zero
    y = apply_whitening(state, probe, normalize=True)
    raw = np.asarray(apply_whitening(state, probe))
    np.testing.assert_allclose(y[:3], raw[:3] / np.linalg.norm(raw[:3], axis=-1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(y[3], np.zeros(4))
    g = jax.grad(lambda p: apply_whitening(state, p, normalize=True).sum())(jnp.asarray(probe))
    assert np.isfinite(g).all()


@pytest.mark.parametrize(
    "x",
    [
        np.random.default_rng(6).normal(size=(5, 12)),  # n < d: rank-deficient covariance
        np.repeat(np.random.default_rng(7).normal(size=(2, 6)), 10, axis=0),  # two distinct points, rank 1
        np.ones((10, 4)),  # zero covariance
    ],
)
def test_degenerate_data_gives_finite_outputs_and_gradients(x):
    x = jnp.asarray(x, jnp.float32)
    probe = jnp.asarray(np.random.default_rng(8).normal(size=(3, x.shape[1])), jnp.float32)

    def loss(x):
        return jnp.sum(apply_whitening(fit_whitening(x, k=2), probe) ** 2)

    value, grad = jax.jit(jax.value_and_grad(loss))(x)
    assert np.isfinite(value) and np.isfinite(grad).all()


def test_gradient_through_fit_matches_finite_differences():
    x = correlated_cloud(np.random.default_rng(9), 12, 4)
    probe = np.random.default_rng(10).normal(size=(3, 4))
    with jax.enable_x64(True):
        f = jax.jit(lambda x: jnp.sum(jnp.sin(apply_whitening(fit_whitening(x, k=3, eps=0.0), jnp.asarray(probe)))))
        check_grads(f, (jnp.asarray(x),), order=1, modes=["fwd", "rev"], atol=1e-6, rtol=1e-6)


def test_eigh_descending_against_numpy_and_degenerate_gradient():
    rng = np.random.default_rng(11)
    A = rng.normal(size=(5, 5))
    c = A @ A.T
    with jax.enable_x64(True):
        s, u = eigh_descending(jnp.asarray(c))
        s_ref, u_ref = np.linalg.eigh(c)
        np.testing.assert_allclose(s, s_ref[::-1], rtol=1e-12)
        np.testing.assert_allclose(u, _sign_fix(u_ref[:, ::-1]), atol=1e-10)
        check_grads(
            jax.jit(lambda c: eigh_descending(c)[1][:, :2] ** 3), (jnp.asarray(c),), order=1, modes=["fwd", "rev"]
        )
    # jnp.linalg.eigh gives NaN eigenvector gradients for a repeated eigenvalue; ours stays finite.
    degenerate = jnp.diag(jnp.array([3.0, 1.0, 1.0, 0.0]))
    g = jax.grad(lambda c: jnp.sum(eigh_descending(c)[1][:, 0] * jnp.arange(4.0)))(degenerate)
    assert np.isfinite(g).all()


def test_state_is_a_pytree():
    state = fit_whitening(np.random.default_rng(12).normal(size=(20, 3)).astype(np.float32))
    assert isinstance(state, WhiteningState)
    leaves = jax.tree.leaves(state)
    assert [leaf.shape for leaf in leaves] == [(3,), (3, 3)]


def test_bad_input_raises():
    x = np.random.default_rng(13).normal(size=(10, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="k must be"):
        fit_whitening(x, k=5)
    with pytest.raises(ValueError, match="k must be"):
        fit_whitening(x, k=0)
    with pytest.raises(ValueError, match="eps"):
        fit_whitening(x, eps=-1.0)
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        fit_whitening(np.ones((10, 4), np.int32))
    with pytest.raises(ValueError, match="at least 2 points"):
        fit_whitening(x[:1])
    with pytest.raises(ValueError, match="mask must have shape"):
        fit_whitening(x, mask=np.ones(9, bool))
    with pytest.raises(ValueError, match="d=5 features"):
        apply_whitening(fit_whitening(x), np.ones((3, 5), np.float32))
