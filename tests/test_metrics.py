"""Tests of isojax.metrics against independent references.

References: the ``isoscore`` PyPI package (Rudman et al.), torch ports of the softdecay authors'
``tokenSimi`` / ``rbf_kernel``, numpy/scipy/sklearn implementations written here, and closed forms.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
import torch
from conftest import require
from sklearn.manifold._locally_linear import barycenter_weights
from sklearn.neighbors import NearestNeighbors

from isojax import metrics


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def anisotropic_cloud(rng, n, d):
    """Gaussian cloud with a random covariance of widely spread variances, shifted off the origin."""
    mixing = rng.normal(size=(d, d)) * rng.uniform(0.05, 3.0, size=d)
    return (rng.normal(size=(n, d)) @ mixing + rng.normal(size=d)).astype(np.float32)


def pad(x, extra, rng):
    """Append ``extra`` garbage rows and return (padded x, mask)."""
    padded = np.concatenate([x, 100 * rng.normal(size=(extra, x.shape[1])).astype(x.dtype)])
    mask = np.arange(len(padded)) < len(x)
    return padded, mask


# ---------------------------------------------------------------------------------------------- IsoScore
@pytest.mark.parametrize("n,d", [(400, 6), (60, 100), (3000, 3), (2, 5)])
def test_isoscore_matches_package(n, d):
    rng = np.random.default_rng(n + d)
    x = anisotropic_cloud(rng, n, d)
    expected = float(require("IsoScore.IsoScore").IsoScore(x.astype(np.float64)))
    np.testing.assert_allclose(float(metrics.isoscore(x)), expected, atol=1e-5)


def test_isoscore_batched_and_masked_match_package():
    rng = np.random.default_rng(0)
    clouds = [anisotropic_cloud(rng, 50, 8) for _ in range(3)]
    expected = [float(require("IsoScore.IsoScore").IsoScore(c.astype(np.float64))) for c in clouds]
    np.testing.assert_allclose(metrics.isoscore(np.stack(clouds)), expected, atol=1e-5)
    padded, mask = pad(clouds[0], 7, rng)
    np.testing.assert_allclose(float(metrics.isoscore(padded, mask=mask)), expected[0], atol=1e-5)


@pytest.mark.parametrize("zeta", [0.2, 0.7])
def test_isoscore_star_matches_package(zeta):
    rng = np.random.default_rng(1)
    for n, d in [(300, 5), (40, 64)]:
        x = anisotropic_cloud(rng, n, d)
        c0 = np.cov(anisotropic_cloud(rng, 4 * d, d).T)
        identity = float(require("IsoScore.IsoScore").IsoScore_star(x.astype(np.float64), np.eye(d), zeta))
        reference = float(require("IsoScore.IsoScore").IsoScore_star(x.astype(np.float64), c0, zeta))
        np.testing.assert_allclose(float(metrics.isoscore_star(x, zeta=zeta)), identity, atol=1e-5)
        np.testing.assert_allclose(
            float(metrics.isoscore_star(x, c0=c0.astype(np.float32), zeta=zeta)), reference, atol=1e-5
        )


@pytest.mark.parametrize("k", [1, 2, 4, 7, 8])
def test_isoscore_of_k_isotropic_dimensions(k):
    """k isotropic dimensions in R^d → (k − 1)/(d − 1) (large-sample limit)."""
    rng = np.random.default_rng(k)
    d = 8
    x = np.zeros((20000, d), np.float32)
    x[:, :k] = rng.normal(size=(20000, k))
    x = x @ np.linalg.qr(rng.normal(size=(d, d)))[0].astype(np.float32)  # random rotation
    np.testing.assert_allclose(float(metrics.isoscore(x)), (k - 1) / (d - 1), atol=0.01)


def test_isoscore_line_disk_ball():
    rng = np.random.default_rng(3)
    n = 20000
    line = np.outer(rng.uniform(-1, 1, n), [1.0, 2.0, -0.5])
    radius, angle = np.sqrt(rng.uniform(0, 1, n)), rng.uniform(0, 2 * np.pi, n)
    disk = np.stack([radius * np.cos(angle), radius * np.sin(angle), np.zeros(n)], 1)
    ball = rng.normal(size=(n, 3))
    ball *= (rng.uniform(0, 1, n) ** (1 / 3) / np.linalg.norm(ball, axis=1))[:, None]
    scores = [float(metrics.isoscore(c.astype(np.float32))) for c in (line, disk, ball)]
    assert abs(scores[0]) < 1e-4
    assert abs(scores[1] - 0.5) < 0.01
    assert scores[2] > 0.99


# ---------------------------------------------------------------------------------------------- EV_k, anisotropy
def numpy_ev(x, k, center):
    x = x.astype(np.float64)
    if center:
        x = x - x.mean(0)
    s = np.linalg.svd(x, compute_uv=False)
    return (s[:k] ** 2).sum() / (s**2).sum()


@pytest.mark.parametrize("n,d", [(50, 8), (8, 50)])
def test_explained_variance_matches_svd(n, d):
    rng = np.random.default_rng(n * d)
    x = anisotropic_cloud(rng, n, d)
    for center in (False, True):
        for k in (1, min(n, d)):
            expected = numpy_ev(x, k, center)
            np.testing.assert_allclose(float(metrics.explained_variance(x, k, center=center)), expected, rtol=1e-5)
    padded, mask = pad(x, 5, rng)
    np.testing.assert_allclose(
        float(metrics.explained_variance(padded, 2, mask=mask, center=True)), numpy_ev(x, 2, True), rtol=1e-5
    )


def test_explained_variance_of_isotropic_gaussian_is_k_over_d():
    rng = np.random.default_rng(4)
    d = 16
    x = rng.normal(size=(20000, d)).astype(np.float32)
    for k in (1, 4, 8, 16):
        assert abs(float(metrics.explained_variance(x, k)) - k / d) < 0.1 * k / d


def test_anisotropy_raw_and_centered():
    """Against numpy's float64 SVD. The float32 Gram eigenvalues are accurate to about eps * lambda_1 (Weyl's
    inequality for a backward-stable eigensolver), so every share is accurate to about eps * share_1, not to eps
    relative to itself: uncentered (offset 10, share_1 0.98) share_3 is 0.0035, and its relative error is 2.0e-5 on
    an AMD EPYC host (0.6 eps * share_1). Shares 2 and 3 differ by 7e-4, far above that tolerance."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(500, 10)).astype(np.float32) * np.linspace(1, 2, 10, dtype=np.float32) + 10.0
    eps = np.finfo(np.float32).eps
    for center in (False, True):
        xc = x - x.mean(0) if center else x
        s = np.linalg.svd(xc.astype(np.float64), compute_uv=False)
        shares = s**2 / (s**2).sum()
        for k in (1, 2, 3):  # the three components of shrink-the-longest Table 3
            got = float(metrics.anisotropy(x, k=k, center=center))
            np.testing.assert_allclose(got, shares[k - 1], rtol=1e-5, atol=8 * eps * shares[0])
    assert float(metrics.anisotropy(x)) > 0.9 > 0.2 > float(metrics.anisotropy(x, center=True))


# ---------------------------------------------------------------------------------------------- TokenUni, RBF_dis
def authors_token_simi(x):
    """Port of ``tokenSimi`` from the softdecay authors' code (includes the diagonal)."""
    x = torch.tensor(x, dtype=torch.float64)
    unit = x / torch.norm(x, dim=-1, keepdim=True)
    return float(torch.sum(unit @ unit.t()) / (x.shape[0] * x.shape[0]))


def authors_rbf_kernel(x, t):
    """Port of ``rbf_kernel`` from the softdecay authors' code."""
    x = torch.tensor(x, dtype=torch.float64)
    unit = x / torch.norm(x, dim=-1, keepdim=True)
    return float(torch.pdist(unit, p=2).pow(2).mul(-t).exp().mean().log())


def test_token_uniformity_matches_references():
    rng = np.random.default_rng(6)
    x = anisotropic_cloud(rng, 30, 12)
    np.testing.assert_allclose(
        float(metrics.token_uniformity(x, include_diagonal=True)), authors_token_simi(x), rtol=1e-5
    )
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = unit @ unit.T
    off_diagonal = (cos.sum() - np.trace(cos)) / (30 * 29)
    np.testing.assert_allclose(float(metrics.token_uniformity(x)), off_diagonal, rtol=1e-5)
    padded, mask = pad(x, 4, rng)
    np.testing.assert_allclose(float(metrics.token_uniformity(padded, mask=mask)), off_diagonal, rtol=1e-5)


def test_token_uniformity_of_isotropic_unit_vectors():
    rng = np.random.default_rng(7)
    n, d = 400, 64
    x = rng.normal(size=(n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    # Off-diagonal cosines have mean 0 and std 1/√d; their mean over n(n-1)/2 pairs is ~N(0, 2/(d n²)).
    assert abs(float(metrics.token_uniformity(x))) < 5 * np.sqrt(2 / d) / n
    assert abs(float(metrics.token_uniformity(x, include_diagonal=True)) - 1 / n) < 5 * np.sqrt(2 / d) / n


@pytest.mark.parametrize("t", [2.0, 0.5])
def test_rbf_uniformity_matches_authors_code(t):
    rng = np.random.default_rng(8)
    x = anisotropic_cloud(rng, 25, 10)
    np.testing.assert_allclose(float(metrics.rbf_uniformity(x, t=t)), authors_rbf_kernel(x, t), rtol=1e-5)
    padded, mask = pad(x, 3, rng)
    np.testing.assert_allclose(
        float(metrics.rbf_uniformity(padded, mask=mask, t=t)), authors_rbf_kernel(x, t), rtol=1e-5
    )


# ---------------------------------------------------------------------------------------------- I1, I2
def numpy_partition_isotropy(w):
    _, vectors = np.linalg.eigh(w.T @ w)
    directions = np.concatenate([vectors, -vectors], axis=1)
    z = np.exp(w @ directions).sum(0)
    return z.min() / z.max(), z.std() / z.mean()


def test_partition_isotropy_matches_numpy(x64):
    rng = np.random.default_rng(9)
    w = 0.3 * rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6)) + 0.2
    i1, i2 = metrics.partition_isotropy(jnp.asarray(w))
    ref1, ref2 = numpy_partition_isotropy(w)
    np.testing.assert_allclose([float(i1), float(i2)], [ref1, ref2], rtol=1e-9)
    i1c, i2c = metrics.partition_isotropy(jnp.asarray(w), center=True)
    np.testing.assert_allclose([float(i1c), float(i2c)], numpy_partition_isotropy(w - w.mean(0)), rtol=1e-9)
    padded, mask = pad(w, 5, rng)
    np.testing.assert_allclose(
        [float(v) for v in metrics.partition_isotropy(padded, mask=mask)], [ref1, ref2], rtol=1e-9
    )


def test_partition_isotropy_centered_isotropic_cloud_near_one_and_falls_when_shifted():
    rng = np.random.default_rng(10)
    w = 0.5 * rng.normal(size=(20000, 8)).astype(np.float32)
    i1, i2 = metrics.partition_isotropy(w - w.mean(0))
    assert float(i1) > 0.97 and float(i2) < 0.01
    shifted_i1, shifted_i2 = metrics.partition_isotropy(w + 0.5)
    assert float(shifted_i1) < 0.5 * float(i1) and float(shifted_i2) > 10 * float(i2)


def test_partition_isotropy_does_not_overflow():
    rng = np.random.default_rng(11)
    w = 200.0 * rng.normal(size=(100, 4)).astype(np.float32)  # exp(cᵀw) overflows float32
    i1, i2 = metrics.partition_isotropy(w)
    assert np.isfinite(float(i1)) and np.isfinite(float(i2)) and 0 <= float(i1) <= 1


# ---------------------------------------------------------------------------------------------- LSDS
def numpy_lsds(x, fx, k, t, weights):
    neighbours = NearestNeighbors(n_neighbors=k + 1).fit(x).kneighbors(x, return_distance=False)[:, 1:]
    if weights == "rbf":
        w = np.exp(-((x[neighbours] - x[:, None]) ** 2).sum(-1) / t)
    else:
        w = barycenter_weights(x, x, neighbours, reg=1e-3)
    reconstruction = np.einsum("nk,nke->ne", w, fx[neighbours])
    return ((fx - reconstruction) ** 2).sum(-1).mean()


@pytest.mark.parametrize("weights", ["rbf", "barycentric"])
def test_lsds_matches_sklearn_reference(weights, x64):
    rng = np.random.default_rng(12)
    x = rng.normal(size=(60, 5))
    fx = np.tanh(x @ rng.normal(size=(5, 7)))
    for k in (1, 12):
        expected = numpy_lsds(x, fx, k, 3.0, weights)
        np.testing.assert_allclose(float(metrics.lsds(x, fx, k=k, t=3.0, weights=weights)), expected, rtol=1e-7)
    padded_x, mask = pad(x, 6, rng)
    padded_fx, _ = pad(fx, 6, rng)
    expected = numpy_lsds(x, fx, 4, 3.0, weights)
    np.testing.assert_allclose(
        float(metrics.lsds(padded_x, padded_fx, k=4, t=3.0, weights=weights, mask=mask)), expected, rtol=1e-7
    )


def test_lsds_barycentric_is_small_for_linear_maps():
    """Barycentric weights sum to 1, so a linear f reconstructs as well as the identity (up to scale)."""
    rng = np.random.default_rng(13)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    linear = metrics.lsds(x, x @ rng.normal(size=(3, 3)).astype(np.float32), k=8, weights="barycentric")
    nonlinear = metrics.lsds(x, np.sin(4 * x), k=8, weights="barycentric")
    assert float(linear) < 0.05 * float(nonlinear)


# ---------------------------------------------------------------------------------------------- singular values
def test_singular_value_stats_match_numpy_scipy():
    rng = np.random.default_rng(14)
    for n, d in [(40, 9), (9, 40), (30, 30)]:
        x = anisotropic_cloud(rng, n, d)
        s = np.linalg.svd(x.astype(np.float64), compute_uv=False)
        normalized = s / s[0]
        stats = metrics.singular_value_stats(x)
        np.testing.assert_allclose(stats.normalized, normalized, rtol=1e-4, atol=1e-6)
        assert bool(np.all(stats.valid))
        np.testing.assert_allclose(float(stats.median), np.median(normalized), rtol=1e-4)
        np.testing.assert_allclose(float(stats.mean), normalized.mean(), rtol=1e-4)
        np.testing.assert_allclose(float(stats.skewness), scipy.stats.skew(normalized), rtol=1e-3, atol=1e-5)


def test_singular_value_stats_with_padding():
    rng = np.random.default_rng(15)
    x = anisotropic_cloud(rng, 5, 12)  # rank bound 5 of 12 slots... of min(n, d) after padding
    padded, mask = pad(x, 9, rng)  # n = 14 → 12 slots, 5 valid
    normalized = np.linalg.svd(x.astype(np.float64), compute_uv=False)
    normalized = normalized / normalized[0]
    stats = metrics.singular_value_stats(padded, mask=mask)
    assert stats.normalized.shape == (12,)
    np.testing.assert_array_equal(stats.valid, np.arange(12) < 5)
    np.testing.assert_allclose(stats.normalized[:5], normalized, rtol=1e-4)
    np.testing.assert_allclose(stats.normalized[5:], 0, atol=1e-5)
    np.testing.assert_allclose(float(stats.median), np.median(normalized), rtol=1e-4)
    np.testing.assert_allclose(float(stats.skewness), scipy.stats.skew(normalized), rtol=1e-3, atol=1e-5)


def test_empirical_cdf_matches_scipy():
    rng = np.random.default_rng(16)
    values = rng.uniform(size=(2, 30)).astype(np.float32)
    valid = rng.uniform(size=(2, 30)) < 0.7
    grid = np.linspace(0, 1, 41, dtype=np.float32)
    cdf = metrics.empirical_cdf(values, grid, valid=valid)
    for row in range(2):
        expected = scipy.stats.ecdf(values[row][valid[row]]).cdf.evaluate(grid)
        np.testing.assert_allclose(cdf[row], expected, atol=1e-6)


def test_empirical_cdf_of_no_value_or_a_non_finite_value_is_refused():
    """The CDF of no valid value is undefined and a NaN counted value would silently drop out of every count:
    ValueError for concrete input, NaN under jit; a NaN among the invalid values changes nothing."""
    values = np.array([[0.2, 0.6, 0.9], [0.1, 0.4, 0.8]], np.float32)
    grid = np.linspace(0, 1, 5, dtype=np.float32)
    none = np.array([[True, True, False], [False, False, False]])
    with pytest.raises(ValueError, match=r"valid must select at least 1 row\(s\) per cloud .*got 0 \(cloud \(1,\)\)"):
        metrics.empirical_cdf(values, grid, valid=none)
    traced = np.asarray(jax.jit(metrics.empirical_cdf)(values, grid, valid=none))
    assert np.isnan(traced[1]).all()  # one flag per row: the first row keeps its CDF
    np.testing.assert_allclose(traced[0], scipy.stats.ecdf(values[0, :2]).cdf.evaluate(grid), atol=1e-6)
    bad = values.copy()
    bad[0, 1] = np.nan
    with pytest.raises(ValueError, match=r"values has a non-finite value \(NaN or inf\) in row 1 of cloud \(0,\)"):
        metrics.empirical_cdf(bad, grid)
    bad[0, 1], valid = np.nan, np.array([[True, False, True], [True, True, True]])
    np.testing.assert_array_equal(
        metrics.empirical_cdf(bad, grid, valid=valid), metrics.empirical_cdf(values, grid, valid=valid)
    )


# ---------------------------------------------------------------------------------------------- transforms
METRICS = {
    "explained_variance": lambda x, mask=None: metrics.explained_variance(x, 2, mask=mask, center=True),
    "isoscore": lambda x, mask=None: metrics.isoscore(x, mask=mask),
    "isoscore_star": lambda x, mask=None: metrics.isoscore_star(x, mask=mask),
    "partition_isotropy": lambda x, mask=None: sum(metrics.partition_isotropy(x, mask=mask)),
    "token_uniformity": lambda x, mask=None: metrics.token_uniformity(x, mask=mask),
    "token_uniformity_diag": lambda x, mask=None: metrics.token_uniformity(x, mask=mask, include_diagonal=True),
    "rbf_uniformity": lambda x, mask=None: metrics.rbf_uniformity(x, mask=mask),
    "lsds": lambda x, mask=None: metrics.lsds(x, jnp.sin(x), k=1, mask=mask),
    "lsds_barycentric": lambda x, mask=None: metrics.lsds(x, jnp.sin(x), k=1, weights="barycentric", mask=mask),
    "sv_median_skew": lambda x, mask=None: (lambda s: s.median + s.skewness + s.mean)(
        metrics.singular_value_stats(x, mask=mask)
    ),
}


@pytest.mark.parametrize("name", sorted(METRICS))
def test_jit_vmap_and_mask(name):
    f = METRICS[name]
    rng = np.random.default_rng(17)
    x = rng.normal(size=(3, 6, 4)).astype(np.float32)
    mask = np.ones((3, 6), bool)
    mask[1, 4:] = False
    batched = jax.jit(f)(x, mask)
    assert batched.shape == (3,)
    np.testing.assert_allclose(jax.vmap(f)(x, mask), batched, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f(x[1, :4]), batched[1], rtol=1e-5, atol=1e-6)


def degenerate_batch():
    """Five degenerate [5, 4] clouds with masks: identical points, zero vectors, a repeated spectrum,
    and two / three real points (the latter identical) followed by garbage padding rows."""
    garbage = 50 * np.ones((5, 4), np.float32)
    identical = np.tile(np.array([[0.3, -1.0, 2.0, 0.5]], np.float32), (5, 1))
    repeated = np.concatenate([np.diag(np.array([1.0, 1.0, 2.0, 3.0], np.float32)), np.zeros((1, 4), np.float32)])
    two = np.concatenate([np.array([[1.0, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, -1.0]], np.float32), garbage[:3]])
    three_identical = np.concatenate([identical[:3], garbage[:2]])
    x = np.stack([identical, np.zeros((5, 4), np.float32), repeated, two, three_identical])
    mask = np.arange(5) < np.array([5, 5, 5, 2, 3])[:, None]
    return x, mask


@pytest.mark.parametrize("name", sorted(METRICS))
def test_finite_values_and_gradients_on_degenerate_input(name):
    f = METRICS[name]
    x, mask = degenerate_batch()
    (_, values), grad = jax.jit(jax.value_and_grad(lambda x: (jnp.sum(f(x, mask)), f(x, mask)), has_aux=True))(x)
    assert np.all(np.isfinite(values)), values
    assert np.all(np.isfinite(grad)), grad
    np.testing.assert_array_equal(np.where(mask[..., None], 0, grad), 0)  # padding gets no gradient
    two_points = x[3, :2]  # n = 2 without a mask
    value, grad = jax.jit(jax.value_and_grad(f))(two_points)
    assert np.isfinite(float(value)) and np.all(np.isfinite(grad))


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_input_raises_clear_errors():
    x = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., n, d\]"):
        metrics.isoscore(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        metrics.token_uniformity(np.zeros((4, 3), np.int32))
    with pytest.raises(ValueError, match="at least 2 points"):
        metrics.isoscore(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="at least 2 points"):
        metrics.token_uniformity(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="mask must have shape"):
        metrics.explained_variance(x, 1, mask=np.ones(5, bool))
    with pytest.raises(ValueError, match="k must be >= 1 and <= 3"):
        metrics.explained_variance(x, 4)
    with pytest.raises(ValueError, match="d >= 2"):
        metrics.isoscore(np.zeros((4, 1), np.float32))
    with pytest.raises(ValueError, match="zeta"):
        metrics.isoscore_star(x, zeta=1.5)
    with pytest.raises(ValueError, match=r"c0 must have shape \[\.\.\., 3, 3\]"):
        metrics.isoscore_star(x, c0=np.eye(4, dtype=np.float32))
    with pytest.raises(ValueError, match="fx must have shape"):
        metrics.lsds(x, np.zeros((5, 3), np.float32), k=2)
    with pytest.raises(ValueError, match="k must be >= 1 and <= 3"):
        metrics.lsds(x, x, k=4)
    with pytest.raises(ValueError, match="weights must be"):
        metrics.lsds(x, x, k=2, weights="lle")
    with pytest.raises(ValueError, match="t must be positive"):
        metrics.rbf_uniformity(x, t=0.0)
    with pytest.raises(ValueError, match="grid must have shape"):
        metrics.empirical_cdf(np.zeros(3, np.float32), np.zeros((2, 2), np.float32))
