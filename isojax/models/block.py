"""The transformer block every isojax model shares, written once.

One block, for hidden states ``x`` of shape ``[B, L, H]``. Each sublayer ``f`` (self-attention; cross-attention to
an encoder's output in a decoder; feed-forward) is wrapped post-LayerNorm (Devlin et al. 2019; BERT, BART) or
pre-LayerNorm (GPT-2, mBART; ``config.pre_norm``)::

    post-LN:  x = LayerNorm(x + Dropout(f(x)))
    pre-LN:   x = x + Dropout(f(LayerNorm(x)))        (the stack then ends with a LayerNorm, "final_norm")
    sandwich: x = x + norm'(f(norm(x)))               (Gemma; norm' is "<sublayer>_post_norm")

    self-attention   softmax(q kᵀ / sqrt(H/heads) + bias + mask) v, projected   "attention", "attention_norm"
    cross-attention  the same, keys and values from the encoder output         "cross_attention", "cross_attention_norm"
    feed-forward     W_out Dropout(act(W_in x))                                 "intermediate", "output", "output_norm"
    gated            W_out (act(W_gate x) · W_in x)      (SwiGLU / GeGLU)       "gate", "intermediate", "output"

The norm is a LayerNorm or an RMSNorm (``config.norm``); attention options (grouped-query heads, RoPE, q/k norms,
sliding windows) are those of :class:`~isojax.models.attention.Attention` and the stack's masks.

Parameter names are canonical across architectures; each architecture file maps them to its Hugging Face names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from isojax.models.activations import ACTIVATIONS
from isojax.models.attention import Attention, AttentionContext
from isojax.models.cache import LayerCache
from isojax.models.config import TransformerConfig
from isojax.models.dropout import Dropout
from isojax.models.primitives import dense, layer_norm

Array = jax.Array


class TransformerBlock(nn.Module):
    """One transformer block (see the module docstring): self-attention, cross-attention to ``context.memory``
    when ``cross_attention``, feed-forward; each sublayer post- or pre-LayerNorm by ``config.pre_norm``.

    ``output_transform(y, mask)``, when given, replaces the feed-forward sublayer's sum ``y = x + h`` by
    ``output_transform(x + h, mask) + x`` (before ``output_norm`` in a post-LN block: the SoftDecay authors'
    placement, which adds the residual a second time); it is a callable bound to the module that owns the
    transform's parameters.

    Returns ``(x [B, L, H], (self-attention probs, cross-attention probs), LayerCache or None)``.
    """

    config: TransformerConfig
    dtype: Any = jnp.float32
    cross_attention: bool = False

    @nn.compact
    def __call__(
        self,
        x: Array,
        context: AttentionContext,
        deterministic: bool = True,
        output_attentions: bool = False,
        output_transform: Callable | None = None,
        cache: LayerCache | None = None,
    ):
        cfg = self.config
        drop = Dropout(cfg.hidden_dropout_prob)

        def sublayer(x, norm_name: str, dropout: bool, f: Callable, transform: Callable | None = None):
            """Post-LN ``norm(x + Dropout(f(x)))`` or pre-LN ``x + Dropout(f(norm(x)))``; ``f`` returns (h, extra)."""
            norm = layer_norm(cfg, self.dtype, norm_name)
            h, extra = f(norm(x) if cfg.pre_norm else x)
            if cfg.sandwich_norm:
                h = layer_norm(cfg, self.dtype, norm_name.replace("_norm", "_post_norm"))(h)
            if dropout:
                h = drop(h, deterministic=deterministic)
            y = x + h
            if transform is not None:
                y = transform(y, context.mask).astype(y.dtype) + x
            return (y if cfg.pre_norm else norm(y)), extra

        attention = Attention(cfg, self.dtype, name="attention")
        x, (probs, self_kv) = sublayer(
            x,
            "attention_norm",
            cfg.attention_output_dropout,
            lambda h: attention(
                h,
                context.allowed,
                deterministic,
                output_attentions,
                context.bias,
                cache=None if cache is None else cache.attention,
                write_index=context.write_index,
                angles=context.angles,
            ),
        )
        cross_probs = cross_kv = None
        if self.cross_attention:
            if context.memory_allowed is None:
                raise ValueError("a block with cross-attention needs the encoder output: the stack got no memory")
            memory_allowed = context.memory_allowed
            cross = Attention(cfg, self.dtype, name="cross_attention")
            x, (cross_probs, cross_kv) = sublayer(
                x,
                "cross_attention_norm",
                True,
                lambda h: cross(
                    h,
                    memory_allowed,
                    deterministic,
                    output_attentions,
                    source=context.memory,
                    cache=None if cache is None else cache.cross_attention,
                ),
            )

        def feed_forward(h):
            def project(name):
                return dense(cfg.intermediate_size, cfg, self.dtype, name, use_bias=cfg.mlp_bias)(h)

            act = ACTIVATIONS[cfg.hidden_act]
            h = act(project("gate")) * project("intermediate") if cfg.gated_mlp else act(project("intermediate"))
            h = Dropout(cfg.activation_dropout)(h, deterministic=deterministic)
            return dense(cfg.hidden_size, cfg, self.dtype, "output", use_bias=cfg.mlp_bias)(h), None

        x, _ = sublayer(x, "output_norm", cfg.ffn_output_dropout, feed_forward, output_transform)
        return x, (probs, cross_probs), (None if cache is None else LayerCache(self_kv, cross_kv))
