"""Sentence pooling and task heads on top of an encoder.

Pooling methods (``h_l`` = hidden state of layer l, ``h_0`` the embedding output, averages over real tokens)::

    cls             h_L[:, 0]
    pooler          tanh(W h_L[:, 0] + b)       (architectures with a pooler)
    mean            mean_t h_L[:, t]
    first_last_avg  mean_t (h_1 + h_L)[:, t] / 2   (BERT-flow / BERT-whitening "first-last-avg")
    last2avg        mean_t (h_0 + h_L)[:, t] / 2   (SoftDecay authors' code: embedding output and last layer)
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from isojax._stats import masked_mean
from isojax.models.layers import EncoderOutput

POOLINGS = ("cls", "pooler", "mean", "first_last_avg", "last2avg")


def pool(output: EncoderOutput, mask: jax.Array, method: str = "mean") -> jax.Array:
    """Sentence embeddings ``[B, H]`` from an encoder output by ``method`` (see the module docstring)."""
    h = output.hidden_states
    if method == "cls":
        return h[-1][:, 0]
    if method == "pooler":
        if output.pooler_output is None:
            raise ValueError("pooling='pooler' needs a model with a pooler; this one has none (use 'cls')")
        return output.pooler_output
    if method == "mean":
        return masked_mean(h[-1], mask)
    if method == "first_last_avg":
        return masked_mean((h[1] + h[-1]) / 2, mask)
    if method == "last2avg":
        return masked_mean((h[0] + h[-1]) / 2, mask)
    raise ValueError(f"unknown pooling {method!r}; expected one of {POOLINGS}")


class ClassificationHead(nn.Module):
    """Dropout -> Dense(num_labels) on a pooled ``[B, H]`` representation; ``num_labels = 1`` is regression."""

    num_labels: int
    dropout_rate: float = 0.1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, pooled: jax.Array, deterministic: bool = True) -> jax.Array:
        x = nn.Dropout(self.dropout_rate)(pooled, deterministic=deterministic)
        return nn.Dense(self.num_labels, dtype=self.dtype, kernel_init=nn.initializers.normal(0.02),
                        name="classifier")(x).astype(jnp.float32)
