"""Isotropy and uniformity measures of point clouds and embedding matrices.

Conventions (the same in :mod:`isojax.metrics`, :mod:`isojax.losses`, :mod:`isojax.topology` and
:mod:`isojax.calibrate`):

* **Plain functions, the caller jits.** Nothing is jitted where it is defined: wrap a measure in ``jax.jit``
  (or call it inside your own jitted function). Shape-like arguments -- integers such as ``k``, strings such
  as ``weights``, booleans such as ``center`` -- must then be static (``static_argnames`` or a closure).
* **Float hyperparameters are traced** (``zeta``, ``t``, ``reg``): they may be arrays inside ``jit``, so a
  new value does not recompile and ``jax.grad`` with respect to them works. A concrete value out of range
  raises ``ValueError``; a traced value out of range makes the result NaN (never silently clamped).
* **Shapes and masks.** ``x`` is ``[..., n, d]`` (n points or tokens, d features) and ``mask`` an optional
  ``[..., n]`` bool array (true = real row). Padding rows are excluded exactly: they never enter a mean, a
  covariance, a count or a pair, and they receive zero gradient.
* **One value per cloud, no reduction.** Each measure is a property of a whole cloud; leading axes index
  independent clouds and the result has shape ``[...]`` (unless stated otherwise). Nothing is averaged over
  the leading axes: reducing or weighting them is left to the caller.

All functions work under ``jit``, ``vmap`` and ``grad``; degenerate input (identical points, zero rows,
n = 2, rank deficiency) gives finite values and finite gradients.

**Bad input** (the rule of :func:`isojax._validate.check_cloud`): padding rows never influence a result or
its gradient, whatever they hold; a NaN or inf in a counted row is a ``ValueError`` naming the argument and
the row for concrete input and gives NaN under tracing; integer masks hold only 0 and 1 (a traced integer mask
with another value gives NaN); a mask selecting fewer real rows than a measure is defined for (one; two where it
needs a covariance or a pair) is a ``ValueError`` for a concrete mask and NaN for a traced one. The
scale-invariant measures (:func:`explained_variance`, :func:`anisotropy`, :func:`isoscore`,
:func:`token_uniformity`, :func:`rbf_uniformity`, :func:`singular_value_stats`) divide the cloud by a power of two
near its largest entry first, so they are exact for any finite float32 scale (1e±20 included); the others say
what range they handle. Spectral work (Gram/covariance matrices,
eigenvalues, singular values) is done in at least float32 with full-precision matmuls, whatever the input
dtype.

Measures and their sources (papers in ``shared/papers``):

* :func:`explained_variance` EV_k -- softdecay-token-uniformity eq. 5, isotropy-layer-joint-loss eq. 1.
* :func:`isoscore`, :func:`isoscore_star` -- Rudman et al. (2022) IsoScore and IsoScore* (I-STAR),
  used by isotropy-layer-joint-loss §2.2 / §3.3.
* :func:`partition_isotropy` I1, I2 -- isotropy-calibration-evaluation App. A,
  too-much-in-common-centering eq. 7-8.
* :func:`token_uniformity` (TokenUni, eq. 3), :func:`rbf_uniformity` (RBF_dis, eq. 4),
  :func:`lsds` (LSDS, eq. 6) -- softdecay-token-uniformity §4.4.
* :func:`anisotropy` -- shrink-the-longest-persistent-entropy §2 (after Razzhigaev et al.).
* :func:`singular_value_stats`, :func:`empirical_cdf` -- softdecay-token-uniformity §3.2, Figures 1-2.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from isojax._numeric import HIGHEST, finite_matrix, promote_float32, safe_div, safe_sqrt
from isojax._stats import (
    centered_rows,
    cosine_sums,
    covariance,
    covariance_moments,
    gram_eigenvalues,
    masked_rows,
    select_rows,
    squared_distances,
    unit_rows,
    unit_scale,
)
from isojax._validate import (
    check_choice,
    check_cloud,
    check_finite_rows,
    check_float,
    check_hyperparameter,
    check_points,
    check_positive_int,
    check_real_rows,
    check_square,
    nan_unless,
)

__all__ = [
    "explained_variance",
    "isoscore",
    "isoscore_star",
    "partition_isotropy",
    "token_uniformity",
    "rbf_uniformity",
    "lsds",
    "anisotropy",
    "SingularValueStats",
    "singular_value_stats",
    "empirical_cdf",
]


# ----------------------------------------------------------------------------------------------
# Spectrum-based measures
# ----------------------------------------------------------------------------------------------
def explained_variance(x, k: int = 1, *, mask=None, center: bool = False):
    """Explained variance of the top-``k`` singular directions (EV_k).

    EV_k(X) = Σ_{i≤k} σ_i² / Σ_j σ_j²  (softdecay-token-uniformity eq. 5; isotropy-layer eq. 1),
    σ the singular values of the ``[n, d]`` matrix of real rows, sorted descending. With
    ``center=True`` the rows are centered first (then σ_i² / (n-1) are the PCA variances and EV_k is
    the PCA explained-variance ratio). An all-zero matrix has EV_k = 0.

    Args:
      x: ``[..., n, d]`` float array.
      k: number of leading directions, ``1 <= k <= min(n, d)`` (static).
      mask: optional ``[..., n]`` bool, true = real row.
      center: subtract the mean of the real rows before the decomposition.

    Returns:
      ``[...]`` values in [0, 1], float32 (or ``x``'s dtype if wider).

    Examples:
      Singular values 4 and 3: EV_1 = 16 / 25.

      >>> import numpy as np
      >>> from isojax import metrics
      >>> round(float(metrics.explained_variance(np.array([[3.0, 0.0], [0.0, 4.0]], np.float32), 1)), 4)
      0.64
    """
    x, mask, ok = check_cloud(x, mask, min_n=2 if center else 1)
    check_positive_int(k, "k", upper=min(x.shape[-2:]))
    return nan_unless(ok, jnp.sum(_variance_shares(x, mask, center)[..., :k], axis=-1))


def anisotropy(x, *, k: int = 1, mask=None, center: bool = False):
    """k-th anisotropy score σ_k² / Σ_i σ_i² of an embedding matrix (k = 1: the anisotropy, = EV_1).

    shrink-the-longest-persistent-entropy §2 (after Razzhigaev et al. 2024; its Table 3 lists the
    first three components), reported both raw (``center=False``) and on centered embeddings
    (``center=True``: the share of the k-th covariance eigenvalue).

    Args:
      x: ``[..., n, d]`` float array.
      k: component, ``1 <= k <= min(n, d)`` (static).
      mask: optional ``[..., n]`` bool, true = real row.
      center: subtract the mean of the real rows first.

    Returns:
      ``[...]`` values in [0, 1], float32 (or ``x``'s dtype if wider).

    Examples:
      Singular values 4 and 3: the second component's share is 9 / 25.

      >>> import numpy as np
      >>> from isojax import metrics
      >>> round(float(metrics.anisotropy(np.array([[3.0, 0.0], [0.0, 4.0]], np.float32), k=2)), 4)
      0.36
    """
    x, mask, ok = check_cloud(x, mask, min_n=2 if center else 1)
    check_positive_int(k, "k", upper=min(x.shape[-2:]))
    return nan_unless(ok, _variance_shares(x, mask, center)[..., k - 1])


def _variance_shares(x, mask, center):
    """σ_i² / Σ_j σ_j², descending, ``[..., min(n, d)]``, of the (centered) real rows; 0 for x = 0."""
    x = unit_scale(promote_float32(x), mask)[0]
    x = centered_rows(x, mask)[0] if center else masked_rows(x, mask)[0]
    return safe_div(gram_eigenvalues(x), jnp.sum(x * x, axis=(-2, -1))[..., None])


def _isoscore_from_moments(trace, sq_norm, d: int):
    """IsoScore of a PSD covariance from its trace and squared Frobenius norm (see :func:`isoscore`).

    ((tr C)² / ‖C‖_F² − 1) / (d − 1); a zero covariance (all points identical) has score 0, the limit of a
    one-dimensional cloud.
    """
    return jnp.where(sq_norm > 0, (safe_div(trace**2, sq_norm) - 1) / (d - 1), 0)


def isoscore(x, *, mask=None):
    """IsoScore (Rudman et al. 2022): the fraction of dimensions uniformly used by a point cloud.

    PCA-rotate the real rows; v = the principal-component variances (sample covariance, ddof=1);
    scale v to norm √d; isotropy defect δ = ‖v − 1‖ / √(2(d − √d));
    IsoScore = ((d − δ²(d − √d))² − d) / (d(d − 1)) ∈ [0, 1].
    Expanding δ² with ‖v‖² = d gives d − δ²(d − √d) = Σ_k v_k = √d Σλ/‖λ‖, λ the variances, so

        IsoScore = ((Σ_k λ_k)² / Σ_k λ_k² − 1) / (d − 1) = ((tr C)² / ‖C‖_F² − 1) / (d − 1),

    the participation ratio of the covariance C, rescaled: it needs no eigendecomposition, and that is
    how it is computed (λ ≥ 0 for the PSD C, as in the package's ``svdvals``).
    Closed forms: k isotropic dimensions of R^d give (k − 1)/(d − 1) in the large-sample limit
    (a line → 0, a disk in R³ → 0.5, a ball → 1). Identical points give 0. Matches the ``isoscore``
    package (``IsoScore.IsoScore``), which computes the eigenvalue form with torch ``svdvals(cov)``.

    Args:
      x: ``[..., n, d]`` float array, n ≥ 2 real rows, d ≥ 2.
      mask: optional ``[..., n]`` bool, true = real row.

    Returns:
      ``[...]`` scores in [0, 1], float32 (or ``x``'s dtype if wider).

    Examples:
      Equal variance in both dimensions gives 1; points on a line give 0.

      >>> import numpy as np
      >>> from isojax import metrics
      >>> cross = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], np.float32)
      >>> round(float(metrics.isoscore(cross)), 4)
      1.0
      >>> round(float(metrics.isoscore(np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], np.float32))), 4)
      0.0
    """
    x, mask, ok = check_cloud(x, mask, min_n=2, min_d=2)
    trace, sq_norm = covariance_moments(unit_scale(promote_float32(x), mask)[0], mask)
    return nan_unless(ok, _isoscore_from_moments(trace, sq_norm, x.shape[-1]))


def isoscore_star(x, *, c0=None, zeta: float = 0.2, mask=None):
    """IsoScore* (I-STAR): IsoScore of the shrinkage covariance (1 − ζ)·C + ζ·C0.

    C is the sample covariance (ddof=1) of the real rows, C0 a reference covariance (for instance
    the covariance of a large sample of the same distribution); ``c0=None`` uses the identity, as
    the ``isoscore`` package recommends when no reference is available. The shrunk covariance C_ζ is
    then scored as in :func:`isoscore`, ((tr C_ζ)² / ‖C_ζ‖_F² − 1) / (d − 1). ζ = 0 gives IsoScore.

    Not scale-invariant (ζ·C0 sets a scale): C is formed from the squared entries, so float32 input needs
    ``|x|`` below about 1e19 (and above about 1e-19 to be distinguished from a zero cloud).

    Args:
      x: ``[..., n, d]`` float array (d ≥ 2).
      c0: optional ``[d, d]`` (or broadcastable ``[..., d, d]``) symmetric PSD reference covariance.
      zeta: shrinkage weight in [0, 1] (traced; out of range under tracing: NaN).
      mask: optional ``[..., n]`` bool, true = real row.

    Returns:
      ``[...]`` scores in [0, 1], float32 (or ``x``'s dtype if wider).

    Examples:
      Two points on a line: ``C = diag(2, 0)`` (ddof=1); with ``zeta = 0.5`` and ``C0 = I``,
      ``C_zeta = diag(1.5, 0.5)`` and the score is ``(2^2 / 2.5 - 1) / 1 = 0.6`` (``zeta = 0``: IsoScore, 0).

      >>> import numpy as np
      >>> from isojax import metrics
      >>> line = np.array([[-1.0, 0.0], [1.0, 0.0]], np.float32)
      >>> round(float(metrics.isoscore_star(line, zeta=0.5)), 4), round(float(metrics.isoscore_star(line, zeta=0.0)), 4)
      (0.6, 0.0)
    """
    x, mask, ok = check_cloud(x, mask, min_n=2, min_d=2)
    zeta, zeta_ok = check_hyperparameter(zeta, "zeta", low=0.0, high=1.0)
    d = x.shape[-1]
    if c0 is None:
        # C_ζ = (1 − ζ)C + ζI: tr C_ζ = (1 − ζ) tr C + ζd, ‖C_ζ‖² = (1 − ζ)²‖C‖² + 2ζ(1 − ζ) tr C + ζ²d.
        trace, sq_norm = covariance_moments(promote_float32(x), mask)
        shrunk_trace = (1 - zeta) * trace + zeta * d
        shrunk_sq_norm = (1 - zeta) ** 2 * sq_norm + 2 * zeta * (1 - zeta) * trace + zeta**2 * d
    else:
        c0 = check_square(c0, "c0", d)
        _, cov = covariance(promote_float32(x), mask)
        shrunk = (1 - zeta) * cov + zeta * promote_float32(c0)
        shrunk_trace = jnp.trace(shrunk, axis1=-2, axis2=-1)
        shrunk_sq_norm = jnp.sum(shrunk**2, axis=(-2, -1))
    return nan_unless(ok, nan_unless(zeta_ok, _isoscore_from_moments(shrunk_trace, shrunk_sq_norm, d)))


def partition_isotropy(w, *, mask=None, center: bool = False):
    """Partition-function isotropy I1 and I2 of an embedding matrix.

    Z(c) = Σ_i exp(cᵀ w_i) (too-much-in-common eq. 7, Arora et al. 2016) over the unit
    eigenvectors c of WᵀW (Mu & Viswanath 2018). I1 = min_c Z(c) / max_c Z(c) ∈ (0, 1] (eq. 8);
    I2 = std_c Z(c) / mean_c Z(c) ≥ 0 with the population std (isotropy-calibration App. A).
    Larger I1 and smaller I2 mean more isotropic.

    Sign convention: an eigenvector's sign is arbitrary and Z(c) ≠ Z(−c), so the candidate set is
    {+c_k, −c_k : k = 1..d} (2d directions). The result therefore does not depend on the solver's
    sign choice; on a cloud shifted along c, Z(−c) is the small value that shows the anisotropy.
    Z is evaluated in log space (logsumexp), so large embedding norms do not overflow.

    Gradients treat the eigenvectors as constants (``stop_gradient``): eigenvector derivatives are
    undefined for repeated eigenvalues. The returned gradient is that of Z over fixed directions.
    Not scale-invariant (Z depends on the norms); WᵀW is formed in float32, so ``|w|`` must stay below about 1e19
    (a non-finite WᵀW gives NaN, and the eigensolver never sees it).

    Args:
      w: ``[..., V, d]`` float embedding matrix (V rows).
      mask: optional ``[..., V]`` bool, true = real row (at least one real row: ``ValueError`` for a concrete
        mask without one, NaN for a traced one).
      center: subtract the mean of the real rows first (the "centered" column of too-much Table 1).

    Returns:
      ``(I1, I2)``, each ``[...]`` float32 (or ``w``'s dtype if wider).

    Examples:
      ``W = [[1, 0], [0, 0]]``: ``Z(e_1) = e + 1``, ``Z(-e_1) = 1/e + 1``, ``Z(+-e_2) = 2``, so ``I1 = 1/e``.

      >>> import numpy as np
      >>> from isojax import metrics
      >>> i1, i2 = metrics.partition_isotropy(np.array([[1.0, 0.0], [0.0, 0.0]], np.float32))
      >>> round(float(i1), 4), round(float(np.exp(-1)), 4)
      (0.3679, 0.3679)
    """
    w, mask, ok = check_cloud(w, mask, "w")  # Z of an empty cloud is 0 in every direction: I1, I2 undefined
    w, weights, _ = masked_rows(promote_float32(w), mask)
    if center:
        w = centered_rows(w, mask)[0]
    gram, gram_ok = finite_matrix(jnp.matmul(jnp.swapaxes(w, -1, -2), w, precision=HIGHEST))
    _, directions = jnp.linalg.eigh(jax.lax.stop_gradient(gram))
    projections = jnp.matmul(w, directions, precision=HIGHEST)  # [..., V, d]: c_kᵀ w_i
    logits = jnp.concatenate([projections, -projections], axis=-1)  # both signs: [..., V, 2d]
    real = (weights > 0)[..., None]
    log_z = jax.nn.logsumexp(jnp.where(real, logits, -jnp.inf), axis=-2)  # [..., 2d]
    log_z_max = jnp.max(log_z, axis=-1, keepdims=True)
    z = jnp.exp(log_z - log_z_max)  # Z / max Z, in (0, 1]
    i1 = jnp.min(z, axis=-1)
    z_mean = jnp.mean(z, axis=-1, keepdims=True)
    i2 = safe_sqrt(jnp.mean((z - z_mean) ** 2, axis=-1)) / z_mean[..., 0]
    return nan_unless(ok & gram_ok, (i1, i2))


# ----------------------------------------------------------------------------------------------
# Similarity-based measures
# ----------------------------------------------------------------------------------------------
def token_uniformity(x, *, mask=None, include_diagonal: bool = False):
    """TokenUni: mean pairwise cosine similarity of the real rows (softdecay eq. 3).

    Without the diagonal: Σ_{i≠j} cos(x_i, x_j) / (N(N − 1)); with it (the authors' code,
    ``tokenSimi``): Σ_{i,j} cos(x_i, x_j) / N², N the number of real rows. Computed in O(Nd) from
    ‖Σ_i x̂_i‖² = Σ_{i,j} x̂_iᵀx̂_j with x̂ = x / ‖x‖. A zero row has cosine 0 with every row,
    itself included. Isotropic unit vectors give ≈ 0 (≈ 1/N with the diagonal).

    Args:
      x: ``[..., n, d]`` float array (n ≥ 2 without the diagonal).
      mask: optional ``[..., n]`` bool, true = real row.
      include_diagonal: include the N self-similarities i = j.

    Returns:
      ``[...]`` values in [-1, 1], float32 (or ``x``'s dtype if wider).

    Examples:
      Orthonormal rows: every off-diagonal cosine is 0; with the diagonal, ``N / N^2 = 1/3``.

      >>> import numpy as np
      >>> from isojax import metrics
      >>> x = np.eye(3, dtype=np.float32)
      >>> round(float(metrics.token_uniformity(x)), 4)
      0.0
      >>> round(float(metrics.token_uniformity(x, include_diagonal=True)), 4)
      0.3333
    """
    x, mask, ok = check_cloud(x, mask, min_n=1 if include_diagonal else 2)
    all_pairs, diagonal, count = cosine_sums(unit_scale(promote_float32(x), mask)[0], mask)
    if include_diagonal:
        return nan_unless(ok, safe_div(all_pairs, count**2))
    return nan_unless(ok, safe_div(all_pairs - diagonal, count * (count - 1)))


def _masked_logmeanexp(values, where, axis):
    """log(mean(exp(values[where]))) along ``axis``; 0 where nothing is selected; finite gradients."""
    count = jnp.sum(where, axis=axis)
    peak = jax.lax.stop_gradient(jnp.max(jnp.where(where, values, -jnp.inf), axis=axis, keepdims=True))
    peak = jnp.where(jnp.isfinite(peak), peak, 0)
    total = jnp.sum(jnp.where(where, jnp.exp(jnp.where(where, values - peak, 0)), 0), axis=axis)
    has_any = count > 0
    log_mean = jnp.log(jnp.where(has_any, total, 1)) + jnp.squeeze(peak, axis) - jnp.log(jnp.maximum(count, 1))
    return jnp.where(has_any, log_mean, 0)


def _pair_mask(weights):
    """Bool ``[..., n, n]`` mask of the pairs i < j of real rows."""
    n = weights.shape[-1]
    real = weights > 0
    return real[..., :, None] & real[..., None, :] & jnp.triu(jnp.ones((n, n), bool), k=1)


def rbf_uniformity(x, *, mask=None, t: float = 2.0):
    """RBF_dis: log of the mean Gaussian potential between unit-normalised rows (softdecay eq. 4).

    RBF_dis = log( mean_{i<j} exp(−t ‖x̂_i − x̂_j‖²) ), x̂ = x / ‖x‖, over pairs of real rows —
    Wang & Isola's uniformity, as in the authors' code (``rbf_kernel`` with t = 2). The paper's
    eq. 4 writes exp(−‖·‖²/t); here t multiplies. Values lie in [−4t, 0]; lower = more uniform.

    Args:
      x: ``[..., n, d]`` float array, n ≥ 2.
      mask: optional ``[..., n]`` bool, true = real row.
      t: positive temperature multiplying the squared distance (traced).

    Returns:
      ``[...]`` values in [-4t, 0], float32 (or ``x``'s dtype if wider).

    Examples:
      Two orthogonal unit rows are at squared distance 2: ``log exp(-2 t) = -4`` at ``t = 2``.

      >>> import numpy as np
      >>> from isojax import metrics
      >>> round(float(metrics.rbf_uniformity(np.eye(2, dtype=np.float32))), 4)
      -4.0
    """
    x, mask, ok = check_cloud(x, mask, min_n=2)
    t, t_ok = check_hyperparameter(t, "t", low=0.0, low_open=True)
    x, weights, _ = masked_rows(unit_scale(promote_float32(x), mask)[0], mask)
    sq = squared_distances(unit_rows(x))
    return nan_unless(ok & t_ok, _masked_logmeanexp(-t * sq, _pair_mask(weights), axis=(-2, -1)))


def _barycentric_weights(diffs, valid, reg):
    """LLE barycentric weights (Roweis & Saul 2000; sklearn ``barycenter_weights``).

    ``diffs`` ``[..., n, k, d]`` are neighbour − point; solve (G + R·I) w = 1 with the local Gram
    G = diffs diffsᵀ, R = reg·trace(G) (reg when the trace is 0), then normalise w to sum 1.
    Padding neighbours (``valid`` false) get weight 0.
    """
    k = diffs.shape[-2]
    validf = valid.astype(diffs.dtype)
    gram = jnp.einsum("...id,...jd->...ij", diffs, diffs, precision=HIGHEST)
    gram = gram * validf[..., :, None] * validf[..., None, :]
    trace = jnp.trace(gram, axis1=-2, axis2=-1)
    ridge = jnp.where(trace > 0, reg * trace, reg)
    eye = jnp.eye(k, dtype=diffs.dtype)
    # Padding neighbours: identity row/column and a zero right-hand side, so their weight is 0.
    system = gram + eye * (ridge[..., None, None] * validf[..., None, :] + (1 - validf)[..., None, :])
    system, system_ok = finite_matrix(system)
    solution = jnp.where(system_ok[..., None], jnp.linalg.solve(system, validf[..., None])[..., 0], jnp.nan)
    return safe_div(solution, jnp.sum(solution, axis=-1, keepdims=True))


def lsds(x, fx, *, k: int = 12, t: float = 1.0, weights: str = "rbf", reg: float = 1e-3, mask=None):
    """Local Structure Discrepancy Score (softdecay eq. 6), averaged over the real points.

    LSDS(x_i) = ‖f(x_i) − Σ_{j∈kNN(x_i)} w_ij f(x_j)‖², kNN = the k nearest other real points of
    x_i in the original space (Euclidean, self excluded). ``weights="rbf"`` (default, the paper):
    w_ij = exp(−‖x_i − x_j‖² / t), unnormalised. ``weights="barycentric"`` (the authors' code):
    LLE barycentric weights that best reconstruct x_i from its neighbours, summing to 1, with
    ridge ``reg``·trace. Lower = the transform f preserved the local neighbourhoods better.
    Gradients flow through f(x) and through the weights; the neighbour sets are piecewise constant.
    Not scale-invariant (the RBF weights and the residuals have scales): distances and residuals are squared
    in float32, so ``|x|`` and ``|f(x)|`` must stay below about 1e19.

    Args:
      x: ``[..., n, d]`` original points.
      fx: ``[..., n, d']`` transformed points f(x) (same leading shape and n as x).
      k: neighbours per point, ``1 <= k <= n - 1`` (static). With a mask, points with fewer than k
        real neighbours use the ones they have.
      t: positive RBF bandwidth (``weights="rbf"``; traced).
      weights: ``"rbf"`` or ``"barycentric"`` (static).
      reg: positive ridge factor for ``"barycentric"`` (traced).
      mask: optional ``[..., n]`` bool, true = real row.

    Returns:
      ``[...]`` mean LSDS over the real points, float32 (or ``x``'s dtype if wider).

    Examples:
      Two points 0 and 1 on a line, ``f`` the identity, ``k = 1``, ``t = 1``: ``w = exp(-1)``, so
      ``LSDS = ((0 - e^-1)^2 + (1 - 0)^2) / 2``.

      >>> import numpy as np
      >>> from isojax import metrics
      >>> x = np.array([[0.0], [1.0]], np.float32)
      >>> round(float(metrics.lsds(x, x, k=1, t=1.0)), 4), round(float((np.exp(-2) + 1) / 2), 4)
      (0.5677, 0.5677)
    """
    x, mask, ok = check_cloud(x, mask, min_n=2)
    fx = check_points(fx, "fx", min_n=2)
    if fx.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"fx must have shape {x.shape[:-1]} + (d',) to match x, got {fx.shape}")
    ok = ok & check_finite_rows(fx, mask, "fx")
    check_positive_int(k, "k", upper=x.shape[-2] - 1)
    t, t_ok = check_hyperparameter(t, "t", low=0.0, low_open=True)
    reg, reg_ok = check_hyperparameter(reg, "reg", low=0.0, low_open=True)
    check_choice(weights, "weights", ("rbf", "barycentric"))
    n = x.shape[-2]
    x, fx = select_rows(promote_float32(x), mask), select_rows(promote_float32(fx), mask)
    _, row_weights, count = masked_rows(x, mask)
    real = row_weights > 0
    candidate = real[..., None, :] & ~jnp.eye(n, dtype=bool)
    sq = jax.lax.stop_gradient(squared_distances(x))
    _, index = jax.lax.top_k(jnp.where(candidate, -sq, -jnp.inf), k)  # [..., n, k]
    neighbour_valid = jnp.take_along_axis(candidate, index, axis=-1)

    def gather(a):  # a [..., n, e] -> [..., n, k, e]
        return jnp.take_along_axis(a[..., None, :, :], index[..., None], axis=-2)

    diffs = gather(x) - x[..., :, None, :]
    if weights == "rbf":
        w = jnp.where(neighbour_valid, jnp.exp(-jnp.sum(diffs * diffs, axis=-1) / t), 0)
    else:
        w = _barycentric_weights(diffs, neighbour_valid, reg)
    reconstruction = jnp.einsum("...nk,...nke->...ne", w, gather(fx), precision=HIGHEST)
    residual = jnp.sum((fx - reconstruction) ** 2, axis=-1)
    return nan_unless(ok & t_ok & reg_ok, safe_div(jnp.sum(residual * row_weights, axis=-1), count))


# ----------------------------------------------------------------------------------------------
# Singular-value distribution (softdecay §3.2)
# ----------------------------------------------------------------------------------------------
class SingularValueStats(NamedTuple):
    """Singular-value distribution of a (padded) matrix; a pytree, so it passes through jit/vmap.

    Attributes:
      normalized: ``[..., min(n, d)]`` singular values divided by the largest, sorted descending.
      valid: ``[..., min(n, d)]`` bool; False for the slots that are zero only because of padding
        rows (the rank bound is min(number of real rows, d)).
      mean, median, skewness: ``[...]`` statistics of ``normalized`` over the valid slots;
        skewness is the Fisher-Pearson coefficient m3 / m2^(3/2) (``scipy.stats.skew`` with
        ``bias=True``), 0 for a constant spectrum.
    """

    normalized: jax.Array
    valid: jax.Array
    mean: jax.Array
    median: jax.Array
    skewness: jax.Array


def singular_value_stats(x, *, mask=None):
    """Normalised singular values of the real rows of ``x`` and their mean, median and skewness.

    σ = singular values of the ``[n_real, d]`` matrix (rows are not centered, as in softdecay
    §3.2), σ̃ = σ / σ_1; the softdecay paper reads token uniformity off a small median and a large
    skewness of σ̃ (Figure 2) and plots its empirical CDF (Figure 1, see :func:`empirical_cdf`).
    A zero matrix gives σ̃ = 0.

    Args:
      x: ``[..., n, d]`` float array.
      mask: optional ``[..., n]`` bool, true = real row.

    Returns:
      :class:`SingularValueStats` (float arrays float32, or ``x``'s dtype if wider; ``valid`` bool).

    Examples:
      ``diag(4, 2, 1)``: normalised singular values ``1, 1/2, 1/4``, median ``1/2``.

      >>> import numpy as np
      >>> from isojax import metrics
      >>> stats = metrics.singular_value_stats(np.diag([4.0, 2.0, 1.0]).astype(np.float32))
      >>> np.round(np.asarray(stats.normalized, np.float64), 4).tolist(), float(stats.median)
      ([1.0, 0.5, 0.25], 0.5)
    """
    x, mask, ok = check_cloud(x, mask)
    x, _, count = masked_rows(unit_scale(promote_float32(x), mask)[0], mask)
    x, x_ok = finite_matrix(x)
    sigma = jnp.linalg.svd(x, compute_uv=False)  # descending
    normalized = safe_div(sigma, sigma[..., :1])
    slots = normalized.shape[-1]
    n_valid = jnp.minimum(count, x.shape[-1])
    valid = jnp.arange(slots) < n_valid[..., None]
    validf = valid.astype(normalized.dtype)
    mean = safe_div(jnp.sum(normalized * validf, axis=-1), n_valid)
    centered = (normalized - mean[..., None]) * validf
    m2 = safe_div(jnp.sum(centered**2, axis=-1), n_valid)
    m3 = safe_div(jnp.sum(centered**3, axis=-1), n_valid)
    skewness = safe_div(m3, m2 * safe_sqrt(m2))
    # The valid values are the first n_valid entries of a descending array.
    last = jnp.maximum(n_valid.astype(jnp.int32) - 1, 0)
    lo = jnp.take_along_axis(normalized, (last // 2)[..., None], axis=-1)[..., 0]
    hi = jnp.take_along_axis(normalized, ((last + 1) // 2)[..., None], axis=-1)[..., 0]
    return nan_unless(ok & x_ok, SingularValueStats(normalized, valid, mean, (lo + hi) / 2, skewness))


def empirical_cdf(values, grid, *, valid=None):
    """Empirical CDF F(g) = #{valid v : v ≤ g} / #{valid v} of ``values`` at each grid point.

    For the singular-value CDF plots of softdecay Figure 1: ``values`` = ``normalized`` and
    ``valid`` from :func:`singular_value_stats`, ``grid`` = e.g. ``jnp.linspace(0, 1, 101)``.
    The result is a step function of the values (its gradient is zero).

    Args:
      values: ``[..., m]`` float array.
      grid: ``[g]`` float array of evaluation points.
      valid: optional ``[..., m]`` bool, true = value counts; at least one per row (the CDF of no value is
        undefined: ``ValueError`` for a concrete ``valid``, NaN for a traced one).

    Returns:
      ``[..., g]`` CDF values in [0, 1], in ``values``' dtype. A NaN or inf among the counted values is a
      ``ValueError`` (NaN when traced), as for point clouds.

    Examples:
      >>> import numpy as np
      >>> from isojax import metrics
      >>> cdf = metrics.empirical_cdf(np.array([0.1, 0.5, 0.9], np.float32), np.array([0.0, 0.5, 1.0], np.float32))
      >>> np.round(np.asarray(cdf, np.float64), 4).tolist()
      [0.0, 0.6667, 1.0]
    """
    values = check_float(values, "values")
    grid = check_float(grid, "grid")
    if values.ndim < 1:
        raise ValueError("values must have shape [..., m], got a scalar")
    if grid.ndim != 1:
        raise ValueError(f"grid must have shape [g], got {grid.shape}")
    if valid is not None:
        valid = jnp.asarray(valid)
        if valid.shape != values.shape or valid.dtype != jnp.bool_:
            raise ValueError(f"valid must be a bool array of shape {values.shape}, got {valid.dtype}{valid.shape}")
    ok = check_finite_rows(values[..., None], valid, "values") & check_real_rows(valid, 1, "valid")
    valid = jnp.ones(values.shape, bool) if valid is None else valid
    below = (values[..., None, :] <= grid[:, None]) & valid[..., None, :]
    return nan_unless(ok, safe_div(jnp.sum(below, axis=-1), jnp.sum(valid, axis=-1)[..., None]).astype(values.dtype))
