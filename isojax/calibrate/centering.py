"""Centering, scaled centering and all-but-the-top (too-much-in-common §5, eq. 9-11; Mu & Viswanath 2018).

The statistics (mean, mean direction, principal directions) are estimated over the rows of ``x [..., n, d]``
where ``mask [..., n]`` is true; the transform is then applied to every row, padded ones included. Bad input
(:func:`isojax._validate.check_cloud`): a padding row never changes the statistics nor another row's result,
whatever it holds (a NaN padding row only comes back NaN itself); a NaN or inf in a counted row raises
``ValueError`` (concrete) or makes the whole result NaN (traced). The transforms are scale-equivariant at any
finite float32 scale: the statistics that square the data are estimated on ``x`` divided by a power of two near
its largest entry (exact) and scaled back.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from isojax._numeric import HIGHEST, nan_unless, promote_float32, safe_norm
from isojax._stats import covariance, masked_mean, rowwise, select_rows, unit_scale
from isojax._validate import check_cloud, check_float
from isojax.calibrate.whitening import eigh_descending


def _check_stat(value, name: str, x, *, extra_dims: int = 0):
    """Check a precomputed statistic whose shape ends in ``[d]`` (plus ``extra_dims`` trailing axes)."""
    value = check_float(value, name)
    d = x.shape[-1]
    if value.ndim < 1 + extra_dims or value.shape[value.ndim - 1 - extra_dims] != d:
        raise ValueError(f"{name} must have d={d} (x.shape[-1]) along axis {-1 - extra_dims}, got shape {value.shape}")
    return value


def center(x, *, mask=None, mean=None):
    """Centering (too-much-in-common eq. 9): ``x_i - mu``, ``mu = mean_i x_i`` over the unmasked rows.

    ``x [..., n, d]`` -> ``[..., n, d]``. Pass ``mean [..., d]`` (e.g. estimated on other data) to subtract it
    instead of the mean of ``x``.
    """
    x, mask, ok = check_cloud(x, mask)
    x = promote_float32(x)
    if mean is None:
        mean = masked_mean(x, mask)
    elif mask is not None:
        raise ValueError("mask only selects the rows that estimate the mean; pass either mask or mean, not both")
    else:
        mean = _check_stat(mean, "mean", x)
    return nan_unless(ok, x - mean[..., None, :])


def scaled_center(x, *, mask=None):
    """Scaled centering (too-much-in-common §5.2): ``x_i - ||x_i|| mu_hat``, ``mu_hat = mean_j x_j / ||x_j||``.

    ``x [..., n, d]`` -> ``[..., n, d]``; the mean of unit vectors runs over the unmasked rows. A zero row
    contributes a zero unit vector to ``mu_hat`` (it still counts in the denominator) and maps to itself;
    gradients there are finite.
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
class TopDirections:
    """Statistics of all-but-the-top: ``mean [..., d]`` and the top-``D`` principal directions
    ``directions [..., d, D]`` (columns, descending variance) of the centered data."""

    mean: jax.Array
    directions: jax.Array


def _default_D(d: int, D):
    D = math.ceil(d / 100) if D is None else D
    if not isinstance(D, int) or not 0 <= D <= d:
        raise ValueError(f"D must be an int in [0, d={d}] (default ceil(d/100)), got {D!r}")
    return D


def fit_all_but_the_top(x, *, D: int | None = None, mask=None) -> TopDirections:
    """Estimate ``mu`` and ``U = PCA(x - mu)[:, :D]`` (eq. 9-10) from ``x [..., n, d]``.

    ``U`` holds the ``D`` leading eigenvectors of the covariance of the unmasked rows (default
    ``D = ceil(d / 100)``). Use it with ``all_but_the_top(x, state=...)`` to apply directions fitted on
    one split (e.g. dev) to another (test).
    """
    x, mask, ok = check_cloud(x, mask)
    D = _default_D(x.shape[-1], D)
    x, scale = unit_scale(promote_float32(x), mask)  # the directions are scale-invariant, the mean scales back
    mu, cov = covariance(x, mask, ddof=1)
    _, u = eigh_descending(cov)
    return nan_unless(ok, TopDirections(mean=mu * scale[..., None], directions=u[..., :D]))


def all_but_the_top(x, *, D: int | None = None, mode: str = "centered", mask=None, state: TopDirections | None = None):
    """All-but-the-top post-processing: remove the mean and the top ``D`` principal directions.

    With ``x~_i = x_i - mu`` (eq. 9) and ``U = PCA(x~)`` (eq. 10, ``D`` columns, default ``ceil(d/100)``):

    * ``mode="centered"`` (too-much-in-common eq. 11): ``x^_i = x~_i - sum_j (U_j^T x~_i) U_j``;
    * ``mode="raw"`` (Mu & Viswanath 2018, Alg. 1): ``x^_i = x~_i - sum_j (U_j^T x_i) U_j``, which differs
      from the centered variant by the constant ``sum_j (U_j^T mu) U_j``.

    ``x [..., n, d]`` -> ``[..., n, d]``. ``mu`` and ``U`` are estimated from the unmasked rows of ``x``,
    or taken from ``state`` (see :func:`fit_all_but_the_top`); ``state`` excludes ``D`` and ``mask``.
    """
    x, _, ok = check_cloud(x, mask)
    if mode not in ("centered", "raw"):
        raise ValueError(f"mode must be 'centered' or 'raw', got {mode!r}")
    if state is None:
        state = fit_all_but_the_top(x, D=D, mask=mask)
    else:
        if D is not None or mask is not None:
            raise ValueError("D and mask configure the fit; pass them to fit_all_but_the_top, not with state")
        _check_stat(state.mean, "state.mean", x)
        _check_stat(state.directions, "state.directions", x, extra_dims=1)

    def transform(rows, state):
        rows_tilde = rows - state.mean[..., None, :]
        u = state.directions
        coefficients = jnp.matmul(rows_tilde if mode == "centered" else rows, u, precision=HIGHEST)
        return rows_tilde - jnp.matmul(coefficients, jnp.swapaxes(u, -1, -2), precision=HIGHEST)

    return nan_unless(ok, rowwise(transform, promote_float32(x), state))
