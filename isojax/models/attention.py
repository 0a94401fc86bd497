"""Multi-head scaled dot-product attention, and what every block of a stack attends with."""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from isojax.models.cache import KVCache
from isojax.models.config import TransformerConfig
from isojax.models.dropout import Dropout, apply_keep_mask
from isojax.models.primitives import dense, layer_norm
from isojax.models.rope import apply_rotary

Array = jax.Array

CPU_BLOCK_BYTES = 3 * 2**20
"""The float32 scores of one block of texts on CPU: about what a core's caches hold (docs/design/cpu-attention.md)."""


def softmax_weights(q: Array, k: Array, allowed: Array, bias: Array | None, scale_base: float) -> Array:
    """``softmax(q kᵀ / sqrt(scale_base) + bias, masked by allowed)`` in float32: ``q [..., L, heads, head_dim]``,
    ``k [..., S, kv_heads, head_dim]`` (key head j serves query heads ``[j g, (j + 1) g)``, ``g = heads /
    kv_heads``), ``allowed`` and ``bias`` broadcastable to ``[..., heads, L, S]``; returns ``[..., heads, L, S]``."""
    qh, kh = q.swapaxes(-3, -2), k.swapaxes(-3, -2)  # heads ahead of positions: no copies inside the products
    if kh.shape[-3] != qh.shape[-3]:
        kh = jnp.repeat(kh, qh.shape[-3] // kh.shape[-3], axis=-3)
    scores = jnp.matmul(qh, kh.swapaxes(-1, -2)).astype(jnp.float32) / np.sqrt(scale_base)
    if bias is not None:
        scores = scores + bias
    return jax.nn.softmax(jnp.where(allowed, scores, jnp.finfo(jnp.float32).min), axis=-1)


def weighted_values(probs: Array, v: Array) -> Array:
    """``probs v``: ``probs [..., heads, L, S]``, ``v [..., S, kv_heads, head_dim]`` -> ``[..., L, heads, head_dim]``."""
    vh = v.swapaxes(-3, -2)
    if vh.shape[-3] != probs.shape[-3]:
        vh = jnp.repeat(vh, probs.shape[-3] // vh.shape[-3], axis=-3)
    return jnp.matmul(probs.astype(vh.dtype), vh).swapaxes(-3, -2)


def softmax_attention(q, k, v, allowed, bias, keep=None, *, scale_base: float, rate=0.0, with_probs=False, dtype=None):
    """``(context [..., L, heads, head_dim], probs [..., heads, L, S] or None)``: the weights of
    :func:`softmax_weights` (cast to ``dtype``), dropped where ``keep`` (bool ``[..., heads, L, S]`` or None) is false
    (inverted dropout at ``rate``, :func:`~isojax.models.dropout.apply_keep_mask`), times the values; ``probs`` are
    the weights before dropout, when ``with_probs``."""
    probs = softmax_weights(q, k, allowed, bias, scale_base).astype(dtype or q.dtype)
    return weighted_values(apply_keep_mask(probs, keep, rate), v), (probs if with_probs else None)


def blocked_attention(q, k, v, allowed, bias, keep=None, **options) -> tuple[Array, Array | None]:
    """:func:`softmax_attention` in steps over blocks of texts (``jax.lax.map``): the same values as one batched
    softmax, but each step's float32 scores stay in cache (MiniLM, 64 x 128 tokens: 87 -> 30 ms a layer on 2 cores).

    The batch ``[B, ...]`` is read as ``[g, steps, b, ...]`` with ``g = gcd(B, devices)``: a step takes ``b``
    consecutive texts from each of the ``g`` parts a mesh may shard the batch into, so sharded steps stay local;
    ``b`` is the largest divisor of ``B / g`` with the scores of ``g b`` texts in :data:`CPU_BLOCK_BYTES` (or 1). ``allowed``,
    ``bias`` and the dropout mask ``keep`` (drawn for the whole batch) with a batch axis of ``B`` are split alike;
    with a batch axis of one they are shared by every step. Without ``with_probs`` the gradient is taken block by
    block as well (:func:`_mapped_attention`)."""
    batch, length, heads = q.shape[:3]
    groups = math.gcd(batch, jax.device_count())
    local = batch // groups
    block = max(1, min(local, CPU_BLOCK_BYTES // (groups * heads * length * k.shape[1] * 4)))
    while local % block:
        block -= 1
    if block == local:
        return softmax_attention(q, k, v, allowed, bias, keep, **options)
    steps = local // block
    per_text = {"allowed": allowed, "bias": bias, "keep": keep}
    split = {n: t for n, t in per_text.items() if t is not None and t.ndim == 4 and t.shape[0] == batch}
    shared = {n: t for n, t in per_text.items() if n not in split}

    def to_steps(t):  # [B, ...] -> [steps, g b, ...]
        t = t.reshape(groups, steps, block, *t.shape[1:]).swapaxes(0, 1)
        return t.reshape(steps, groups * block, *t.shape[3:])

    def from_steps(t):  # [steps, g b, ...] -> [B, ...]
        t = t.reshape(steps, groups, block, *t.shape[2:]).swapaxes(0, 1)
        return t.reshape(batch, *t.shape[3:])

    if not options.get("with_probs"):
        k, v = (jnp.repeat(t, heads // t.shape[2], axis=2) for t in (k, v))
        masks = {n: to_steps(t) if n in split else t for n, t in per_text.items()}
        settings = (options["scale_base"], options.get("rate", 0.0), options.get("dtype"), tuple(sorted(split)))
        out = _mapped_attention(
            settings, to_steps(q), to_steps(k), to_steps(v), masks["bias"], masks["allowed"], masks["keep"]
        )
        return from_steps(out), None

    def step(xs):
        q, k, v, masks = xs
        return softmax_attention(q, k, v, **shared, **masks, **options)

    out = jax.lax.map(step, jax.tree.map(to_steps, (q, k, v, split)))
    return jax.tree.map(from_steps, out)


def _block_masks(xs: dict, split: tuple[str, ...], shared: dict) -> dict:
    return {n: xs[n] if n in split else shared[n] for n in ("allowed", "bias", "keep")}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mapped_attention(settings, q, k, v, bias, allowed, keep) -> Array:
    """``[steps, b, L, heads, head_dim]``: :func:`softmax_attention` of each step's block (``settings``: scale base,
    dropout rate, dtype, the names of the masks split by step, the others shared), with a backward pass that
    recomputes each block's weights from q and k and takes its gradients in the same step::

        dV = P_dᵀ dO,  dP = (dO Vᵀ) ⊙ keep / (1 - rate),  dS = P ⊙ (dP - rowsum(dP ⊙ P)),  dQ = dS K / √s,  dK = dSᵀ Q / √s

    so no ``[B, heads, L, S]`` array goes to memory (the keep mask aside)."""
    return _mapped_forward(settings, q, k, v, bias, allowed, keep)[0]


def _mapped_forward(settings, q, k, v, bias, allowed, keep):
    scale_base, rate, dtype, split = settings
    shared = {"allowed": allowed, "bias": bias, "keep": keep}

    def step(xs):
        q, k, v, masks = xs
        return softmax_attention(
            q, k, v, **_block_masks(masks, split, shared), scale_base=scale_base, rate=rate, dtype=dtype
        )[0]

    out = jax.lax.map(step, (q, k, v, {n: shared[n] for n in split}))
    return out, (q, k, v, bias, allowed, keep)


def _mapped_backward(settings, residuals, d_out):
    scale_base, rate, dtype, split = settings
    q, k, v, bias, allowed, keep = residuals
    shared = {"allowed": allowed, "bias": bias, "keep": keep}

    def step(xs):
        q, k, v, d_out, masks = xs
        m = _block_masks(masks, split, shared)
        probs = softmax_weights(q, k, m["allowed"], m["bias"], scale_base)  # [b, heads, L, S] float32
        qh, kh, vh, dh = (t.swapaxes(-3, -2) for t in (q, k, v, d_out))  # heads ahead of positions
        dropped = apply_keep_mask(probs.astype(dtype or q.dtype), m["keep"], rate)
        d_v = jnp.matmul(dropped.swapaxes(-1, -2).astype(vh.dtype), dh)
        d_probs = apply_keep_mask(jnp.matmul(dh, vh.swapaxes(-1, -2)), m["keep"], rate).astype(jnp.float32)
        d_scores = probs * (d_probs - jnp.sum(d_probs * probs, axis=-1, keepdims=True))
        d_scores = jnp.where(m["allowed"], d_scores, 0.0)
        d_bias = None if m["bias"] is None else _sum_to(d_scores, m["bias"].shape)
        d_scaled = (d_scores / np.sqrt(scale_base)).astype(qh.dtype)
        d_q, d_k = jnp.matmul(d_scaled, kh), jnp.matmul(d_scaled.swapaxes(-1, -2), qh)
        return (*(t.swapaxes(-3, -2) for t in (d_q, d_k, d_v)), d_bias)

    d_q, d_k, d_v, d_bias = jax.lax.map(step, (q, k, v, d_out, {n: shared[n] for n in split}))
    if bias is not None and "bias" not in split:
        d_bias = jnp.sum(d_bias, axis=0)
    return d_q, d_k, d_v, (None if bias is None else d_bias.astype(bias.dtype)), None, None


def _sum_to(x: Array, shape: tuple[int, ...]) -> Array:
    """``x`` summed over the leading axes and the axes where ``shape`` is 1 (the transpose of a broadcast)."""
    x = jnp.sum(x, axis=tuple(range(x.ndim - len(shape))))
    return jnp.sum(x, axis=tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1), keepdims=True)


_mapped_attention.defvjp(_mapped_forward, _mapped_backward)


def fused_attention(q, k, v, allowed, bias, keep=None, *, scale_base: float, **_) -> tuple[Array, None]:
    """``jax.nn.dot_product_attention`` (cuDNN's fused kernel on GPUs where it applies): no probabilities, no
    dropout (``keep`` must be None)."""
    assert keep is None
    bias = None if bias is None else bias.astype(q.dtype)
    k, v = k.astype(q.dtype), v.astype(q.dtype)
    scale = float(1 / np.sqrt(scale_base))
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=allowed, scale=scale), None


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
    On CPU :func:`blocked_attention`; elsewhere :func:`softmax_attention` when the probabilities are asked for or
    attention dropout is active, :func:`fused_attention` otherwise.
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
        rate = cfg.attention_probs_dropout_prob
        needs_probs = output_attentions or (not deterministic and rate > 0)
        keep = None
        if needs_probs:  # the mask of the whole [B, heads, L, S], drawn as by flax's Dropout
            keep = Dropout(rate).keep_mask((*q.shape[:-3], heads, q.shape[-3], k.shape[-3]), deterministic)
        options = dict(scale_base=scale_base, rate=rate, with_probs=output_attentions, dtype=self.dtype)
        context, probs = jax.lax.platform_dependent(
            q,
            k,
            v,
            allowed,
            bias,
            keep,
            cpu=functools.partial(blocked_attention, **options),
            default=functools.partial(softmax_attention if needs_probs else fused_attention, **options),
        )
        out = dense(cfg.hidden_size, cfg, self.dtype, "output", use_bias=cfg.attention_output_bias)(
            context.reshape(*x.shape[:-1], heads * head_dim)
        )
        return out, (probs, KVCache(k, v))
