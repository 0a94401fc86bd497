"""isojax's dropout (:class:`isojax.models.dropout.Dropout`): masks that are i.i.d. Bernoulli(1 - rate) draws, checked
statistically against the binomial distribution (closed-form mean and standard deviation), and inverted scaling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from isojax.models.dropout import Dropout, bernoulli_mask

LARGE = 1 << 16


@pytest.mark.parametrize("shape", [(3, 5, 1000), (7, LARGE + 123)], ids=["small", "large"])
@pytest.mark.parametrize("keep", [0.9, 0.5, 0.03])
def test_mask_is_iid_bernoulli(shape, keep):
    mask = np.asarray(bernoulli_mask(jax.random.key(0), keep, shape)).reshape(-1).astype(np.float64)
    n = mask.size
    sigma = np.sqrt(keep * (1 - keep) / n)
    assert abs(mask.mean() - keep) < 5 * sigma  # binomial mean, 5 standard deviations
    centred = mask - mask.mean()
    for lag in (1, 2, 3, 4, LARGE)[: 5 if n > LARGE else 4]:  # neighbours (words of one threefry block); far apart
        corr = np.dot(centred[:-lag], centred[lag:]) / np.dot(centred, centred)
        assert abs(corr) < 5 / np.sqrt(n - lag), lag
    blocks = mask[: n - n % 4096].reshape(-1, 4096).mean(axis=1)  # no block of 4096 draws is off
    assert np.all(np.abs(blocks - keep) < 6 * np.sqrt(keep * (1 - keep) / 4096))


def test_masks_differ_between_keys_and_repeat_for_one_key():
    shape = (4, LARGE)
    a, b = bernoulli_mask(jax.random.key(1), 0.9, shape), bernoulli_mask(jax.random.key(2), 0.9, shape)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, bernoulli_mask(jax.random.key(1), 0.9, shape))
    # no row of one draw repeats another (a counter that restarts per row would)
    assert not np.array_equal(np.asarray(a)[0], np.asarray(a)[1])


def test_dropout_scales_kept_entries_and_zeros_the_rest():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 2048)), jnp.float32)
    y = np.asarray(Dropout(0.1).apply({}, x, False, rngs={"dropout": jax.random.key(3)}))
    kept = y != 0
    np.testing.assert_allclose(y[kept], np.asarray(x)[kept] / np.float32(0.9), rtol=1e-6)
    assert abs(kept.mean() - 0.9) < 5 * np.sqrt(0.09 / kept.size)
    np.testing.assert_array_equal(Dropout(0.1).apply({}, x, True), x)
    np.testing.assert_array_equal(Dropout(0.0).apply({}, x, False), x)
    np.testing.assert_array_equal(Dropout(1.0).apply({}, x, False, rngs={"dropout": jax.random.key(3)}), 0 * x)
    # the gradient passes through the kept entries only, scaled the same way
    g = jax.grad(lambda x: Dropout(0.1).apply({}, x, False, rngs={"dropout": jax.random.key(3)}).sum())(x)
    np.testing.assert_allclose(np.asarray(g), np.where(kept, 1 / np.float32(0.9), 0), rtol=1e-6)
