"""IsoBN: isotropic batch normalization (Zhou, Lin & Ren, AAAI 2021), the baseline of the Isotropy Layer paper.

IsoBN rescales each feature of (usually [CLS]) embeddings by a factor computed from running estimates of the
covariance ``C`` and the standard deviations ``sigma``:

    corr_ij = clip(C_ij / (sigma_i sigma_j), -1, 1),     gamma_i = mean_j corr_ij^2,
    s_i = (gamma_i sigma_i + eps)^(-1/2),                 s <- s * sqrt(tr C / (sum_i C_ii s_i^2 + eps)),
    y = x * stop_gradient(s).

Features that are strongly correlated with many others (large ``gamma``) or have a large spread are shrunk;
the last line keeps the total variance. The running statistics are exponential moving averages,
``C <- C + momentum (C_batch - C)`` (likewise ``sigma``), with ``C_batch`` the biased (``1/n``) covariance of
the batch and ``sigma_batch = sqrt(diag C_batch)``, as in the authors' code.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from isojax._numeric import HIGHEST, nan_unless, promote_float32
from isojax._stats import select_rows
from isojax._validate import check_cloud


def isobn_scale(cov, std, *, eps: float = 1e-3):
    """IsoBN per-feature scale (formulas in the module docstring).

    ``corr_ij = clip(C_ij / (sigma_i sigma_j), -1, 1)``, ``gamma_i = mean_j corr_ij^2``,
    ``s_i = (gamma_i sigma_i + eps)^(-1/2)``, then ``s <- s * sqrt(tr C / (sum_i C_ii s_i^2 + eps))``.
    Zero standard deviations give ``corr = 0`` rather than NaN.

    Args:
      cov: float covariance ``[d, d]``.
      std: float standard deviations ``[d]``.
      eps: float ``> 0``, the regulariser of both divisions.

    Returns:
      ``s [d]`` in the dtype of ``cov`` and ``std``.

    Examples:
      Uncorrelated features with variances 4 and 1: ``gamma = 1/2``, ``s = (1, sqrt 2) * sqrt(5/6)``, which
      keeps the total variance ``4 s_1^2 + s_2^2 = 5``.

      >>> import numpy as np
      >>> from isojax import calibrate
      >>> s = calibrate.isobn_scale(np.diag([4.0, 1.0]), np.array([2.0, 1.0]), eps=0.0)
      >>> np.round(np.asarray(s, np.float64), 4).tolist()
      [0.9129, 1.291]
    """
    denom = std[:, None] * std[None, :]
    pos = denom > 0
    corr = jnp.clip(jnp.where(pos, cov / jnp.where(pos, denom, 1), 0), -1, 1)
    gamma = jnp.mean(corr * corr, axis=-1)
    scale = (gamma * std + eps) ** -0.5
    var = jnp.diagonal(cov)
    return scale * jnp.sqrt(jnp.sum(var) / (jnp.sum(var * scale * scale) + eps))


class IsoBN(nn.Module):
    """Isotropic batch normalization as a Linen module (``x [..., d]`` -> ``[..., d]``).

    Running statistics live in the ``"batch_stats"`` collection (``cov [d, d]``, ``std [d]``, float32); call
    with ``mutable=["batch_stats"]`` when training. Like ``flax.linen.BatchNorm``, ``use_running_average``
    (field or call argument) selects evaluation mode: the statistics are then only read. In training mode the
    batch statistics (of ``stop_gradient(x)``, over every axis but the last, rows with ``mask`` false left out)
    are first folded into the running averages and the output uses the updated averages, as the authors' code
    does; ``module.init`` leaves the statistics at their start value. A batch without real rows leaves them
    unchanged. With ``axis_name`` the batch statistics are averaged over that mapped axis (pmap/shard_map).

    Bad input (:func:`isojax._validate.check_cloud`): masked rows never enter the statistics, whatever they
    hold; a NaN or inf in a counted row raises ``ValueError`` (concrete) or, traced, gives a NaN output and
    leaves the running statistics unchanged. Not scale-invariant: the covariance squares the entries, so float32
    input must stay below about 1e19.

    Attributes:
      use_running_average: evaluation mode (the running statistics only read); ``None``: given at the call.
      momentum: of the moving averages (0.05).
      eps: the regulariser of :func:`isobn_scale` (1e-3).
      stats_init: ``"identity"`` (default, ``C = I``, ``sigma = 1``, so the untrained module is the identity up to
        ``eps``) or ``"zeros"`` (the authors' code). From zeros, after ``t`` updates both averages carry a factor
        ``1 - (1 - momentum)^t``, so ``corr`` is inflated by ``1 / (1 - (1 - momentum)^t)`` (20x after the first
        step; clipped at 1) and, before any update, the output is all zeros.
      axis_name: a mapped axis (pmap / shard_map) over which the batch statistics are averaged; ``None``: none.
    """

    use_running_average: bool | None = None
    momentum: float = 0.05
    eps: float = 1e-3
    stats_init: str = "identity"
    axis_name: str | None = None

    @nn.compact
    def __call__(self, x, *, mask=None, use_running_average: bool | None = None):
        use_running_average = nn.merge_param("use_running_average", self.use_running_average, use_running_average)
        if self.stats_init not in ("identity", "zeros"):
            raise ValueError(f"stats_init must be 'identity' or 'zeros', got {self.stats_init!r}")
        if not 0 < self.momentum <= 1:
            raise ValueError(f"momentum must be in (0, 1], got {self.momentum!r}")
        x, mask, ok = check_cloud(x, mask, count_real=False)  # no real row: the statistics are not updated
        d = x.shape[-1]
        start = 1.0 if self.stats_init == "identity" else 0.0
        cov = self.variable("batch_stats", "cov", lambda: start * jnp.eye(d, dtype=jnp.float32))
        std = self.variable("batch_stats", "std", lambda: jnp.full((d,), start, jnp.float32))
        if not use_running_average and not self.is_initializing():
            # One flag for the whole (global) batch, the same on every device: all counted rows finite.
            all_ok = ok if ok is True else self._total(jnp.sum(~ok)) == 0
            batch_cov, count = self._batch_covariance(x, mask)
            rate = jnp.where(count > 0, self.momentum, 0.0)
            batch_std = jnp.sqrt(jnp.maximum(jnp.diagonal(batch_cov), 0))
            # A batch with a non-finite counted row leaves the statistics unchanged (selected, not multiplied by 0).
            cov.value = jnp.where(all_ok, cov.value + rate * (batch_cov - cov.value), cov.value)
            std.value = jnp.where(all_ok, std.value + rate * (batch_std - std.value), std.value)
        scale = jax.lax.stop_gradient(isobn_scale(cov.value, std.value, eps=self.eps))
        return nan_unless(ok, (x * scale).astype(x.dtype))

    def _batch_covariance(self, x, mask):
        """Biased covariance ``[d, d]`` of the real rows of ``stop_gradient(x)`` and their number."""
        rows = promote_float32(jax.lax.stop_gradient(x).reshape(-1, x.shape[-1]))
        if mask is not None:
            rows = select_rows(rows, mask.reshape(-1))
        weight = jnp.ones(rows.shape[:1], rows.dtype) if mask is None else mask.reshape(-1).astype(rows.dtype)
        count = self._total(jnp.sum(weight))
        mean = self._total(jnp.matmul(weight, rows, precision=HIGHEST)) / jnp.maximum(count, 1)
        centered = (rows - mean) * weight[:, None]
        batch_cov = self._total(jnp.matmul(centered.T, centered, precision=HIGHEST)) / jnp.maximum(count, 1)
        return batch_cov.astype(jnp.float32), count

    def _total(self, value):
        """Sum over the devices of ``axis_name`` (identity without one)."""
        return value if self.axis_name is None else jax.lax.psum(value, self.axis_name)
