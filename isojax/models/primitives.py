"""The two parameterised primitives every layer is built from, configured as the checkpoints expect."""

from __future__ import annotations

import flax.linen as nn

from isojax.models.config import TransformerConfig


def dense(features: int, config: TransformerConfig, dtype, name: str) -> nn.Dense:
    """A Dense layer with BERT's initialisation N(0, initializer_range^2)."""
    return nn.Dense(features, dtype=dtype, kernel_init=nn.initializers.normal(config.initializer_range), name=name)


def layer_norm(config: TransformerConfig, dtype, name: str) -> nn.LayerNorm:
    """LayerNorm with the checkpoint's epsilon; statistics are always computed in float32."""
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=dtype, name=name)
