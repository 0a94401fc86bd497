"""Flow calibration (BERT-flow): likelihood rises, exact inverse, log-det against jax.jacfwd in float64, the fitted
density against scipy's Gaussian log-pdf, ActNorm's data-dependent init against numpy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from isojax.calibrate import FlowState, apply_flow, fit_flow, invert_flow, scale_lu_updates

D = 8
CONFIG = dict(levels=2, depth=2, hidden=16, steps=200, batch_size=64, learning_rate=1e-3)


@pytest.fixture(scope="module")
def gaussian_data():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(D, D))
    cov = A @ A.T / D + 0.05 * np.eye(D)
    mean = rng.normal(size=D) * 2
    x = rng.multivariate_normal(mean, cov, size=1000).astype(np.float32)
    return x, mean, cov


@pytest.fixture(scope="module")
def fitted(gaussian_data):
    return fit_flow(gaussian_data[0], jax.random.key(0), **CONFIG)


def log_likelihood(state, x):
    z, logdet = apply_flow(state, x)
    return -0.5 * jnp.sum(z * z, -1) - 0.5 * x.shape[-1] * math.log(2 * math.pi) + logdet


def test_log_likelihood_rises_during_fitting(fitted):
    history = np.asarray(fitted.log_likelihood)
    assert history.shape == (CONFIG["steps"],) and np.isfinite(history).all()
    assert history[-20:].mean() > history[:20].mean() + 0.05  # nats per dimension


def test_fitted_density_approaches_the_true_gaussian(gaussian_data, fitted):
    """A flow with linear layers can represent the data's Gaussian exactly; scipy gives its log-density."""
    x, mean, cov = gaussian_data
    true = scipy.stats.multivariate_normal(mean, cov).logpdf(x).mean() / D
    start = fitted.log_likelihood[0]  # ActNorm start: a diagonal Gaussian, far below the correlated truth
    got = float(jnp.mean(log_likelihood(fitted, x))) / D
    assert start < true - 0.1
    assert abs(got - true) < 0.03


def test_inverse_reconstructs_inputs(gaussian_data, fitted):
    x = gaussian_data[0]
    z, _ = apply_flow(fitted, x)
    np.testing.assert_allclose(invert_flow(fitted, z), x, atol=1e-4, rtol=0)
    fresh = np.random.default_rng(1).normal(size=(50, D)).astype(np.float32)
    np.testing.assert_allclose(apply_flow(fitted, invert_flow(fitted, fresh))[0], fresh, atol=1e-4, rtol=0)


def test_calibrated_embeddings_are_nearly_isotropic(gaussian_data, fitted):
    z = np.asarray(apply_flow(fitted, gaussian_data[0])[0], np.float64)
    assert np.abs(np.cov(z.T) - np.eye(D)).max() < 0.15
    raw_cov = np.cov(gaussian_data[0].T)
    assert np.abs(raw_cov - np.diag(np.diag(raw_cov))).max() > 0.3  # the raw data was far from it


def test_logdet_matches_jacobian_determinant_float64(fitted):
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        # Perturb every parameter so that no layer is near its identity start, then work in float64.
        leaves, treedef = jax.tree.flatten(fitted.params)
        noise = [0.1 * rng.normal(size=leaf.shape) for leaf in leaves]
        params = jax.tree.unflatten(treedef, [jnp.asarray(leaf, jnp.float64) + n for leaf, n in zip(leaves, noise)])
        state = fitted.replace(params=params)
        x = jnp.asarray(rng.normal(size=(3, D)))
        _, logdet = apply_flow(state, x)
        jac = jax.vmap(jax.jacfwd(lambda v: apply_flow(state, v)[0]))(x)
        sign, ref = np.linalg.slogdet(np.asarray(jac))
        assert (sign != 0).all()
        np.testing.assert_allclose(logdet, ref, rtol=1e-10, atol=1e-10)


def test_mask_excludes_padded_rows(gaussian_data):
    """ActNorm starts from the statistics of the real rows only, and no padded row is ever drawn."""
    x = gaussian_data[0].copy()  # same shape and configuration as the fixture: the compiled fit is reused
    mask = np.arange(len(x)) < 800
    x[~mask] = 1e6  # drawing a padded row would wreck the likelihood
    # A tiny learning rate keeps the parameters within 200 * 1e-8 of their data-dependent start.
    state = fit_flow(x, jax.random.key(1), mask=mask, **{**CONFIG, "learning_rate": 1e-8})
    real = x[mask].astype(np.float64)
    center = state.constants["level0_step0"]["actnorm"]["center"]
    actnorm = state.params["level0_step0"]["actnorm"]
    np.testing.assert_allclose(center, real.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(actnorm["log_scale"], -np.log(real.std(0)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(actnorm["bias"], 0, atol=1e-5)
    history = np.asarray(state.log_likelihood)
    assert np.isfinite(history).all() and history.min() > -5


def test_shapes_jit_vmap_grad_and_pytree(fitted):
    x = np.random.default_rng(4).normal(size=(2, 5, D)).astype(np.float32)
    z, logdet = apply_flow(fitted, x)
    assert z.shape == (2, 5, D) and logdet.shape == (2, 5)
    z_flat, _ = jax.jit(apply_flow)(fitted, x.reshape(10, D))
    np.testing.assert_allclose(z_flat.reshape(2, 5, D), z, rtol=1e-5, atol=1e-5)
    z_vmapped, _ = jax.vmap(apply_flow, in_axes=(None, 0))(fitted, x)
    np.testing.assert_allclose(z_vmapped, z, rtol=1e-5, atol=1e-5)
    single, _ = apply_flow(fitted, x[0, 0])
    np.testing.assert_allclose(single, z[0, 0], rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda v: jnp.sum(apply_flow(fitted, v)[0] ** 2))(jnp.asarray(x))
    assert np.isfinite(grad).all()
    leaves = jax.tree.leaves(fitted)
    assert isinstance(fitted, FlowState) and all(isinstance(leaf, jax.Array) for leaf in leaves)
    assert fitted.variables["constants"]["level0_step0"]["linear"]["perm"].dtype == jnp.int32


def test_bad_input_raises(gaussian_data, fitted):
    x = gaussian_data[0]
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="too few for levels=3"):
        fit_flow(x[:, :4], key, levels=3)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        fit_flow(x, key, steps=0)
    with pytest.raises(TypeError, match="hidden must be a Python int"):
        fit_flow(x, key, hidden=2.5)
    with pytest.raises(ValueError, match="learning_rate"):
        fit_flow(x, key, learning_rate=0.0)
    with pytest.raises(TypeError, match="floating"):
        fit_flow(x.astype(np.int32), key)
    with pytest.raises(ValueError, match="mask must have shape"):
        fit_flow(x, key, mask=np.ones(3, bool))
    with pytest.raises(ValueError, match="d=8"):
        apply_flow(fitted, x[:, :5])
    with pytest.raises(ValueError, match="d=8"):
        invert_flow(fitted, x[:, :5])


@pytest.fixture(scope="module")
def embedding_like_cloud():
    """64 features like a sentence encoder's: shifted by ~5, correlated, principal scales 0.05..2, and 3 dead
    features (two constant, one with float noise only) as in all-MiniLM-L6-v2, whose dimensions 127, 223 and 319
    are numerically constant on STS-B."""
    rng = np.random.default_rng(5)
    n, live = 2000, 61
    q, _ = np.linalg.qr(rng.normal(size=(live, live)))
    x = 5.0 + rng.normal(size=live) + (rng.normal(size=(n, live)) * np.geomspace(0.05, 2.0, live)) @ q
    dead = np.column_stack([np.full(n, 5.0), np.full(n, -3.0), 2.0 + 1e-9 * rng.normal(size=n)])
    return np.concatenate([x, dead], axis=1).astype(np.float32)


def test_fit_is_stable_on_shifted_anisotropic_cloud_with_dead_features(embedding_like_cloud):
    """Regression: ActNorm scaled dead features by 1e6 and trained its shift in input units, so the first Adam step
    (lr 1e-3) moved them by ~1e3 and the log-likelihood fell from ~0 to -1e4 (-5e3 on MiniLM's STS-B embeddings)."""
    x = embedding_like_cloud
    config = dict(levels=2, depth=1, hidden=16, steps=150, batch_size=128)  # small: XLA's CPU compile dominates
    # A learning rate of 1e-9 keeps every parameter within 150 * 1e-9 of its data-dependent start.
    start = fit_flow(x, jax.random.key(0), learning_rate=1e-9, **config)
    z = np.asarray(apply_flow(start, x)[0], np.float64)
    for block in np.split(z, 2, axis=1):  # what level 0 factors out, what level 1 outputs
        assert np.abs(block.mean(0)).max() < 0.2
        assert 0.7 < np.sqrt(block.var(0).mean()) < 1.3
    actnorm = start.params["level0_step0"]["actnorm"]  # dead features: scaled by 1/(1e-4 rms std), not 1/eps
    floor = 1e-4 * np.sqrt(x.astype(np.float64).var(0).mean())
    np.testing.assert_allclose(actnorm["log_scale"][-3:], -np.log(floor), rtol=1e-4)

    state = fit_flow(x, jax.random.key(0), learning_rate=1e-3, **config)  # same compiled fit
    history = np.asarray(state.log_likelihood)
    assert np.isfinite(history).all()
    assert history[-20:].mean() > history[:20].mean() + 0.2  # nats per dimension
    assert history.min() > history[0] - 0.2
    z = apply_flow(state, x)[0]
    np.testing.assert_allclose(invert_flow(state, z), x, rtol=0, atol=1e-4 * np.abs(x).max())


def test_scale_lu_updates_divides_triangular_factors_by_sqrt_width():
    updates = {
        "level0_step0": {
            "linear": {
                "lower": np.ones((9, 9), np.float32),
                "upper": np.ones((9, 9), np.float32),
                "log_s": np.ones(9, np.float32),
            },
            "actnorm": {"bias": np.ones(9, np.float32)},
        }
    }
    scaled, _ = scale_lu_updates().update(updates, scale_lu_updates().init(updates))
    linear = scaled["level0_step0"]["linear"]
    np.testing.assert_allclose(linear["lower"], 1 / 3)
    np.testing.assert_allclose(linear["upper"], 1 / 3)
    np.testing.assert_allclose(linear["log_s"], 1.0)
    np.testing.assert_allclose(scaled["level0_step0"]["actnorm"]["bias"], 1.0)


@pytest.mark.slow
def test_fit_converges_at_bert_base_width():
    """Regression: at 768 features (all-mpnet-base-v2) Adam 1e-3 on the unscaled LU factors moved W by O(1) per
    step; the log-likelihood fell from 0.96 to -8.7 nats per dimension in two steps and ||z|| reached 1e5 on MPNet's
    STS15 embeddings. A correlated Gaussian cloud of that width diverges the same way without the scaling; with it
    the fit climbs towards the true density (scipy) and z has a standard Gaussian's norm, ~sqrt(d)."""
    rng = np.random.default_rng(6)
    n, d = 2000, 768
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    scales = 3.0 * np.exp(-np.arange(d) / 100.0)
    mean = 5.0 * rng.normal(size=d)
    x = (mean + (rng.normal(size=(n, d)) * scales) @ q.T).astype(np.float32)
    state = fit_flow(x, jax.random.key(0), steps=100)  # BERT-flow's defaults: 3 levels of depth 3, Adam 1e-3
    history = np.asarray(state.log_likelihood)
    assert np.isfinite(history).all() and history.min() > history[0] - 0.05
    got = float(jnp.mean(log_likelihood(state, x))) / d
    true_cov = (q * scales**2) @ q.T
    true = scipy.stats.multivariate_normal(mean, true_cov, allow_singular=False).logpdf(x).mean() / d
    assert history[0] + 0.5 < got < true + 0.05  # unscaled: got = -2e7
    norms = np.linalg.norm(np.asarray(apply_flow(state, x)[0], np.float64), axis=-1)
    assert 0.6 * math.sqrt(d) < norms.mean() < 1.4 * math.sqrt(d)  # unscaled: 1.7e5
