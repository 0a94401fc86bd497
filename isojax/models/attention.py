"""Multi-head scaled dot-product attention, and what every block of a stack attends with."""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from isojax.models.cache import KVCache
from isojax.models.config import TransformerConfig
from isojax.models.dropout import Dropout
from isojax.models.primitives import dense

Array = jax.Array


class AttentionContext(NamedTuple):
    """What every block of a stack attends with, computed once per call by
    :class:`~isojax.models.stack.TransformerStack`.

    mask ``[B, L]`` (the input's real tokens; a last-layer transform reads it); allowed ``[B, 1, L, T]`` (the keys
    each query sees in self-attention); bias (additive self-attention bias or None); memory ``[B, S, H]`` and
    memory_allowed ``[B, 1, 1, S]`` (the encoder output and its real tokens, for cross-attention, or None);
    write_index (the cache slot of the first input token, or None without a cache).
    """

    mask: Array
    allowed: Array
    bias: Array | None = None
    memory: Array | None = None
    memory_allowed: Array | None = None
    write_index: Array | None = None


class Attention(nn.Module):
    """Multi-head scaled dot-product attention with output projection.

    ``softmax(q kᵀ / sqrt(H/heads) + bias + mask) v``: queries from ``x [B, L, H]``, keys and values from
    ``source`` (default ``x``; the encoder output ``[B, S, H]`` for cross-attention). ``allowed`` (bool, broadcastable
    to ``[B, heads, L, S]``) says which keys each query sees; the optional additive ``bias`` (broadcastable to the
    same shape) is MPNet's relative position bias.

    With a ``cache`` (:class:`KVCache` of ``T`` slots): given ``write_index``, the new keys and values are written
    to slots ``[write_index, write_index + L)`` and the queries attend over all ``T`` slots (decoder self-attention);
    without it, the cached keys and values are used as they are and ``source`` is not read (cross-attention after
    the first decoding step).

    Returns ``(out [B, L, H], (probs [B, heads, L, S] or None, KVCache of the keys and values attended to))``.
    """

    config: TransformerConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self,
        x: Array,
        allowed: Array,
        deterministic: bool,
        output_attentions: bool,
        bias=None,
        *,
        source: Array | None = None,
        cache: KVCache | None = None,
        write_index=None,
    ):
        cfg = self.config
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads

        def project(name, t):  # [B, L, H] -> [B, L, heads, head_dim]
            t = dense(cfg.hidden_size, cfg, self.dtype, name)(t)
            return t.reshape(*t.shape[:-1], heads, head_dim)

        q = project("query", x)
        if cache is not None and write_index is None:
            k, v = cache.key, cache.value
        else:
            kv_input = x if source is None else source
            k, v = project("key", kv_input), project("value", kv_input)
            if cache is not None:
                k = jax.lax.dynamic_update_slice(cache.key, k.astype(cache.key.dtype), (0, write_index, 0, 0))
                v = jax.lax.dynamic_update_slice(cache.value, v.astype(cache.value.dtype), (0, write_index, 0, 0))
        needs_probs = output_attentions or (not deterministic and cfg.attention_probs_dropout_prob > 0)
        if needs_probs:
            # Heads moved ahead of positions before the two batched products ([B, heads, L, head_dim]): XLA's CPU
            # layouts then need no copies inside them (one layer's fwd + bwd at 32 x 128 x 384: 161 -> 144 ms).
            qh, kh, vh = (t.swapaxes(1, 2) for t in (q, k, v))
            scores = jnp.matmul(qh, kh.swapaxes(2, 3)).astype(jnp.float32) / np.sqrt(head_dim)
            if bias is not None:
                scores = scores + bias
            scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
            dropped = Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
            context = jnp.matmul(dropped, vh).swapaxes(1, 2)  # [B, L, heads, head_dim]
        else:
            probs = None
            context = jax.nn.dot_product_attention(
                q,
                k.astype(q.dtype),
                v.astype(q.dtype),
                bias=None if bias is None else bias.astype(q.dtype),
                mask=allowed,
            )
        out = dense(cfg.hidden_size, cfg, self.dtype, "output")(context.reshape(*x.shape[:-1], cfg.hidden_size))
        return out, (probs if output_attentions else None, KVCache(k, v))
