"""An encoder model (BERT family): embeddings, a stack of blocks, an optional last-layer transform, a pooler."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from isojax.models.config import TransformerConfig
from isojax.models.embeddings import Embeddings
from isojax.models.inputs import validate_inputs
from isojax.models.outputs import EncoderOutput
from isojax.models.primitives import dense
from isojax.models.stack import TransformerStack

Array = jax.Array

TRANSFORM = "last_layer_transform"
"""Params key of the optional last-layer transform (e.g. SoftDecay's ``theta``)."""

TRANSFORM_PLACEMENTS = ("output", "block")
"""Where the last-layer transform acts: on the last layer's output, or inside the last block (see EncoderModel)."""


class Pooler(nn.Module):
    """BERT's pooler: ``tanh(W h[:, 0] + b)`` on the first ([CLS]) token, ``[B, L, H] -> [B, H]``."""

    config: TransformerConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        return jnp.tanh(dense(self.config.hidden_size, self.config, self.dtype, "dense")(x[:, 0]))


class EncoderModel(nn.Module):
    """Embeddings -> :class:`TransformerStack` -> optional last-layer transform -> optional pooler.

    Architectures subclass it and override ``embeddings_cls`` / ``stack_cls`` / ``has_pooler`` where they differ.

    ``last_layer_transform``: an optional Linen module called as ``transform(h [B, L, H], mask [B, L])``
    (e.g. :class:`isojax.SoftDecay`); its parameters appear under ``params["last_layer_transform"]``. Where it
    acts is ``transform_placement``:

    - ``"output"`` (the SoftDecay paper): on the last layer's output, ``h_L <- T(h_L)``;
    - ``"block"`` (the SoftDecay authors' code): inside the last block, on the feed-forward output plus its
      residual before the final LayerNorm, with the residual added a second time:
      ``h_L = LayerNorm(T(x + Dropout(W_out act(W_in x))) + x)`` (``x``: the block's attention output). The
      authors' code runs T without a padding mask; here T still receives the attention mask.

    Either way the transformed states are ``last_hidden_state`` and ``hidden_states[-1]``; the pooler reads them.

    ``scan_layers``, ``remat``: how the block stack runs (see :class:`TransformerStack`); a scanned model's params are
    converted from and to the checkpoint layout by :func:`to_scanned` / :func:`to_unscanned`.

    Attributes:
      config: the model's :class:`~isojax.models.config.TransformerConfig`.
      dtype: compute dtype (params are float32).
      last_layer_transform: the optional Linen module above, or None.
      add_pooling_layer: whether to build the pooler (where the architecture has one).
      transform_placement: ``"output"`` or ``"block"``, as above.
      scan_layers: run the blocks as one ``nn.scan`` loop (compile time flat in depth).
      remat: what the backward pass recomputes (see :class:`TransformerStack`); ``"none"``: nothing.

    ``__call__(input_ids, attention_mask=None, token_type_ids=None, *, deterministic=True, output_attentions=False)``
    takes input_ids ``[B, L]`` int; attention_mask ``[B, L]`` (true/1 = real token, default all); token_type_ids
    ``[B, L]`` (default zeros; must be None for DistilBERT); deterministic (False turns on dropout, which needs a
    ``"dropout"`` PRNG key in ``apply(..., rngs=...)``); output_attentions; and returns an
    :class:`~isojax.models.outputs.EncoderOutput` (``last_hidden_state [B, L, H]`` float32, ``hidden_states``,
    ``attentions``, ``pooler_output [B, H]``).
    """

    config: TransformerConfig
    dtype: Any = jnp.float32
    last_layer_transform: nn.Module | None = None
    add_pooling_layer: bool = True
    transform_placement: str = "output"
    scan_layers: bool = False
    remat: str = "none"

    embeddings_cls = Embeddings
    stack_cls = TransformerStack
    stack_name = "encoder"  # params key of the stack
    has_pooler = True

    @nn.compact
    def __call__(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        *,
        deterministic: bool = True,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        if self.transform_placement not in TRANSFORM_PLACEMENTS:
            raise ValueError(
                f"transform_placement must be one of {TRANSFORM_PLACEMENTS}, got {self.transform_placement!r}"
            )
        ids, mask, types = validate_inputs(self.config, input_ids, attention_mask, token_type_ids)
        x = self.embeddings_cls(self.config, self.dtype, name="embeddings")(ids, types, deterministic)
        in_block = self.last_layer_transform is not None and self.transform_placement == "block"
        stack = self.stack_cls(
            self.config, self.dtype, scan_layers=self.scan_layers, remat=self.remat, name=self.stack_name
        )(x, mask, deterministic, output_attentions, self.last_layer_transform if in_block else None)
        hidden = list(stack.hidden_states)
        if self.last_layer_transform is not None and not in_block:
            hidden[-1] = self.last_layer_transform(hidden[-1], mask).astype(hidden[-1].dtype)
        pooled = None
        if self.has_pooler and self.add_pooling_layer:
            pooled = Pooler(self.config, self.dtype, name="pooler")(hidden[-1])
        return EncoderOutput(hidden[-1], tuple(hidden), stack.attentions, pooled)
