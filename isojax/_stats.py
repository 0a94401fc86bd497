"""Masked statistics of point clouds, shared by metrics, losses, topology, calibrate, gradients and train.

One home for the quantities those modules would otherwise each compute their own way. Conventions: ``x`` is
``[..., n, d]`` (leading axes are independent clouds), ``mask`` is ``[..., n]`` bool or None (true = real row,
None = every row). Padding rows are excluded exactly: they never enter a mean, a count, a covariance or a pair,
and they are selected out with ``jnp.where`` before any arithmetic, so whatever they hold (NaN, inf) reaches
neither a result nor a gradient (``0 * NaN`` would be NaN).
The helpers are unvalidated (the public callers check their arguments), jit-free and differentiable, with
finite gradients at zero denominators (see :mod:`isojax._numeric`). Matrix products use full float32 precision
(``HIGHEST``) whatever the backend's default. A host-side numpy helper comes last: :func:`real_rows` (the real rows
as one array, whose length depends on the mask's values).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from isojax._numeric import HIGHEST, finite_matrix, promote_float32, safe_div, safe_norm, safe_sqrt


def select_rows(x, mask):
    """``x`` with the padding rows replaced by zeros (``jnp.where``: their values never enter arithmetic)."""
    return x if mask is None else jnp.where(mask[..., None], x, 0)


def masked_rows(x, mask):
    """``(x with padding rows zeroed, float row weights [..., n], row count [...])``."""
    if mask is None:
        weights = jnp.ones(x.shape[:-1], x.dtype)
    else:
        weights = mask.astype(x.dtype)
        x = select_rows(x, mask)
    return x, weights, jnp.sum(weights, axis=-1)


def masked_mean(x, mask=None):
    """Mean over axis -2 of the rows selected by ``mask``: ``Σ_i m_i x_i / max(Σ_i m_i, 1)``.

    ``x [..., n, d]``, ``mask [..., n]`` (bool or 0/1; None = every row) -> ``[..., d]``. A mask with no true
    row gives a zero mean (never NaN).
    """
    if mask is None:
        return jnp.mean(x, axis=-2)
    mask = mask.astype(bool)
    count = jnp.sum(mask, axis=-1, dtype=x.dtype)[..., None]
    return jnp.sum(select_rows(x, mask), axis=-2) / jnp.maximum(count, 1)


def centered_rows(x, mask):
    """``(x_i − μ for the real rows and 0 for padding rows, μ [..., d], row count [...])``, μ the mean of the
    real rows."""
    mean = masked_mean(x, mask)
    x, _, count = masked_rows(x, mask)
    return select_rows(x - mean[..., None, :], mask), mean, count


def rowwise(fn, x, stats):
    """``fn(x, stats)``, a map applied to every row of ``x [..., n, d]`` with statistics ``stats`` (a pytree)
    estimated from the real rows, such that a row holding NaN or inf takes no part in any gradient.

    Its own output row is still ``fn`` of it (non-finite), but it cannot turn the statistics' gradient NaN
    (``0 · NaN`` in the backward pass of a product): the finite rows are mapped as ``fn(x, stats)`` (same values
    and gradient as without this wrapper), the others as ``stop_gradient(fn(x, stats))``.
    """
    finite = jnp.all(jnp.isfinite(x), axis=-1, keepdims=True)
    safe = fn(jnp.where(finite, x, 0), stats)
    return jnp.where(finite, safe, jax.lax.stop_gradient(fn(x, stats)))


IDENTICAL_VARIANCE = 2.0**-36
"""Variance per dimension of a :func:`unit_scale`-d cloud at or below which its rows count as identical: about 32
float32 ulps of its largest entry, what centring identical rows leaves in rounding."""


def unit_scale(x, mask):
    """``x / s`` with ``s`` (no gradient, ``[...]``) the power of two at or just above the largest ``|x|`` of the
    real rows (1 when that is 0 or not finite).

    Dividing by a power of two is exact, so a scale-invariant (0-homogeneous) measure of ``x / s`` is bit for
    bit that of ``x`` -- value and gradient -- wherever ``x`` itself neither overflows nor underflows when
    squared, and it stays right where it would (float32 clouds scaled by 1e±20).
    """
    big = jax.lax.stop_gradient(jnp.max(jnp.abs(select_rows(x, mask)), axis=(-2, -1)))
    usable = jnp.isfinite(big) & (big > 0)
    _, exponent = jnp.frexp(jnp.where(usable, big, 1))
    scale = jnp.where(usable, jnp.ldexp(jnp.ones_like(big), exponent), 1)
    return x / scale[..., None, None], scale


def covariance(x, mask, *, ddof: int = 1):
    """Mean ``[..., d]`` and covariance ``[..., d, d]`` of the real rows of ``x``.

    ``C = Σ_i m_i (x_i − μ)(x_i − μ)ᵀ / max(N − ddof, 1)``, N = Σ_i m_i the number of real rows.
    """
    xc, mean, count = centered_rows(x, mask)
    cov = jnp.matmul(jnp.swapaxes(xc, -1, -2), xc, precision=HIGHEST)
    return mean, cov / jnp.maximum(count - ddof, 1)[..., None, None]


def covariance_moments(x, mask):
    """``(tr C, ‖C‖_F²)``, each ``[...]``, of the sample covariance C (ddof=1) of the real rows, without
    forming C when n < d.

    With X_c the centered real rows, tr C = ‖X_c‖_F² / (N − 1) and ‖C‖_F² = ‖X_c X_cᵀ‖_F² / (N − 1)², whichever
    Gram matrix is smaller (same norm).
    """
    xc, _, count = centered_rows(x, mask)
    scale = jnp.maximum(count - 1, 1)
    return jnp.sum(xc * xc, axis=(-2, -1)) / scale, jnp.sum(smaller_gram(xc) ** 2, axis=(-2, -1)) / scale**2


def isoscore_from_moments(trace, sq_norm, d: int):
    """IsoScore of a PSD covariance C from ``tr C`` and ``‖C‖_F²`` (see :func:`isojax.metrics.isoscore`).

    ((tr C)² / ‖C‖_F² − 1) / (d − 1); a zero covariance (all points identical) has score 0, the limit of a
    one-dimensional cloud.
    """
    return jnp.where(sq_norm > 0, (safe_div(trace, safe_sqrt(sq_norm)) ** 2 - 1) / (d - 1), 0)  # no ‖C‖⁴ to underflow


def shrunk_to_identity(trace, sq_norm, d: int, zeta):
    """``(tr C_ζ, ‖C_ζ‖_F²)`` of C_ζ = (1 − ζ)C + ζI from ``tr C`` and ``‖C‖_F²``, without forming C:
    tr C_ζ = (1 − ζ) tr C + ζd, ‖C_ζ‖² = (1 − ζ)²‖C‖² + 2ζ(1 − ζ) tr C + ζ²d."""
    return (1 - zeta) * trace + zeta * d, (1 - zeta) ** 2 * sq_norm + 2 * zeta * (1 - zeta) * trace + zeta**2 * d


def shrunk_moments(cov, c0, zeta):
    """``(tr C_ζ, ‖C_ζ‖_F²)`` of C_ζ = (1 − ζ)·cov + ζ·c0 (``[..., d, d]`` each, c0 broadcast)."""
    shrunk = (1 - zeta) * cov + zeta * promote_float32(c0)
    return jnp.trace(shrunk, axis1=-2, axis2=-1), jnp.sum(shrunk**2, axis=(-2, -1))


def smaller_gram(x):
    """The smaller of the two Gram matrices of ``x [..., n, d]``: ``x xᵀ [..., n, n]`` if n ≤ d, else ``xᵀ x``.

    Both have the same non-zero eigenvalues (the squared singular values of x) and the same Frobenius norm.
    """
    n, d = x.shape[-2:]
    xt = jnp.swapaxes(x, -1, -2)
    return jnp.matmul(x, xt, precision=HIGHEST) if n <= d else jnp.matmul(xt, x, precision=HIGHEST)


def gram_eigenvalues(x):
    """Eigenvalues (descending) of xᵀx, ``[..., min(n, d)]``: the squared singular values of ``x`` (NaN when the
    Gram matrix is not finite, which the SVD never sees).

    Computed on the smaller Gram matrix. It is PSD, so its eigenvalues are its singular values: the values-only
    SVD is used (no eigenvectors in the forward pass; on CPU it is cheaper than ``eigvalsh``, which also
    computes them), and its gradient stays finite when values repeat.
    """
    gram, ok = finite_matrix(smaller_gram(x))  # a non-finite Gram matrix: NaN out, no decomposition of it
    return jnp.where(ok[..., None], jnp.linalg.svd(gram, compute_uv=False), jnp.nan)


def unit_rows(x):
    """Rows scaled to unit norm; zero rows stay zero (so they have cosine 0 with every row)."""
    return safe_div(x, safe_norm(x, keepdims=True))


def cosine_sums(x, mask):
    """``(Σ_{i,j} cos(x_i, x_j), Σ_i cos(x_i, x_i), N)`` over the N real rows, in O(Nd).

    Σ_{i,j} x̂_iᵀx̂_j = ‖Σ_i x̂_i‖²; the diagonal is the number of non-zero real rows.
    """
    x, _, count = masked_rows(x, mask)
    unit = unit_rows(x)
    all_pairs = jnp.sum(jnp.sum(unit, axis=-2) ** 2, axis=-1)
    diagonal = jnp.sum(unit * unit, axis=(-2, -1))
    return all_pairs, diagonal, count


def pair_contributions(unit_sum, unit_sq_sum, count):
    """Per-dimension mean over pairs i ≠ j of x̂_i,k x̂_j,k, ``[..., d]``, from ``unit_sum`` = Σ_i x̂_i and
    ``unit_sq_sum`` = Σ_i x̂_i² (``[..., d]``) and the row count N: ((Σ_i x̂_i,k)² − Σ_i x̂_i,k²) / (N(N − 1)).

    Summed over k it is the mean cosine over pairs of distinct rows (Timkey & van Schijndel's CC_k).
    """
    count = jnp.asarray(count).astype(unit_sum.dtype)[..., None]
    return safe_div(unit_sum**2 - unit_sq_sum, count * (count - 1))


def squared_distances(x):
    """Pairwise squared Euclidean distances ``[..., n, n]`` via the Gram matrix, clipped at 0."""
    sq_norms = jnp.sum(x * x, axis=-1)
    gram = jnp.matmul(x, jnp.swapaxes(x, -1, -2), precision=HIGHEST)
    return jnp.maximum(sq_norms[..., :, None] + sq_norms[..., None, :] - 2 * gram, 0)


def class_masks(mask, labels, num_classes: int):
    """Bool ``[..., C, n]``: row i is real and has label c (labels outside [0, C) belong to no class)."""
    real = jnp.ones(labels.shape, bool) if mask is None else mask
    return real[..., None, :] & (labels[..., None, :] == jnp.arange(num_classes)[:, None])


def real_rows(x, mask) -> np.ndarray:
    """The real rows of ``x [..., n, d]`` as one numpy array ``[N, d]`` (eager: N is the number of true entries of
    ``mask [..., n]``); ``x`` as it is when ``mask`` is None."""
    x = np.asarray(x)
    return x if mask is None else x[np.asarray(mask)]
