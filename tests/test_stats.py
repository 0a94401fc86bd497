"""The shared masked statistics (isojax._stats) against numpy/scipy on the real rows, with garbage padding rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial.distance import cdist

from isojax import _stats, stats


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(params=[(9, 4), (3, 7)], ids=["n>d", "n<d"])
def padded(request):
    """``(x [2, n + 3, d], mask, real rows of each cloud)``: cloud 0 has n real rows, cloud 1 has n - 1."""
    n, d = request.param
    rng = np.random.default_rng(n * d)
    x = 80 * rng.normal(size=(2, n + 3, d))
    x[:, :n] = rng.normal(size=(2, n, d)) @ rng.normal(size=(d, d)) + 1.5
    mask = np.arange(n + 3) < np.array([n, n - 1])[:, None]
    return x, mask, [x[b][mask[b]] for b in range(2)]


def test_means_and_centering(padded):
    x, mask, real = padded
    np.testing.assert_allclose(_stats.masked_mean(x, mask), [r.mean(0) for r in real], rtol=1e-12)
    np.testing.assert_allclose(_stats.masked_mean(x[0]), x[0].mean(0), rtol=1e-12)
    xc, mean, count = _stats.centered_rows(x, mask)
    np.testing.assert_array_equal(count, [len(r) for r in real])
    for b, r in enumerate(real):
        np.testing.assert_allclose(xc[b][mask[b]], r - r.mean(0), atol=1e-12)
        np.testing.assert_array_equal(xc[b][~mask[b]], 0)
    rows, weights, count = _stats.masked_rows(x, mask)
    np.testing.assert_array_equal(rows[~mask], 0)
    np.testing.assert_array_equal(weights, mask)


def test_covariance_and_its_moments(padded):
    x, mask, real = padded
    for ddof in (0, 1):
        mean, cov = _stats.covariance(x, mask, ddof=ddof)
        np.testing.assert_allclose(cov, [np.cov(r.T, ddof=ddof) for r in real], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(mean, [r.mean(0) for r in real], rtol=1e-12)
    trace, sq_norm = _stats.covariance_moments(x, mask)
    np.testing.assert_allclose(trace, [np.trace(np.cov(r.T)) for r in real], rtol=1e-10)
    np.testing.assert_allclose(sq_norm, [np.sum(np.cov(r.T) ** 2) for r in real], rtol=1e-10)


def test_gram_and_its_eigenvalues(padded):
    x, mask, real = padded
    rows = _stats.masked_rows(x, mask)[0]
    gram = _stats.smaller_gram(rows)
    assert gram.shape[-1] == min(x.shape[-2:])
    expected = [np.linalg.svd(r, compute_uv=False) ** 2 for r in real]
    eigenvalues = _stats.gram_eigenvalues(rows)
    for b, e in enumerate(expected):
        np.testing.assert_allclose(eigenvalues[b][: len(e)], e, rtol=1e-9, atol=1e-9 * e[0])
        np.testing.assert_allclose(eigenvalues[b][len(e) :], 0, atol=1e-9 * e[0])


def test_cosines_and_distances(padded):
    x, mask, real = padded
    x = x.copy()
    x[0, 1] = 0  # a zero row: cosine 0 with every row, itself included
    real[0] = x[0][mask[0]]
    all_pairs, diagonal, count = _stats.cosine_sums(x, mask)
    for b, r in enumerate(real):
        norms = np.linalg.norm(r, axis=1)
        unit = np.divide(r, norms[:, None], out=np.zeros_like(r), where=norms[:, None] > 0)
        cos = unit @ unit.T
        np.testing.assert_allclose(all_pairs[b], cos.sum(), rtol=1e-10)
        np.testing.assert_allclose(diagonal[b], np.trace(cos), rtol=1e-12)
        assert count[b] == len(r)
    np.testing.assert_allclose(_stats.squared_distances(x[1]), cdist(x[1], x[1], "sqeuclidean"), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(_stats.unit_rows(x[1]), axis=-1), 1.0, rtol=1e-12)


def test_class_masks():
    labels = jnp.array([[0, 2, 1, 2, 5], [1, 1, 0, 0, 0]])
    mask = jnp.array([[True] * 4 + [False], [True] * 5])
    masks = _stats.class_masks(mask, labels, 3)
    assert masks.shape == (2, 3, 5)
    np.testing.assert_array_equal(masks[0], [[1, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 1, 0, 1, 0]])
    np.testing.assert_array_equal(masks[1].sum(-1), [3, 2, 0])
    np.testing.assert_array_equal(_stats.class_masks(None, labels[1], 2), [[0, 0, 1, 1, 1], [1, 1, 0, 0, 0]])


def test_streamed_covariance_of_real_rows_equals_numpy_over_all_of_them():
    """Host-side: the real rows of chunks of a padded cloud, streamed, give numpy's covariance of all real rows."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(5, 6, 3)) + 2.0
    mask = rng.uniform(size=(5, 6)) < 0.6
    x[~mask] = np.nan  # padding never reaches the sums
    chunks = [_stats.real_rows(x[i : i + 2], mask[i : i + 2]) for i in range(0, 5, 2)]
    assert [len(c) for c in chunks] == [mask[i : i + 2].sum() for i in range(0, 5, 2)]
    np.testing.assert_allclose(stats.streamed_covariance(chunks, "x"), np.cov(x[mask], rowvar=False), rtol=1e-12)
    assert _stats.real_rows(x, None) is x
    with pytest.raises(ValueError, match="the covariance of 'cls' needs at least 2 rows, got 1"):
        stats.streamed_covariance([x[0, :1]], "'cls'")
