"""The parameterised primitives every layer is built from, configured as the checkpoints expect."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from isojax.models.config import TransformerConfig


def dense(features: int, config: TransformerConfig, dtype, name: str, *, use_bias: bool = True) -> nn.Dense:
    """A Dense layer with BERT's initialisation N(0, initializer_range^2)."""
    return nn.Dense(
        features,
        use_bias=use_bias,
        dtype=dtype,
        kernel_init=nn.initializers.normal(config.initializer_range),
        name=name,
    )


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019): ``y = x / sqrt(mean(x²) + eps) · (offset + w)`` over the last
    axis, computed in float32 and returned in ``dtype``. ``offset`` is 0 for Llama, Qwen and Mistral; Gemma stores
    ``w`` around 0 and uses ``offset = 1``."""

    epsilon: float = 1e-6
    offset: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.zeros if self.offset else nn.initializers.ones
        scale = self.param("scale", init, (x.shape[-1],))
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.epsilon)
        return (h * (self.offset + scale.astype(jnp.float32))).astype(self.dtype)


def layer_norm(config: TransformerConfig, dtype, name: str) -> nn.Module:
    """The config's norm (``config.norm``: LayerNorm or :class:`RMSNorm`) with the checkpoint's epsilon; statistics are
    always computed in float32."""
    if config.norm == "rms_norm":
        return RMSNorm(config.layer_norm_eps, config.norm_weight_offset, dtype, name=name)
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=dtype, name=name)
