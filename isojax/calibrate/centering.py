"""Centering, scaled centering and all-but-the-top (too-much-in-common §5, eq. 9-11; Mu & Viswanath 2018).

The statistics (mean, mean direction, principal directions) are estimated over the rows of ``x [..., n, d]``
where ``mask [..., n]`` is true; the transform is then applied to every row, padded ones included. Bad input
(:func:`isojax._validate.check_cloud`): a padding row never changes the statistics nor another row's result,
whatever it holds (a NaN padding row only comes back NaN itself); a NaN or inf in a counted row raises
``ValueError`` (concrete) or makes the whole result NaN (traced). The transforms are scale-equivariant at any
finite float32 scale: the statistics that square the data are estimated on ``x`` divided by a power of two near
its largest entry (exact) and scaled back.

Fit/apply pairs (:func:`fit_centering` -> :func:`apply_centering`, :func:`fit_all_but_the_top` ->
:func:`apply_all_but_the_top`) apply statistics fitted on one split to another; :func:`center`,
:func:`scaled_center` and :func:`all_but_the_top` fit on ``x`` and transform ``x`` in one call.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from isojax._numeric import HIGHEST, nan_unless, promote_float32, safe_norm
from isojax._stats import covariance, masked_mean, rowwise, select_rows, unit_scale
from isojax._validate import check_cloud, check_float, check_points
from isojax.calibrate.whitening import eigh_descending


def _check_stat(value, name: str, x, *, extra_dims: int = 0):
    """Check a precomputed statistic whose shape ends in ``[d]`` (plus ``extra_dims`` trailing axes)."""
    value = check_float(value, name)
    d = x.shape[-1]
    if value.ndim < 1 + extra_dims or value.shape[value.ndim - 1 - extra_dims] != d:
        raise ValueError(f"{name} must have d={d} (x.shape[-1]) along axis {-1 - extra_dims}, got shape {value.shape}")
    return value


@struct.dataclass
class CenteringState:
    """Fitted centering: the mean of the rows it was fitted on.

    Built by :func:`fit_centering`, applied by :func:`apply_centering`; a pytree, so it can cross ``jit`` and
    ``vmap``.

    Attributes:
      mean: ``[..., d]`` float32 (or the input's dtype if wider), ``mu = mean_i x_i`` over the real rows.
    """

    mean: jax.Array


def fit_centering(x, *, mask=None) -> CenteringState:
    """Estimate the centering mean ``mu = mean_i x_i`` over the unmasked rows (too-much-in-common eq. 9).

    Args:
      x: float array ``[..., n, d]``; leading axes are independent fits.
      mask: optional bool ``[..., n]``, true = a row that enters the mean.

    Returns:
      A :class:`CenteringState` with ``mean [..., d]`` (float32, or ``x``'s dtype if wider).

    Examples:
      >>> import numpy as np
      >>> from isojax import calibrate
      >>> state = calibrate.fit_centering(np.array([[1.0, 2.0], [3.0, 6.0]], np.float32))
      >>> np.round(np.asarray(state.mean), 4).tolist()
      [2.0, 4.0]
    """
    x, mask, ok = check_cloud(x, mask)
    return nan_unless(ok, CenteringState(mean=masked_mean(promote_float32(x), mask)))


def apply_centering(state: CenteringState, x):
    """Subtract a fitted mean from every row: ``y_i = x_i - mu`` (too-much-in-common eq. 9).

    Args:
      state: a :class:`CenteringState` (``mean [..., d]``, e.g. fitted on another split); it broadcasts
        against the leading axes of ``x``.
      x: float array ``[..., n, d]``.

    Returns:
      ``[..., n, d]`` float32 (or ``x``'s dtype if wider).

    Examples:
      >>> import numpy as np
      >>> from isojax import calibrate
      >>> state = calibrate.CenteringState(mean=np.array([1.0, -1.0], np.float32))
      >>> np.round(np.asarray(calibrate.apply_centering(state, np.array([[2.0, 0.0]], np.float32))), 4).tolist()
      [[1.0, 1.0]]
    """
    x, _, ok = check_cloud(x)
    mean = _check_stat(state.mean, "state.mean", x)
    return nan_unless(ok, promote_float32(x) - mean[..., None, :])


def center(x, *, mask=None):
    """Centering fitted and applied on the same rows (too-much-in-common eq. 9): ``x_i - mu``.

    ``mu = mean_i x_i`` over the unmasked rows; every row, padded ones included, is shifted. Equal to
    ``apply_centering(fit_centering(x, mask=mask), x)``; use that pair to apply a mean fitted on other data.

    Args:
      x: float array ``[..., n, d]``; leading axes are independent fits.
      mask: optional bool ``[..., n]``, true = a row that enters the mean.

    Returns:
      ``[..., n, d]`` float32 (or ``x``'s dtype if wider); the unmasked rows have mean zero.

    Examples:
      >>> import numpy as np
      >>> from isojax import calibrate
      >>> np.round(np.asarray(calibrate.center(np.array([[1.0, 2.0], [3.0, 6.0]], np.float32))), 4).tolist()
      [[-1.0, -2.0], [1.0, 2.0]]
    """
    x, mask, ok = check_cloud(x, mask)  # a padding row may hold anything, NaN included (module docstring)
    x = promote_float32(x)
    return nan_unless(ok, x - masked_mean(x, mask)[..., None, :])


def scaled_center(x, *, mask=None):
    """Scaled centering (too-much-in-common §5.2): ``x_i - ||x_i|| mu_hat``, ``mu_hat = mean_j x_j / ||x_j||``.

    The mean of unit vectors runs over the unmasked rows; every row is transformed. A zero row contributes a
    zero unit vector to ``mu_hat`` (it still counts in the denominator) and maps to itself; gradients there are
    finite.

    Args:
      x: float array ``[..., n, d]``; leading axes are independent fits.
      mask: optional bool ``[..., n]``, true = a row that enters ``mu_hat``.

    Returns:
      ``[..., n, d]`` float32 (or ``x``'s dtype if wider).

    Examples:
      Two unit rows: ``mu_hat = (0.5, 0.5)``, so ``e_1`` maps to ``(0.5, -0.5)``.

      >>> import numpy as np
      >>> from isojax import calibrate
      >>> np.round(np.asarray(calibrate.scaled_center(np.eye(2, dtype=np.float32))), 4).tolist()
      [[0.5, -0.5], [-0.5, 0.5]]
    """
    x, mask, ok = check_cloud(x, mask)
    x, scale = unit_scale(promote_float32(x), mask)  # 1-homogeneous: computed at unit scale, scaled back
    real = select_rows(x, mask)
    norm = safe_norm(real, keepdims=True)
    mean_direction = masked_mean(real / jnp.where(norm > 0, norm, 1), mask)

    def transform(rows, mu_hat):
        return rows - safe_norm(rows, keepdims=True) * mu_hat[..., None, :]

    return nan_unless(ok, rowwise(transform, x, mean_direction) * scale[..., None, None])


@struct.dataclass
class AllButTheTopState:
    """Fitted all-but-the-top: the mean and the top-``D`` principal directions of the centered data.

    Built by :func:`fit_all_but_the_top`, applied by :func:`apply_all_but_the_top`; a pytree.

    Attributes:
      mean: ``[..., d]`` float32, the mean of the real rows.
      directions: ``[..., d, D]`` float32, the top-``D`` principal directions of the centered data as orthonormal
        columns, in descending order of variance.
    """

    mean: jax.Array
    directions: jax.Array


def _default_D(d: int, D):
    D = math.ceil(d / 100) if D is None else D
    if not isinstance(D, int) or not 0 <= D <= d:
        raise ValueError(f"D must be an int in [0, d={d}] (default ceil(d/100)), got {D!r}")
    return D


def _check_top(x, mask, D):
    """``check_cloud`` for all-but-the-top, with ``D`` resolved: a direction needs a covariance, so two real rows
    (one without directions, D = 0). Returns ``(x, mask, ok, D)``."""
    D = _default_D(check_points(x).shape[-1], D)
    return (*check_cloud(x, mask, min_n=2 if D else 1), D)


def _check_mode(mode: str) -> None:
    if mode not in ("centered", "raw"):
        raise ValueError(f"mode must be 'centered' or 'raw', got {mode!r}")


def fit_all_but_the_top(x, *, D: int | None = None, mask=None) -> AllButTheTopState:
    """Estimate ``mu`` and ``U = PCA(x - mu)[:, :D]`` (too-much-in-common eq. 9-10) from the unmasked rows.

    ``U`` holds the ``D`` leading eigenvectors of the covariance of the unmasked rows, each signed so that its
    largest-magnitude entry is positive. Apply it with :func:`apply_all_but_the_top`, e.g. to directions fitted
    on one split (dev) applied to another (test).

    Args:
      x: float array ``[..., n, d]``; leading axes are independent fits.
      D: static int in ``[0, d]``, the number of directions (default ``ceil(d / 100)``).
      mask: optional bool ``[..., n]``, true = a row that enters the statistics.

    Returns:
      An :class:`AllButTheTopState`: ``mean [..., d]`` and ``directions [..., d, D]`` (float32).

    Examples:
      Points spread along the first axis: the top direction is ``e_1``.

      >>> import numpy as np
      >>> from isojax import calibrate
      >>> x = np.array([[-2.0, 0.1], [2.0, 0.1], [-1.0, -0.1], [1.0, -0.1]], np.float32)
      >>> state = calibrate.fit_all_but_the_top(x, D=1)
      >>> np.allclose(state.directions, [[1.0], [0.0]], atol=1e-5)
      True
    """
    x, mask, ok, D = _check_top(x, mask, D)
    x, scale = unit_scale(promote_float32(x), mask)  # the directions are scale-invariant, the mean scales back
    mu, cov = covariance(x, mask, ddof=1)
    _, u = eigh_descending(cov)
    return nan_unless(ok, AllButTheTopState(mean=mu * scale[..., None], directions=u[..., :D]))


def _remove_top(state: AllButTheTopState, x, mode: str):
    """Eq. 11 (``mode="centered"``) or Mu & Viswanath's Alg. 1 (``"raw"``) on every row of a validated ``x``."""

    def transform(rows, state):
        rows_tilde = rows - state.mean[..., None, :]
        u = state.directions
        coefficients = jnp.matmul(rows_tilde if mode == "centered" else rows, u, precision=HIGHEST)
        return rows_tilde - jnp.matmul(coefficients, jnp.swapaxes(u, -1, -2), precision=HIGHEST)

    return rowwise(transform, promote_float32(x), state)


def apply_all_but_the_top(state: AllButTheTopState, x, *, mode: str = "centered"):
    """Remove a fitted mean and top ``D`` principal directions from every row of ``x``.

    With ``x~_i = x_i - mu`` (eq. 9) and ``U = state.directions`` (eq. 10):

    * ``mode="centered"`` (too-much-in-common eq. 11): ``x^_i = x~_i - sum_j (U_j^T x~_i) U_j``;
    * ``mode="raw"`` (Mu & Viswanath 2018, Alg. 1): ``x^_i = x~_i - sum_j (U_j^T x_i) U_j``, which differs
      from the centered variant by the constant ``sum_j (U_j^T mu) U_j``.

    Args:
      state: an :class:`AllButTheTopState` from :func:`fit_all_but_the_top` (``mean [..., d]``,
        ``directions [..., d, D]``); it broadcasts against the leading axes of ``x``.
      x: float array ``[..., n, d]``.
      mode: static ``"centered"`` (default) or ``"raw"``.

    Returns:
      ``[..., n, d]`` float32 (or ``x``'s dtype if wider).

    Examples:
      Fitted on a cloud spread along ``e_1``: a new point keeps only its centered ``e_2`` coordinate.

      >>> import numpy as np
      >>> from isojax import calibrate
      >>> x = np.array([[-2.0, 0.1], [2.0, 0.1], [-1.0, -0.1], [1.0, -0.1]], np.float32)
      >>> state = calibrate.fit_all_but_the_top(x, D=1)
      >>> y = calibrate.apply_all_but_the_top(state, np.array([[5.0, 3.0]], np.float32))
      >>> np.allclose(y, [[0.0, 3.0]], atol=1e-5)
      True
    """
    x, _, ok = check_cloud(x)
    _check_mode(mode)
    _check_stat(state.mean, "state.mean", x)
    _check_stat(state.directions, "state.directions", x, extra_dims=1)
    return nan_unless(ok, _remove_top(state, x, mode))


def all_but_the_top(x, *, D: int | None = None, mode: str = "centered", mask=None):
    """All-but-the-top fitted and applied on the same rows: remove the mean and the top ``D`` principal directions.

    Equal to ``apply_all_but_the_top(fit_all_but_the_top(x, D=D, mask=mask), x, mode=mode)`` (formulas there):
    ``mu`` and ``U`` are estimated from the unmasked rows of ``x`` and every row is transformed (a padding row
    may hold anything, NaN included, without changing the others).

    Args:
      x: float array ``[..., n, d]``; leading axes are independent fits.
      D: static int in ``[0, d]``, the number of directions removed (default ``ceil(d / 100)``).
      mode: static ``"centered"`` (eq. 11, default) or ``"raw"`` (Mu & Viswanath's Alg. 1).
      mask: optional bool ``[..., n]``, true = a row that enters the statistics.

    Returns:
      ``[..., n, d]`` float32 (or ``x``'s dtype if wider).

    Examples:
      In two dimensions, removing the top direction leaves the centered second coordinate.

      >>> import numpy as np
      >>> from isojax import calibrate
      >>> x = np.array([[-2.0, 0.1], [2.0, 0.1], [-1.0, -0.1], [1.0, -0.1]], np.float32)
      >>> import jax
      >>> y = jax.jit(calibrate.all_but_the_top, static_argnames="D")(x, D=1)  # jit: one compilation, not one per op
      >>> np.allclose(y, [[0, 0.1], [0, 0.1], [0, -0.1], [0, -0.1]], atol=1e-5)
      True
    """
    x, _, ok, D = _check_top(x, mask, D)
    _check_mode(mode)
    return nan_unless(ok, _remove_top(fit_all_but_the_top(x, D=D, mask=mask), x, mode))
