"""The key/value cache of a decoder stack for incremental decoding: each new token's keys and values are appended to
it instead of recomputing the prefix (an explicit pytree, passed in and returned)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from isojax.models.config import TransformerConfig

Array = jax.Array


@flax.struct.dataclass
class KVCache:
    """Keys and values of one attention layer, each ``[B, T, key_value_heads, head_dim]``."""

    key: Array
    value: Array


@flax.struct.dataclass
class LayerCache:
    """What one decoder block keeps between decoding steps: its self-attention keys and values over the cache's
    ``T`` slots, and (encoder-decoder) the keys and values of the encoder output, computed on the first call."""

    attention: KVCache
    cross_attention: KVCache | None = None


@flax.struct.dataclass
class Cache:
    """Key/value cache of a decoder stack for incremental decoding (an explicit pytree, passed in and returned);
    :func:`init_cache` makes an empty one.

    Attributes:
      layers: one :class:`LayerCache` per layer.
      mask: ``[B, T]`` bool, whether a slot holds a real token (a prompt's padding stays False).
      index: int32 scalar; slots ``[0, index)`` are written, the next ``L`` tokens go to ``[index, index + L)``.
    """

    layers: tuple[LayerCache, ...]
    mask: Array
    index: Array


def init_cache(config: TransformerConfig, batch_size: int, length: int, dtype: Any = jnp.float32) -> Cache:
    """An empty :class:`Cache` of ``length`` slots for the stack of ``config``.

    Args:
      config: the decoder stack's config (its layers, heads and hidden size).
      batch_size: ``B``, the rows decoded together.
      length: ``T``, the slots (prompt plus generated tokens).
      dtype: dtype of the keys/values, the compute dtype of the model that fills it.

    Returns:
      A :class:`Cache` with ``num_hidden_layers`` layers of zero keys/values ``[B, T, key_value_heads, head_dim]``,
      an all-False ``mask`` ``[B, T]`` and ``index`` 0.

    Examples:
      >>> from isojax.models import TransformerConfig
      >>> config = TransformerConfig(model_type="gpt2", vocab_size=10, hidden_size=8, num_hidden_layers=2,
      ...                            num_attention_heads=2, intermediate_size=16, max_position_embeddings=16)
      >>> cache = init_cache(config, batch_size=3, length=7)
      >>> len(cache.layers), cache.layers[0].attention.key.shape, cache.mask.shape, int(cache.index)
      (2, (3, 7, 2, 4), (3, 7), 0)
    """
    shape = (batch_size, length, config.key_value_heads, config.attention_head_dim)
    layer = LayerCache(KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)))
    return Cache((layer,) * config.num_hidden_layers, jnp.zeros((batch_size, length), bool), jnp.zeros((), jnp.int32))
