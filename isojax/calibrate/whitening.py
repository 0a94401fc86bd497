"""BERT-whitening (Su et al. 2021) and the covariance eigendecomposition it shares with all-but-the-top.

``fit_whitening`` estimates the mean ``mu`` and the whitening matrix ``W = U diag(1/sqrt(s))`` from the
eigendecomposition ``C = U diag(s) U^T`` of the sample covariance; ``apply_whitening`` maps
``y = (x - mu) W[:, :k]``.
On the data it was fitted on, the whitened sample covariance (``ddof=1``, as ``np.cov`` in the authors'
code) is the identity.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from isojax._numeric import HIGHEST, finite_matrix, promote_float32, safe_div, safe_norm
from isojax._stats import covariance, unit_scale
from isojax._validate import check_cloud, check_hyperparameter, nan_unless


@jax.custom_jvp
def eigh_descending(c):
    """Eigendecomposition of a symmetric ``c [..., d, d]``: eigenvalues ``[..., d]`` in descending order and
    eigenvectors ``[..., d, d]`` (columns), each signed so that its largest-magnitude entry is positive.

    (Internal helper, shared with all-but-the-top; not in ``__all__``.)

    The fixed sign makes outputs that depend on individual eigenvectors (whitened coordinates) deterministic.
    The derivative is the usual eigenvector perturbation formula ``dU = U (F o (U^T dC U))`` with
    ``F_ij = 1/(s_j - s_i)``, except that ``F_ij = 0`` where ``|s_j - s_i| <= 1e-6 * max|s|``: inside a
    degenerate eigenspace (e.g. the null space of a rank-deficient covariance) the eigenvectors are not
    determined and this gives finite gradients instead of the inf/NaN of ``jnp.linalg.eigh``.
    A matrix with a NaN or inf entry is never handed to the eigensolver (whose iterations need not end on it):
    zeros are decomposed in its place and both outputs are NaN.
    """
    c, ok = finite_matrix(c)
    s, u = jnp.linalg.eigh(c, symmetrize_input=True)
    s, u = nan_unless(ok, (s, u))
    s, u = s[..., ::-1], u[..., ::-1]
    idx = jnp.argmax(jnp.abs(u), axis=-2, keepdims=True)
    sign = jnp.sign(jnp.take_along_axis(u, idx, axis=-2))
    return s, u * jnp.where(sign == 0, 1, sign)


@eigh_descending.defjvp
def _eigh_descending_jvp(primals, tangents):
    (c,), (dc,) = primals, tangents
    s, u = eigh_descending(c)
    dc = 0.5 * (dc + jnp.swapaxes(dc, -1, -2))
    proj = jnp.matmul(jnp.matmul(jnp.swapaxes(u, -1, -2), dc, precision=HIGHEST), u, precision=HIGHEST)
    gap = s[..., None, :] - s[..., :, None]
    tol = 1e-6 * jnp.max(jnp.abs(s), axis=-1, keepdims=True)[..., None]
    ok = jnp.abs(gap) > tol
    f = jnp.where(ok, 1.0 / jnp.where(ok, gap, 1.0), 0.0)
    ds = jnp.diagonal(proj, axis1=-2, axis2=-1)
    du = jnp.matmul(u, f * proj, precision=HIGHEST)
    return (s, u), (ds, du)


@struct.dataclass
class WhiteningState:
    """Fitted BERT-whitening.

    Built by :func:`fit_whitening`, applied by :func:`apply_whitening` (``(x - mean) W``); a pytree.

    Attributes:
      mean: ``[..., d]`` float32, the mean of the real rows.
      W: ``[..., d, k]`` float32, ``U diag(1 / sqrt(s + eps * s_max))[:, :k]`` of the covariance's eigenvectors ``U``
        and eigenvalues ``s`` (descending).
    """

    mean: jax.Array
    W: jax.Array


def fit_whitening(x, *, k: int | None = None, mask=None, eps: float | None = None) -> WhiteningState:
    """Fit BERT-whitening on the rows of ``x [..., n, d]`` (rows with ``mask [..., n]`` false are ignored).

    ``mu = mean_i x_i``, ``C = cov(x)`` (``ddof=1``), ``C = U diag(s) U^T`` (descending ``s``),
    ``W = U diag(1 / sqrt(s + eps * s_max))[:, :k]``.

    ``eps`` is relative to the largest eigenvalue (default: the machine epsilon of the compute dtype, 1.2e-7
    in float32, below which float32 eigenvalues are rounding noise). It keeps ``W`` finite for a rank-deficient
    covariance (fewer points than dimensions, constant features): such directions are amplified by at most
    ``1/sqrt(eps * s_max)`` instead of infinitely, while an eigenvalue ``s`` changes by the factor
    ``1 + eps * s_max / s``. With ``eps=0`` this is exactly the authors' ``U diag(1/sqrt(s))``. A zero
    covariance (all points equal) gives ``W = U``. ``eps`` is traced (differentiable, no recompile for a new
    value); a traced negative ``eps`` makes ``W`` NaN. ``k`` is static.

    ``k`` (default ``d``) keeps the ``k`` leading principal directions (dimension reduction). Each column of
    ``U`` is signed so that its largest-magnitude entry is positive (see :func:`eigh_descending`), so the
    whitened coordinates are deterministic. Leading axes of ``x`` give a batch of independent fits:
    ``mean [..., d]``, ``W [..., d, k]``. Bad input as in :mod:`isojax.calibrate.centering`; the covariance is
    estimated on ``x`` divided by a power of two near its largest entry (exact) and ``mean``, ``W`` scaled back,
    so any finite float32 scale works (1e±20 included).

    Args:
      x: float array ``[..., n, d]`` with ``n >= 2``; leading axes are independent fits.
      k: static int in ``[1, d]``, the number of whitened dimensions kept (default ``d``).
      mask: optional bool ``[..., n]``, true = a row that enters the statistics.
      eps: float ``>= 0`` (traced), the eigenvalue floor relative to ``s_max`` (default float32's machine
        epsilon).

    Returns:
      A :class:`WhiteningState`: ``mean [..., d]`` and ``W [..., d, k]`` (float32).

    Examples:
      Independent features with variances 4 and 1: ``W = diag(1/2, 1)``.

      >>> import numpy as np
      >>> from isojax import calibrate
      >>> x = np.array([[2.0, 1.0], [-2.0, 1.0], [2.0, -1.0], [-2.0, -1.0]], np.float32) * np.sqrt(0.75)
      >>> state = calibrate.fit_whitening(x, eps=0.0)
      >>> np.allclose(state.W, [[0.5, 0.0], [0.0, 1.0]], atol=1e-5)
      True
    """
    x, mask, ok = check_cloud(x, mask, min_n=2)
    d = x.shape[-1]
    k = d if k is None else k
    if not isinstance(k, int) or not 1 <= k <= d:
        raise ValueError(f"k must be an int in [1, d={d}], got {k!r}")
    x = promote_float32(x)
    eps, eps_ok = check_hyperparameter(float(jnp.finfo(x.dtype).eps) if eps is None else eps, "eps", low=0.0)
    x, scale = unit_scale(x, mask)
    mu, cov = covariance(x, mask, ddof=1)
    return nan_unless(ok, whitening_from_covariance(mu, cov, k=k, eps=eps, eps_ok=eps_ok, scale=scale))


def whitening_from_covariance(mu, cov, *, k: int, eps, eps_ok=True, scale=None) -> WhiteningState:
    """The :class:`WhiteningState` of a mean ``mu [..., d]`` and covariance ``cov [..., d, d]`` (see
    :func:`fit_whitening`; shared with :func:`isojax.stats.fit_whitening`, not in ``__all__``).

    ``scale [...]`` (default 1): the statistics are those of ``x / scale``; ``mean`` and ``W`` are scaled back.
    ``eps_ok`` false makes ``W`` NaN (a traced ``eps`` out of range).
    """
    scale = jnp.ones(mu.shape[:-1], mu.dtype) if scale is None else scale
    s, u = eigh_descending(cov)
    s_max = jnp.max(s, axis=-1, keepdims=True)
    s = jnp.where(s_max > 0, jnp.maximum(s, 0) + eps * s_max, 1.0)
    W = u[..., :k] * jax.lax.rsqrt(s[..., None, :k]) / jnp.where(s_max > 0, scale[..., None], 1)[..., None]
    return WhiteningState(mean=mu * scale[..., None], W=nan_unless(eps_ok, W))


def apply_whitening(state: WhiteningState, x, *, normalize: bool = False):
    """Apply a fitted whitening to every row: ``y = (x - mu) W``.

    With ``normalize=True`` each row is then divided by its L2 norm (``y / ||y||``, zero rows stay zero), as in
    BERT-whitening's cosine-similarity evaluation.

    Args:
      state: a :class:`WhiteningState` from :func:`fit_whitening` (``mean [..., d]``, ``W [..., d, k]``); it
        broadcasts against the leading axes of ``x``.
      x: float array ``[..., n, d]``.
      normalize: static bool, L2-normalise the whitened rows.

    Returns:
      ``y [..., n, k]`` float32 (or ``x``'s dtype if wider). On the data it was fitted on, ``y`` has zero mean
      and identity sample covariance (``ddof=1``).

    Examples:
      >>> import numpy as np
      >>> from isojax import calibrate
      >>> x = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32) @ np.diag([1.0, 5.0, 0.2])
      >>> import jax
      >>> whiten = jax.jit(lambda x: calibrate.apply_whitening(calibrate.fit_whitening(x), x))  # one compilation
      >>> y = np.asarray(whiten(x), np.float64)
      >>> np.allclose(np.cov(y.T), np.eye(3), atol=1e-3)
      True
    """
    x, _, ok = check_cloud(x)
    if state.mean.shape[-1] != x.shape[-1] or state.W.shape[-2] != x.shape[-1]:
        raise ValueError(
            f"x has d={x.shape[-1]} features but the whitening state was fitted on "
            f"mean {state.mean.shape}, W {state.W.shape}"
        )
    y = jnp.matmul(promote_float32(x) - state.mean[..., None, :], state.W, precision=HIGHEST)
    if normalize:
        y = safe_div(y, safe_norm(y, keepdims=True))
    return nan_unless(ok, y)
