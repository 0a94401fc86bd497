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

from fractions import Fraction
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from isojax._numeric import HIGHEST, finite_matrix, promote_float32, safe_div, safe_sqrt
from isojax._stats import (
    IDENTICAL_VARIANCE,
    centered_rows,
    cosine_sums,
    covariance,
    covariance_moments,
    gram_eigenvalues,
    isoscore_from_moments,
    masked_rows,
    pair_contributions,
    select_rows,
    shrunk_moments,
    shrunk_to_identity,
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
    check_mask_values,
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
    "MassiveActivation",
    "massive_activations",
    "RogueDimensions",
    "rogue_dimensions",
    "AttentionSinks",
    "attention_sinks",
    "twonn_dimension",
    "random_pair_cosine",
    "alignment",
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
    (a line → 0, a disk in R³ → 0.5, a ball → 1). Identical points give 0, with a zero gradient; so do rows
    that agree to within float rounding (a variance per dimension below 2⁻³⁶ of the largest squared entry, about
    32 float32 ulps: what centering identical rows leaves). Matches the ``isoscore``
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
    spread = trace > x.shape[-1] * IDENTICAL_VARIANCE  # else identical rows up to rounding (docstring)
    score = isoscore_from_moments(jnp.where(spread, trace, 1), jnp.where(spread, sq_norm, 1), x.shape[-1])
    return nan_unless(ok, jnp.where(spread, score, 0))


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
        trace, sq_norm = covariance_moments(promote_float32(x), mask)
        trace, sq_norm = shrunk_to_identity(trace, sq_norm, d, zeta)
    else:
        trace, sq_norm = shrunk_moments(covariance(promote_float32(x), mask)[1], check_square(c0, "c0", d), zeta)
    return nan_unless(ok, nan_unless(zeta_ok, isoscore_from_moments(trace, sq_norm, d)))


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


# ----------------------------------------------------------------------------------------------
# Measures since 2022: massive activations, rogue dimensions, attention sinks, TwoNN, random pairs,
# alignment (REFERENCE.md "Measures since 2022")
# ----------------------------------------------------------------------------------------------
class MassiveActivation(NamedTuple):
    """The largest ``|activation|`` of a cloud (Sun et al. 2024); a pytree.

    Attributes:
      value: ``[...]`` the largest ``|x|`` over the real rows and dimensions.
      dimension: ``[...]`` int, its dimension.
      token: ``[...]`` int, its row (:func:`massive_activations`) or its index in the stream of real tokens
        (:func:`isojax.stats.massive_activation`).
      position: ``[...]`` int, its position along the ``n`` axis (the row itself for :func:`massive_activations`).
      ratio: ``[...]`` value / median ``|x|`` over the real rows and dimensions (NaN from
        :func:`isojax.stats.massive_activation`: a streamed state keeps no median).
    """

    value: jax.Array
    dimension: jax.Array
    token: jax.Array
    position: jax.Array
    ratio: jax.Array


def massive_activations(x, *, mask=None) -> MassiveActivation:
    """Massive activations (Sun et al. 2024, arXiv 2402.17762): the largest ``|x_ij|`` of the real rows, where, and
    how many times the median ``|x_ij|`` it is.

    value = max_{i real, j} ``|x_ij|`` (the first in row-major order on a tie),
    ratio = value / median_{i real, j} ``|x_ij|`` (the median of the N·d magnitudes, the mean of the two middle ones when N·d is even). Sun et al. report
    ratios of 10³–10⁴ from the early-middle layers of LLMs on, at the first token or the first delimiter. A zero
    median gives ratio inf (1 when the maximum is 0 too: a constant magnitude). Exact at any float32 scale
    (no squares).

    Args:
      x: ``[..., n, d]`` float array (for a batch of texts of one layer, ``[n_texts·L, d]`` pools them; per
        text, ``[B, L, d]``).
      mask: optional ``[..., n]`` bool, true = real row.

    Returns:
      :class:`MassiveActivation` ``[...]``: ``value``, ``ratio`` float32 (or ``x``'s dtype if wider),
      ``dimension``, ``token`` (the row), ``position`` (= ``token``) int32.

    Examples:
      >>> import numpy as np
      >>> from isojax import metrics
      >>> x = np.array([[1.0, -2.0], [-500.0, 3.0]], np.float32)
      >>> m = metrics.massive_activations(x)
      >>> float(m.value), int(m.token), int(m.dimension), float(m.ratio)  # median of 1, 2, 3, 500: 2.5
      (500.0, 1, 0, 200.0)
    """
    x, mask, ok = check_cloud(x, mask, min_n=1)
    x = promote_float32(x)
    n, d = x.shape[-2:]
    real = jnp.ones(x.shape[:-1], bool) if mask is None else mask
    magnitude = jnp.abs(select_rows(x, mask))
    flat_real = jnp.broadcast_to(real[..., None], x.shape).reshape(x.shape[:-2] + (n * d,))
    flat = magnitude.reshape(x.shape[:-2] + (n * d,))
    where = jnp.argmax(jnp.where(flat_real, flat, -jnp.inf), axis=-1)
    value = jnp.take_along_axis(flat, where[..., None], axis=-1)[..., 0]
    ordered = jnp.sort(jnp.where(flat_real, flat, jnp.inf), axis=-1)
    count = jnp.sum(flat_real, axis=-1)
    middle = jnp.stack([jnp.maximum(count - 1, 0) // 2, count // 2], axis=-1)
    median = jnp.mean(jnp.take_along_axis(ordered, jnp.minimum(middle, n * d - 1), axis=-1), axis=-1)
    median = jnp.where(count > 0, median, 0)
    ratio = jnp.where(median > 0, safe_div(value, median), jnp.where(value > 0, jnp.inf, 1.0))
    row = (where // d).astype(jnp.int32)
    return nan_unless(ok, MassiveActivation(value, (where % d).astype(jnp.int32), row, row, ratio))


class RogueDimensions(NamedTuple):
    """Per-dimension contributions to the mean cosine (Timkey & van Schijndel 2021); a pytree.

    Attributes:
      contributions: ``[..., d]`` CC_k = mean over pairs i ≠ j of x_ik x_jk / (‖x_i‖‖x_j‖); Σ_k CC_k = mean cosine.
      mean_cosine: ``[...]`` Σ_k CC_k, the mean cosine over pairs of distinct rows.
      top1_share: ``[...]`` max_k ``|CC_k|`` / Σ_k ``|CC_k|``.
      top3_share: ``[...]`` the three largest ``|CC_k|`` over Σ_k ``|CC_k|`` (all of them when d < 3).
      standardized_cosine: ``[...]`` the mean cosine over pairs i ≠ j after standardising every dimension,
        z_ik = (x_ik − μ_k) / σ_k (NaN from :func:`isojax.stats.rogue_dimensions`, which cannot standardise in one
        pass).
    """

    contributions: jax.Array
    mean_cosine: jax.Array
    top1_share: jax.Array
    top3_share: jax.Array
    standardized_cosine: jax.Array


def rogue_summary(contributions, standardized_cosine) -> RogueDimensions:
    """A :class:`RogueDimensions` from CC ``[..., d]`` (shared with :mod:`isojax.stats`; not in ``__all__``)."""
    size = jnp.abs(contributions)
    top = jax.lax.top_k(size, min(3, size.shape[-1]))[0]
    total = jnp.sum(size, axis=-1)
    return RogueDimensions(
        contributions=contributions,
        mean_cosine=jnp.sum(contributions, axis=-1),
        top1_share=safe_div(top[..., 0], total),
        top3_share=safe_div(jnp.sum(top, axis=-1), total),
        standardized_cosine=standardized_cosine,
    )


def rogue_dimensions(x, *, mask=None) -> RogueDimensions:
    """Rogue dimensions (Timkey & van Schijndel 2021, "All bark and no bite"), exactly over all pairs i ≠ j.

    cos(u, v) = Σ_k u_k v_k / (‖u‖‖v‖), so the mean cosine splits into per-dimension contributions
    CC_k = E_{i≠j}[x̂_ik x̂_jk] = ((Σ_i x̂_ik)² − Σ_i x̂_ik²) / (N(N − 1)), x̂ = x / ‖x‖ (the paper samples random
    pairs; the sum over all pairs costs O(Nd)). A few dimensions with a large share of Σ ``|CC_k|`` are "rogue";
    standardising each dimension (z = (x − μ) / σ, σ = 0 dimensions set to 0) removes them, and
    ``standardized_cosine`` is the mean cosine over pairs i ≠ j of the z rows. Zero rows have cosine 0 with
    every row. Scale-invariant.

    Args:
      x: ``[..., n, d]`` float array, n ≥ 2 real rows.
      mask: optional ``[..., n]`` bool, true = real row.

    Returns:
      :class:`RogueDimensions` (float32, or ``x``'s dtype if wider).

    Examples:
      One dimension carries a large common offset: it carries nearly all of the mean cosine, and standardising
      removes it (the three z rows are (−1, 1), (1, −1), (0, 0): cosines −1, 0, 0).

      >>> import numpy as np
      >>> from isojax import metrics
      >>> r = metrics.rogue_dimensions(np.array([[10.0, 1.0], [10.0, -1.0], [10.0, 0.0]], np.float32))
      >>> round(float(r.top1_share), 3), round(float(r.mean_cosine), 3), round(float(r.standardized_cosine), 3)
      (0.997, 0.99, -0.333)
    """
    x, mask, ok = check_cloud(x, mask, min_n=2)
    x = unit_scale(promote_float32(x), mask)[0]
    rows, _, count = masked_rows(x, mask)
    unit = unit_rows(rows)
    contributions = pair_contributions(jnp.sum(unit, axis=-2), jnp.sum(unit * unit, axis=-2), count)
    xc, _, _ = centered_rows(x, mask)
    std = safe_sqrt(jnp.sum(xc * xc, axis=-2))  # ∝ σ_k: a common factor leaves every cosine unchanged
    all_pairs, diagonal, count = cosine_sums(safe_div(xc, std[..., None, :]), mask)
    standardized = safe_div(all_pairs - diagonal, count * (count - 1))
    return nan_unless(ok, rogue_summary(contributions, standardized))


class AttentionSinks(NamedTuple):
    """Attention-sink measures (Gu et al. 2025); a pytree.

    Attributes:
      alpha: ``[..., L]`` α_k, the mean attention key k receives from the real queries i ≥ k (0 for padding keys).
      first: ``[...]`` α at the first real token of each text.
      rate: ``[]`` Sink_ε, the share of all the leading entries (texts × layers × heads) whose ``first`` > ε.
    """

    alpha: jax.Array
    first: jax.Array
    rate: jax.Array


def attention_sinks(probs, *, mask=None, epsilon: float = 0.3) -> AttentionSinks:
    """Attention sinks (Gu et al., ICLR 2025, "When attention sink emerges in language models").

    α_k = (1 / ``|{i ≥ k real}|``) Σ_{i ≥ k, i real} A[i, k] for every key k of every (text, layer, head), A the
    attention probabilities (rows = queries, columns = keys); Sink_ε = the share of (text, layer, head) whose α at
    the first real token exceeds ε (ε = 0.3 in the paper). With left padding the first real token is the first
    true entry of the mask.

    Args:
      probs: ``[B, ..., L, L]`` float attention probabilities, query by key (e.g. ``[B, layers, heads, L, L]``).
      mask: optional bool ``[B, L]`` (or ``[B, ..., L]``, any prefix of ``probs``' leading axes plus ``L``), true =
        real token; None = every token. Each text needs a real token (``ValueError`` for a concrete mask).
      epsilon: the threshold ε in [0, 1] (traced).

    Returns:
      :class:`AttentionSinks` (float32, or ``probs``' dtype if wider). A NaN or inf among the real
      (query, key) entries is a ``ValueError`` naming ``probs`` (NaN under ``jit``).

    Examples:
      Causal attention that puts 0.5 on the first token from every later query: α_1 = (1 + 0.5 + 0.5) / 3.

      >>> import numpy as np
      >>> from isojax import metrics
      >>> a = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.25, 0.25]], np.float32)
      >>> s = metrics.attention_sinks(a[None])
      >>> round(float(s.first[0]), 4), float(s.rate)
      (0.6667, 1.0)
    """
    probs = check_float(probs, "probs")
    if probs.ndim < 3 or probs.shape[-1] != probs.shape[-2]:
        raise ValueError(f"probs must have shape [B, ..., L, L] (query by key), got {probs.shape}")
    length = probs.shape[-1]
    if mask is None:
        mask = jnp.ones((probs.shape[0], length), bool)
    mask = check_mask_values(mask, "mask")
    if mask.ndim < 2 or mask.shape[-1] != length or mask.shape[:-1] != probs.shape[: mask.ndim - 1]:
        raise ValueError(f"mask must have shape [B, L] = {(probs.shape[0], length)} (or [B, ..., L]), got {mask.shape}")
    ok = check_real_rows(mask, 1, "mask")
    mask = jnp.expand_dims(mask, tuple(range(mask.ndim - 1, probs.ndim - 2)))  # [B, 1.., L]
    pairs = mask[..., :, None] & mask[..., None, :] & jnp.tril(jnp.ones((length, length), bool))  # i ≥ k
    pairs = jnp.broadcast_to(pairs, probs.shape)
    ok = jnp.all(ok) & jnp.all(check_finite_rows(probs.reshape(probs.shape + (1,)), pairs, "probs"))
    probs = promote_float32(probs)
    received = jnp.sum(jnp.where(pairs, probs, 0), axis=-2)  # [..., L] keys
    alpha = safe_div(received, jnp.sum(pairs, axis=-2))
    first_real = jnp.argmax(jnp.broadcast_to(mask, alpha.shape), axis=-1)
    first = jnp.take_along_axis(alpha, first_real[..., None], axis=-1)[..., 0]
    epsilon, eps_ok = check_hyperparameter(epsilon, "epsilon", low=0.0, high=1.0)
    rate = jnp.mean(first > epsilon, dtype=first.dtype)
    return nan_unless(ok & eps_ok, AttentionSinks(alpha, first, rate))


def _keep_count(count, discard_fraction: float):
    """int(N (1 − f)) in exact integer arithmetic (f a static float with a short decimal form, as 0.1)."""
    keep = Fraction(1 - Fraction(str(discard_fraction)))
    return (count * keep.numerator) // keep.denominator


def twonn_dimension(x, *, mask=None, method: str = "linear", discard_fraction: float = 0.1):
    """Intrinsic dimension by TwoNN (Facco et al. 2017, Sci. Rep. 7:12140), as scikit-dimension's ``TwoNN``.

    For every real point, μ = r₂ / r₁, its second over its first nearest-neighbour distance (Euclidean, among the
    real points). μ follows a Pareto law, F(μ) = 1 − μ^(−d). Points with r₁ = 0 (a duplicate) have no ratio and
    are dropped, as ``skdim.id.TwoNN`` does; N counts the rest. The ratios are sorted and only the
    k = ⌊N(1 − f)⌋ smallest kept (f = ``discard_fraction``):

    * ``method="linear"`` (the paper's fit): the slope through the origin of −log(1 − i/N) on log μ₍ᵢ₎, i ≤ k:
      d = Σ x_i y_i / Σ x_i²;
    * ``method="mle"``: log μ ~ Exponential(d) with the largest N − k censored, the unbiased estimate
      d = (k − 1) / (Σ_{i≤k} log μ₍ᵢ₎ + (N − k) log μ₍ₖ₎), with f = 0 the unbiased Pareto MLE (N − 1) / Σ log μ
      (the plain MLE N / Σ log μ times (N − 1)/N) -- scikit-dimension 0.5's ``method="mle"``.

    Neighbours are ranked by the Gram-matrix distances and their distances recomputed as ‖x_i − x_j‖ directly, so
    an exact duplicate has r₁ = 0 even in float32. Scale-invariant. O(n²d).

    Args:
      x: ``[..., n, d]`` float points, at least 3 real.
      mask: optional ``[..., n]`` bool, true = real point.
      method: ``"linear"`` or ``"mle"`` (static).
      discard_fraction: f in [0, 1) (static: it sets how many ratios are kept); the linear fit needs f > 0
        (−log(1 − N/N) is infinite).

    Returns:
      ``[...]`` dimension estimates, float32 (or ``x``'s dtype if wider). Fewer than 2 kept ratios (duplicates
      everywhere) is a ``ValueError`` naming ``x`` for concrete input, NaN under ``jit``.

    Examples:
      Five points on a line at 0, 1, 3, 7, 15 have the ratios μ = 3, 2, 1.5, 1.5, 1.5 (point 3's neighbours
      are 1 and 0); the unbiased MLE without discarding is 4 / log(3 · 2 · 1.5³):

      >>> import numpy as np
      >>> from isojax import metrics
      >>> x = np.array([[0.0, 0.0], [1.0, 1.0], [3.0, 3.0], [7.0, 7.0], [15.0, 15.0]], np.float32)
      >>> d = metrics.twonn_dimension(x, method="mle", discard_fraction=0.0)
      >>> round(float(d), 4), round(4 / float(np.log(20.25)), 4)
      (1.3297, 1.3297)
    """
    x, mask, ok = check_cloud(x, mask, min_n=3)
    check_choice(method, "method", ("linear", "mle"))
    if isinstance(discard_fraction, bool) or not isinstance(discard_fraction, (int, float)):
        raise TypeError(f"discard_fraction must be a Python float (static), got {type(discard_fraction).__name__}")
    if not 0 <= discard_fraction < 1 or (method == "linear" and discard_fraction == 0):
        interval = "(0, 1) for method='linear'" if method == "linear" else "[0, 1)"
        raise ValueError(f"discard_fraction must be in {interval}, got {discard_fraction!r}")
    n = x.shape[-2]
    x = select_rows(unit_scale(promote_float32(x), mask)[0], mask)
    real = jnp.ones(x.shape[:-1], bool) if mask is None else mask
    candidate = real[..., None, :] & real[..., :, None] & ~jnp.eye(n, dtype=bool)
    sq = jax.lax.stop_gradient(squared_distances(x))
    _, index = jax.lax.top_k(jnp.where(candidate, -sq, -jnp.inf), 2)  # [..., n, 2] the two nearest
    neighbours = jnp.take_along_axis(x[..., None, :, :], index[..., None], axis=-2)  # [..., n, 2, d]
    exact = jnp.sort(jnp.sum((neighbours - x[..., :, None, :]) ** 2, axis=-1), axis=-1)  # r1², r2²
    valid = real & (exact[..., 0] > 0)
    safe = jnp.where(valid[..., None], exact, 1.0)
    log_mu = jnp.where(valid, 0.5 * (jnp.log(safe[..., 1]) - jnp.log(safe[..., 0])), jnp.inf)
    count = jnp.sum(valid, axis=-1)
    keep = _keep_count(count, discard_fraction)
    ordered = jnp.sort(log_mu, axis=-1)
    rank = jnp.arange(n)
    kept = rank < keep[..., None]
    xs = jnp.where(kept, ordered, 0)
    if method == "linear":
        cdf = (rank + 1) / jnp.maximum(count, 1)[..., None]
        ys = jnp.where(kept, -jnp.log1p(-jnp.where(kept, cdf, 0)), 0)
        dimension = safe_div(jnp.sum(xs * ys, axis=-1), jnp.sum(xs * xs, axis=-1))
    else:
        last = jnp.take_along_axis(xs, jnp.maximum(keep - 1, 0)[..., None], axis=-1)[..., 0]
        dimension = safe_div((keep - 1).astype(xs.dtype), jnp.sum(xs, axis=-1) + (count - keep) * last)
    enough = keep >= 2
    if not isinstance(enough, jax.core.Tracer) and ok is True and not bool(np.all(np.asarray(enough))):
        raise ValueError(
            "x must hold at least 2 points with a distinct nearest neighbour after the discarded fraction, got "
            f"{int(np.min(np.asarray(keep)))} (duplicate points have r1 = 0 and are dropped)"
        )
    return nan_unless(ok & enough, dimension)


def random_pair_cosine(x, key, *, num_pairs: int = 1000, mask=None):
    """Mean cosine of random pairs of distinct real rows (Godey et al., EACL 2024, per layer of token states).

    ``num_pairs`` pairs (i, j), i drawn uniformly among the real rows and j uniformly among the other real rows
    (with replacement across pairs), from ``key`` (an explicit PRNG key; the draws are ranks among the real rows,
    so padding rows change none of them); the mean of cos(x_i, x_j) over them,
    an unbiased estimate of :func:`token_uniformity` (the mean over all pairs, which that function gives
    exactly in O(Nd)). Zero rows have cosine 0. Scale-invariant.

    Args:
      x: ``[..., n, d]`` float array, n ≥ 2 real rows.
      key: a ``jax.random`` key; every cloud of the leading axes draws its own pairs.
      num_pairs: pairs per cloud (static).
      mask: optional ``[..., n]`` bool, true = real row.

    Returns:
      ``[...]`` values in [−1, 1], float32 (or ``x``'s dtype if wider).

    Examples:
      Two rows make one pair, whatever the key:

      >>> import jax, numpy as np
      >>> from isojax import metrics
      >>> x = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
      >>> round(float(metrics.random_pair_cosine(x, jax.random.key(0), num_pairs=4)), 4)
      0.7071
    """
    x, mask, ok = check_cloud(x, mask, min_n=2)
    check_positive_int(num_pairs, "num_pairs")
    unit = unit_rows(select_rows(unit_scale(promote_float32(x), mask)[0], mask))
    n = x.shape[-2]
    real = jnp.ones(x.shape[:-1], bool) if mask is None else mask
    count = jnp.sum(real, axis=-1, keepdims=True).astype(unit.dtype)  # [..., 1]
    first_key, second_key = jax.random.split(key)
    shape = x.shape[:-2] + (num_pairs,)
    # Ranks among the real rows (so that padding changes no draw): i uniform in [0, N), j uniform in [0, N) \ {i}.
    rank_i = jnp.minimum(jnp.floor(jax.random.uniform(first_key, shape) * count), count - 1)
    rank_j = jnp.minimum(jnp.floor(jax.random.uniform(second_key, shape) * (count - 1)), count - 2)
    rank_j = rank_j + (rank_j >= rank_i)
    real_in_order = jnp.argsort(~real, axis=-1, stable=True)  # the real rows first, in order
    first = jnp.take_along_axis(real_in_order, jnp.clip(rank_i, 0, n - 1).astype(jnp.int32), axis=-1)
    second = jnp.take_along_axis(real_in_order, jnp.clip(rank_j, 0, n - 1).astype(jnp.int32), axis=-1)
    u_i = jnp.take_along_axis(unit, first[..., None], axis=-2)
    u_j = jnp.take_along_axis(unit, second[..., None], axis=-2)
    return nan_unless(ok, jnp.mean(jnp.sum(u_i * u_j, axis=-1), axis=-1))


def alignment(x, y, *, mask=None, alpha: float = 2.0):
    """Alignment (Wang & Isola 2020): E ‖x̂_i − ŷ_i‖^α over the real positive pairs (x_i, y_i), unit rows.

    x̂ = x / ‖x‖ (zero rows stay zero). α = 2 in the paper. Lower = positive pairs closer. Its companion,
    uniformity log E_{i<j} exp(−t‖x̂_i − x̂_j‖²) with t = 2, is :func:`rbf_uniformity` (the same formula).
    Scale-invariant in ``x`` and ``y`` separately.

    Args:
      x: ``[..., n, d]`` float array (anchors).
      y: ``[..., n, d]`` float array (their positives, row i paired with row i of ``x``).
      mask: optional ``[..., n]`` bool, true = a real pair.
      alpha: exponent, positive (traced).

    Returns:
      ``[...]`` values in [0, 2^α], float32 (or the inputs' dtype if wider).

    Examples:
      Orthogonal unit pairs are at squared distance 2; identical ones at 0:

      >>> import numpy as np
      >>> from isojax import metrics
      >>> x = np.eye(2, dtype=np.float32)
      >>> float(metrics.alignment(x, x[::-1])), float(metrics.alignment(x, 3 * x))
      (2.0, 0.0)
    """
    x, mask, ok = check_cloud(x, mask, min_n=1)
    y = check_points(y, "y")
    if y.shape != x.shape:
        raise ValueError(f"y must have the shape of x, {x.shape}, got {y.shape}")
    ok = ok & check_finite_rows(y, mask, "y")
    alpha, alpha_ok = check_hyperparameter(alpha, "alpha", low=0.0, low_open=True)
    ux = unit_rows(select_rows(unit_scale(promote_float32(x), mask)[0], mask))
    uy = unit_rows(select_rows(unit_scale(promote_float32(y), mask)[0], mask))
    sq = jnp.sum((ux - uy) ** 2, axis=-1)
    positive = sq > 0
    value = jnp.where(positive, jnp.where(positive, sq, 1.0) ** (alpha / 2), 0)
    _, weights, count = masked_rows(value[..., None], mask)
    return nan_unless(ok & alpha_ok, safe_div(jnp.sum(value * weights, -1), count))
