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
from isojax.models.primitives import dense, layer_norm
from isojax.models.rope import apply_rotary

Array = jax.Array


class AttentionContext(NamedTuple):
    """What every block of a stack attends with, computed once per call by
    :class:`~isojax.models.stack.TransformerStack`.

    mask ``[B, L]`` (the input's real tokens; a last-layer transform reads it); allowed ``[B, 1, L, T]`` (the keys
    each query sees in self-attention); bias (additive self-attention bias or None); memory ``[B, S, H]`` and
    memory_allowed ``[B, 1, 1, S]`` (the encoder output and its real tokens, for cross-attention, or None);
    write_index (the cache slot of the first input token, or None without a cache); angles (the ``(cos, sin)`` of
    :func:`~isojax.models.rope.rotary_angles` at the input's positions, for RoPE, or None).
    """

    mask: Array
    allowed: Array
    bias: Array | None = None
    memory: Array | None = None
    memory_allowed: Array | None = None
    write_index: Array | None = None
    angles: tuple[Array, Array] | None = None


class Attention(nn.Module):
    """Multi-head scaled dot-product attention with output projection.

    ``softmax(q kᵀ · s + bias + mask) v``: queries from ``x [B, L, H]``, keys and values from ``source`` (default
    ``x``; the encoder output ``[B, S, H]`` for cross-attention). ``allowed`` (bool, broadcastable to
    ``[B, heads, L, S]``) says which keys each query sees; the optional additive ``bias`` (broadcastable to the same
    shape) is MPNet's relative position bias. Options of ``config``: ``key_value_heads`` heads of keys and values,
    each shared by ``heads / key_value_heads`` consecutive query heads (grouped-query attention); ``head_dim``;
    the biases of the projections; ``qk_norm`` (an RMSNorm of each head's queries and keys, "query_norm" /
    "key_norm"); RoPE on queries and keys when ``angles`` are given; the scale ``s = head_dim^(-1/2)`` or
    ``query_pre_attn_scalar^(-1/2)``.

    With a ``cache`` (:class:`KVCache` of ``T`` slots): given ``write_index``, the new keys and values are written
    to slots ``[write_index, write_index + L)`` and the queries attend over all ``T`` slots (decoder self-attention);
    without it, the cached keys and values are used as they are and ``source`` is not read (cross-attention after
    the first decoding step).

    Returns ``(out [B, L, H], (probs [B, heads, L, S] or None, KVCache of the keys and values attended to))``.
    The explicit softmax path (which can return the probabilities) runs when they are asked for or attention dropout
    is active; otherwise ``jax.nn.dot_product_attention`` (cuDNN's fused kernel on GPUs where it applies).
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
        angles: tuple[Array, Array] | None = None,
    ):
        cfg = self.config
        heads, kv_heads, head_dim = cfg.num_attention_heads, cfg.key_value_heads, cfg.attention_head_dim

        def project(name, t, n):  # [B, L, H] -> [B, L, n, head_dim]
            t = dense(n * head_dim, cfg, self.dtype, name, use_bias=cfg.attention_bias)(t)
            t = t.reshape(*t.shape[:-1], n, head_dim)
            if name == "value":
                return t
            if cfg.qk_norm:
                t = layer_norm(cfg, self.dtype, f"{name}_norm")(t)
            return t if angles is None else apply_rotary(t, angles)

        q = project("query", x, heads)
        if cache is not None and write_index is None:
            k, v = cache.key, cache.value
        else:
            kv_input = x if source is None else source
            k, v = project("key", kv_input, kv_heads), project("value", kv_input, kv_heads)
            if cache is not None:
                k = jax.lax.dynamic_update_slice(cache.key, k.astype(cache.key.dtype), (0, write_index, 0, 0))
                v = jax.lax.dynamic_update_slice(cache.value, v.astype(cache.value.dtype), (0, write_index, 0, 0))
        scale_base = cfg.query_pre_attn_scalar or head_dim  # scores are q kᵀ / sqrt(scale_base)
        needs_probs = output_attentions or (not deterministic and cfg.attention_probs_dropout_prob > 0)
        if needs_probs:
            # Heads moved ahead of positions before the two batched products ([B, heads, L, head_dim]): XLA's CPU
            # layouts then need no copies inside them (one layer's fwd + bwd at 32 x 128 x 384: 161 -> 144 ms).
            qh, kh, vh = (t.swapaxes(1, 2) for t in (q, k, v))
            if kv_heads != heads:  # key/value head j serves query heads [j g, (j + 1) g), g = heads / kv_heads
                kh, vh = (jnp.repeat(t, heads // kv_heads, axis=1) for t in (kh, vh))
            scores = jnp.matmul(qh, kh.swapaxes(2, 3)).astype(jnp.float32) / np.sqrt(scale_base)
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
                scale=None if cfg.query_pre_attn_scalar is None else float(1 / np.sqrt(scale_base)),
            )
        out = dense(cfg.hidden_size, cfg, self.dtype, "output", use_bias=cfg.attention_output_bias)(
            context.reshape(*x.shape[:-1], heads * head_dim)
        )
        return out, (probs if output_attentions else None, KVCache(k, v))
