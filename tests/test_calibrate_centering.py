"""Centering, scaled centering and all-but-the-top against numpy transcriptions of too-much-in-common eq. 9-11
and of Mu & Viswanath's Algorithm 1 (PCA by numpy SVD of the centered matrix)."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isojax.calibrate import (
    AllButTheTopState,
    CenteringState,
    all_but_the_top,
    apply_all_but_the_top,
    apply_centering,
    center,
    fit_all_but_the_top,
    fit_centering,
    scaled_center,
)

# Compiled once per shape: cheaper than op-by-op dispatch, and it exercises the jit path.
center = jax.jit(center)
scaled_center = jax.jit(scaled_center)
all_but_the_top = jax.jit(all_but_the_top, static_argnames=("D", "mode"))
fit_all_but_the_top = jax.jit(fit_all_but_the_top, static_argnames=("D",))
apply_all_but_the_top = jax.jit(apply_all_but_the_top, static_argnames=("mode",))


def np_center(W):
    return W - W.mean(axis=0)


def np_scaled_center(W):
    norms = np.linalg.norm(W, axis=1, keepdims=True)
    mu_hat = (W / norms).mean(axis=0)
    return W - norms * mu_hat


def np_abtt(W, D, mode):
    """eq. 9-11; mode 'raw' projects the uncentered rows (Mu & Viswanath 2018)."""
    W_tilde = W - W.mean(axis=0)
    U = np.linalg.svd(W_tilde, full_matrices=False)[2][:D].T  # principal directions, [d, D]
    source = W_tilde if mode == "centered" else W
    return W_tilde - (source @ U) @ U.T


def shifted_cloud(rng, n, d):
    """An anisotropic cloud shifted off the origin, like a language model's embedding matrix."""
    return (rng.normal(size=(n, d)) * np.geomspace(4.0, 0.5, d) + 3.0).astype(np.float32)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(2, 12), d=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_center_and_scaled_center_match_numpy(n, d, seed):
    W = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32) + 0.5
    np.testing.assert_allclose(center(W), np_center(W), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(scaled_center(W), np_scaled_center(W), rtol=1e-4, atol=1e-4)


def test_mask_batch_and_given_mean():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(2, 9, 4)).astype(np.float32)
    mask = np.ones((2, 9), bool)
    mask[0, 6:] = False
    mask[1, 3:] = False
    for fn, ref in ((center, np_center), (scaled_center, np_scaled_center)):
        out = fn(W, mask=mask)
        for b in range(2):
            real = W[b][mask[b]]
            shift = ref(real) - real  # the transform is x - (row statistic); apply it to every row
            np.testing.assert_allclose(out[b][mask[b]], ref(real), rtol=1e-5, atol=1e-5)
            if fn is center:
                np.testing.assert_allclose(out[b] - W[b], np.broadcast_to(shift[0], (9, 4)), rtol=1e-5, atol=1e-5)
    dev_mean = W[0].mean(axis=0)
    np.testing.assert_allclose(fit_centering(W[0]).mean, dev_mean, rtol=1e-6)
    np.testing.assert_allclose(apply_centering(fit_centering(W[0]), W[1]), W[1] - dev_mean, rtol=1e-6)


@pytest.mark.parametrize("mode", ["centered", "raw"])
def test_all_but_the_top_matches_numpy(mode):
    W = shifted_cloud(np.random.default_rng(1), 300, 150)  # D defaults to ceil(150/100) = 2
    out = all_but_the_top(W, mode=mode)
    np.testing.assert_allclose(out, np_abtt(W.astype(np.float64), 2, mode), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(
        all_but_the_top(W, D=5, mode=mode), np_abtt(W.astype(np.float64), 5, mode), rtol=1e-3, atol=1e-3
    )


def test_all_but_the_top_removes_top_directions_and_modes_differ_by_constant():
    W = shifted_cloud(np.random.default_rng(2), 200, 20)
    state = fit_all_but_the_top(W, D=3)
    assert isinstance(state, AllButTheTopState) and state.directions.shape == (20, 3)
    centered = np.asarray(all_but_the_top(W, D=3))
    np.testing.assert_allclose(centered @ np.asarray(state.directions), 0, atol=1e-4)
    np.testing.assert_allclose(centered.mean(axis=0), 0, atol=1e-4)
    U, mu = np.asarray(state.directions, np.float64), W.mean(axis=0).astype(np.float64)
    diff = np.asarray(all_but_the_top(W, D=3, mode="raw"), np.float64) - centered
    np.testing.assert_allclose(diff, np.broadcast_to(-(mu @ U) @ U.T, diff.shape), rtol=1e-4, atol=1e-4)


def test_fit_on_dev_apply_to_test():
    rng = np.random.default_rng(3)
    dev, test = shifted_cloud(rng, 120, 30), shifted_cloud(rng, 50, 30)
    state = fit_all_but_the_top(dev, D=2)
    mu = dev.mean(axis=0)
    U = np.linalg.svd(dev - mu, full_matrices=False)[2][:2].T
    np.testing.assert_allclose(
        apply_all_but_the_top(state, test), (test - mu) - ((test - mu) @ U) @ U.T, rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(
        apply_all_but_the_top(state, test, mode="raw"), (test - mu) - (test @ U) @ U.T, rtol=1e-4, atol=1e-4
    )


def test_default_D_is_ceil_d_over_100():
    for d in (5, 100, 101, 201):
        W = shifted_cloud(np.random.default_rng(d), d + 5, d)
        assert fit_all_but_the_top(W).directions.shape == (d, math.ceil(d / 100))


def test_all_but_the_top_mask_and_vmap():
    rng = np.random.default_rng(4)
    W = shifted_cloud(rng, 3 * 40, 8).reshape(3, 40, 8)
    mask = rng.random((3, 40)) < 0.75
    out = all_but_the_top(W, D=2, mask=mask)
    for b in range(3):
        real = W[b][mask[b]].astype(np.float64)
        mu = real.mean(axis=0)
        U = np.linalg.svd(real - mu, full_matrices=False)[2][:2].T
        np.testing.assert_allclose(out[b], (W[b] - mu) - ((W[b] - mu) @ U) @ U.T, rtol=1e-4, atol=1e-4)
    chex.assert_trees_all_close(
        jax.vmap(lambda w, m: all_but_the_top(w, D=2, mask=m))(W, mask), out, rtol=1e-5, atol=1e-5
    )


def _sum_of_outputs(fn):
    return jax.jit(jax.value_and_grad(lambda w: jnp.sum(fn(w) ** 2 + fn(w))))


DEGENERATE_LOSSES = [
    _sum_of_outputs(fn)
    for fn in (center, scaled_center, lambda w: all_but_the_top(w, D=2), lambda w: all_but_the_top(w, mode="raw"))
]


@pytest.mark.parametrize(
    "W",
    [np.ones((6, 4)), np.zeros((6, 4)), np.concatenate([np.zeros((2, 4)), np.ones((4, 4))])],
    ids=["identical", "all-zero", "zero-rows"],
)
def test_degenerate_inputs_give_finite_values_and_gradients(W):
    for loss in DEGENERATE_LOSSES:
        value, grad = loss(jnp.asarray(W, jnp.float32))
        assert np.isfinite(value) and np.isfinite(grad).all()
    np.testing.assert_array_equal(scaled_center(jnp.zeros((3, 4))), np.zeros((3, 4)))


def test_bad_input_raises():
    W = np.ones((5, 4), np.float32)
    with pytest.raises(ValueError, match="mode must be"):
        all_but_the_top(W, mode="both")
    with pytest.raises(ValueError, match="D must be"):
        all_but_the_top(W, D=5)
    with pytest.raises(ValueError, match="D must be"):
        fit_all_but_the_top(W, D=1.5)
    state = fit_all_but_the_top(W, D=1)
    with pytest.raises(ValueError, match="state.mean must have d=3"):
        apply_all_but_the_top(state, np.ones((5, 3), np.float32))
    with pytest.raises(ValueError, match="mode must be"):
        apply_all_but_the_top(state, W, mode="both")
    with pytest.raises(ValueError, match="state.mean must have d=4"):
        apply_centering(CenteringState(mean=np.ones(3, np.float32)), W)
    with pytest.raises(TypeError, match="floating"):
        scaled_center(np.ones((5, 4), np.int32))
    with pytest.raises(ValueError, match=r"\[\.\.\., n, d\]"):
        center(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="mask must have shape"):
        scaled_center(W, mask=np.ones((4,), bool))
