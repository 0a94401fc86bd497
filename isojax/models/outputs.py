"""What the models return: an encoder's, a decoder's and an encoder-decoder's outputs (explicit pytrees)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax

Array = jax.Array


@flax.struct.dataclass
class EncoderOutput:
    """What an encoder returns.

    Attributes:
      last_hidden_state: ``[B, L, H]`` output of the last layer (after the optional last-layer transform; after
        the final LayerNorm in a pre-LN stack).
      hidden_states: arrays ``[B, L, H]``: the embedding output, then the output of every block that ran
        (``num_hidden_layers + 1`` of them; ALBERT with ``inner_group_num > 1`` records each inner block, as
        Hugging Face does).
      attentions: per layer ``[B, heads, L, L]`` attention probabilities, or None unless asked for.
      pooler_output: ``[B, H]`` = tanh(W h_[CLS] + b) where the architecture has a pooler, else None.
    """

    last_hidden_state: Array
    hidden_states: tuple[Array, ...]
    attentions: tuple[Array, ...] | None = None
    pooler_output: Array | None = None


@flax.struct.dataclass
class DecoderOutput:
    """What a decoder returns (GPT-2; the decoder of BART / mBART).

    Attributes:
      logits: ``[B, L, vocab_size]`` float32 next-token scores: the LM head tied to the word embeddings
        (``isojax.models.embeddings.tied_logits``), plus BART's ``final_logits_bias``.
      last_hidden_state: as in :class:`EncoderOutput`, over the ``L`` new tokens.
      hidden_states: as in :class:`EncoderOutput`, over the ``L`` new tokens.
      attentions: as in :class:`EncoderOutput`; with a cache the attention probabilities run over its ``T`` slots.
      cross_attentions: per layer ``[B, heads, L, S]`` attention probabilities over the encoder output
        (encoder-decoder, when asked for), else None.
      cache: the updated :class:`Cache` when one was given, else None.
    """

    logits: Array
    last_hidden_state: Array
    hidden_states: tuple[Array, ...]
    attentions: tuple[Array, ...] | None = None
    cross_attentions: tuple[Array, ...] | None = None
    cache: Any = None


@flax.struct.dataclass
class Seq2SeqOutput:
    """What an encoder-decoder returns.

    Attributes:
      encoder: the encoder's :class:`EncoderOutput` over the ``S`` source tokens.
      decoder: the decoder's :class:`DecoderOutput` over the ``L`` target tokens (``logits [B, L, vocab_size]``).
    """

    encoder: EncoderOutput
    decoder: DecoderOutput

    @property
    def logits(self) -> Array:
        """The decoder's ``[B, L, vocab_size]`` logits."""
        return self.decoder.logits
