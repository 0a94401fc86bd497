"""A decoder-only language model (GPT-2, Llama, Qwen2, Qwen3, Mistral, Gemma 3): embeddings, a causal stack, the LM
head.

    h_0    = embed(ids)  (+ wpe[positions] with a learnt position table; RoPE models rotate q and k instead)
    h_l    = block_l(h_{l-1})                              (causal self-attention, pre-norm)
    h_L    = T(final_norm(h_L))                            (T: an optional last-layer transform, e.g. SoftDecay)
    logits = h_L Wᵀ   (W: the word embeddings when tied, else the model's own ``lm_head``)

Positions come from the attention mask, as transformers' ``generate`` makes them: ``cumsum(mask) - 1`` over the
real tokens (0 on padding), so a left-padded prompt starts at position 0; with a cache they go on from the number of
real tokens cached. (transformers' forward without ``position_ids`` counts ``0, 1, ...`` over padding too; the two
agree on right-padded batches.)
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from isojax.models.cache import Cache
from isojax.models.config import TransformerConfig
from isojax.models.embeddings import Embeddings
from isojax.models.inputs import validate_inputs
from isojax.models.outputs import DecoderOutput
from isojax.models.primitives import dense
from isojax.models.stack import TransformerStack

LM_HEAD = "lm_head"
"""Params key of an untied output projection (``kernel [hidden_size, vocab_size]``)."""


def positions_from_mask(mask, cache: Cache | None = None):
    """Position ids of the tokens of a padded batch, as transformers' ``generate`` makes them.

    Args:
      mask: ``[B, L]`` bool or 0/1, true at real tokens (padding anywhere).
      cache: the decoding :class:`~isojax.models.cache.Cache` the tokens are appended to, or None.

    Returns:
      ``[B, L]`` int: real tokens count on from the real tokens already in ``cache`` (from 0 without one); padding
      gets 0.

    Examples:
      >>> positions_from_mask(jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])).tolist()
      [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0]]
    """
    before = 0 if cache is None else cache.mask.sum(-1, keepdims=True)
    return jnp.where(mask, before + jnp.cumsum(mask, axis=-1) - 1, 0)


class CausalLM(nn.Module):
    """A decoder-only language model with its LM head (see the module docstring).

    Attributes:
      config: the model's :class:`~isojax.models.config.TransformerConfig` (a ``causal_lm`` architecture).
      dtype: compute dtype (params are float32).
      scan_layers: run the blocks as one ``nn.scan`` loop (one block compiled, parameters stacked on a layer axis;
        :func:`~isojax.models.scan.to_scanned`); not with a cache (decoding) nor mixed ``layer_types``.
      last_layer_transform: an optional Linen module called as ``transform(h [B, L, H], mask [B, L])`` on the last
        hidden state (after the final norm, before the LM head; e.g. :class:`isojax.SoftDecay`, whose transform of a
        sentence's token matrix mixes its positions, so decoding with a cache is refused); its parameters are under
        ``params["last_layer_transform"]``.

    ``__call__`` takes input_ids ``[B, L]`` int; attention_mask ``[B, L]`` (true = real token, default all);
    token_type_ids must be None; position_ids ``[B, L]`` (default :func:`positions_from_mask`); cache (a
    :func:`~isojax.models.cache.init_cache` :class:`~isojax.models.cache.Cache` the tokens are appended to, for
    decoding); deterministic (False turns on dropout: pass a ``"dropout"`` PRNG key); output_attentions.

    It returns a :class:`~isojax.models.outputs.DecoderOutput`: ``logits [B, L, vocab_size]`` float32,
    ``hidden_states`` (embedding output, then every block's, the last one after the final norm), ``attentions``
    (``[B, heads, L, T]`` per layer when asked for), ``cache`` (updated, when given).
    """

    config: TransformerConfig
    dtype: Any = jnp.float32
    scan_layers: bool = False
    last_layer_transform: nn.Module | None = None

    stack_cls = TransformerStack
    stack_name = "decoder"  # params key of the stack

    @nn.compact
    def __call__(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        *,
        position_ids=None,
        cache=None,
        deterministic: bool = True,
        output_attentions: bool = False,
    ) -> DecoderOutput:
        cfg = self.config
        ids, mask, _ = validate_inputs(cfg, input_ids, attention_mask, token_type_ids)
        if position_ids is None:
            position_ids = positions_from_mask(mask, cache)
        embeddings = Embeddings(cfg, self.dtype, tied=cfg.tie_word_embeddings, name="embeddings")
        x = embeddings(ids, None, deterministic, position_ids=position_ids)
        stack = self.stack_cls(cfg, self.dtype, causal=True, scan_layers=self.scan_layers, name=self.stack_name)(
            x, mask, deterministic, output_attentions, cache=cache, positions=position_ids
        )
        hidden = list(stack.hidden_states)
        if self.last_layer_transform is not None:
            if cache is not None:
                raise ValueError(
                    "a last-layer transform mixes a sequence's positions; decoding with a cache is refused"
                )
            hidden[-1] = self.last_layer_transform(hidden[-1], mask).astype(hidden[-1].dtype)
        h = hidden[-1]
        if cfg.tie_word_embeddings:
            logits = embeddings.attend(h)
        else:
            head = dense(cfg.vocab_size, cfg, self.dtype, LM_HEAD, use_bias=False)
            logits = head(h).astype(jnp.float32)
        return DecoderOutput(logits, h, tuple(hidden), stack.attentions, cache=stack.cache)


__all__ = ["LM_HEAD", "CausalLM", "positions_from_mask"]
