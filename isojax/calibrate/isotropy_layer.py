"""The Isotropy Layer (isotropy-layer-joint-loss §3.2): one d -> d feed-forward layer between a frozen
fine-tuned encoder and its frozen task head, trained with the joint loss (task loss + log(1/IsoScore))."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from isojax._validate import check_finite_rows, check_float, nan_unless


def _identity(key, shape, dtype=jnp.float32):
    """Kernel initialiser ``I`` (``shape = (d, d)``)."""
    del key
    return jnp.eye(shape[0], shape[1], dtype=dtype)


class IsotropyLayer(nn.Module):
    """``y = x K + b`` with ``K [d, d]``, ``b [d]``, ``d = x.shape[-1]``, started at ``K = I``, ``b = 0``.

    The identity start means inserting the layer leaves the fine-tuned model's predictions unchanged until
    the joint loss moves it. ``x [..., d]`` -> ``[..., d]``.

    Attributes:
      dtype: the compute dtype (e.g. ``jnp.bfloat16``); ``None``: the input's.
      param_dtype: the dtype of the parameters ``K`` and ``b`` (float32).
    """

    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = check_float(x, "x")
        if x.ndim < 1:
            raise ValueError(f"x must have shape [..., d], got a scalar of shape {x.shape}")
        ok = check_finite_rows(x.reshape(-1, x.shape[-1]), None, "x")  # concrete: ValueError; traced: NaN out
        return nan_unless(
            ok,
            nn.Dense(
                x.shape[-1],
                kernel_init=_identity,
                bias_init=nn.initializers.zeros,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                name="dense",
            )(x),
        )
