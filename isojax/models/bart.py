"""BART (Lewis et al. 2020) and mBART (Liu et al. 2020): encoder-decoders, and their Hugging Face names.

    E      = the word table shared by encoder and decoder (times sqrt(d_model) when scale_embedding)
    h_0    = LayerNorm(E[ids] + P[positions + 2])            per stack ("layernorm_embedding"; dropout)
    encoder: blocks with self-attention over the real source tokens
    decoder: blocks with causal self-attention, then cross-attention to the encoder output
    logits = T(h_dec) Eᵀ + final_logits_bias                  (the LM head tied to the shared table; T the optional
                                                               ``head_transform``, e.g. a trained flow; default identity)

BART's blocks are post-LayerNorm; mBART's are pre-LayerNorm and each of its stacks ends with a LayerNorm
(``layer_norm``). Each stack has its own learned positions, offset by 2 (rows 0 and 1 of the table are unused); the
decoder's count cache slots (``index + 0, 1, ...``), as in transformers, so decoder inputs are right-padded.
``final_logits_bias`` is a buffer in transformers (zero unless a checkpoint sets it) and a parameter here.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from isojax.models.checkpoint import HFNames
from isojax.models.config import REQUIRED, TransformerConfig, check_supported, renamed_fields, renamed_hf
from isojax.models.embeddings import Embeddings, WordEmbeddings
from isojax.models.inputs import validate_inputs
from isojax.models.outputs import DecoderOutput, EncoderOutput, Seq2SeqOutput
from isojax.models.stack import TransformerStack

_POSITION_OFFSET = 2  # BartLearnedPositionalEmbedding.offset


class BartModel(nn.Module):
    """BART or mBART (``config.pre_norm``) with its tied LM head.

    ``__call__(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask)`` is the teacher-forced forward
    (``decoder_input_ids`` required: the targets shifted right behind the decoder start token; ids ``[B, S]`` and
    ``[B, L]`` int, masks of the same shapes) and returns a :class:`~isojax.models.outputs.Seq2SeqOutput` (decoder
    ``logits [B, L, vocab_size]`` float32). :meth:`encode` and :meth:`decode` are its two halves, for
    decoding with a cache (call them with ``module.apply(..., method="encode")``).

    Attributes:
      config: the model's :class:`~isojax.models.config.TransformerConfig` (``model_type`` ``"bart"`` or
        ``"mbart"``, with ``decoder_layers > 0``).
      dtype: compute dtype (params are float32).
    """

    config: TransformerConfig
    dtype: Any = jnp.float32

    def setup(self):
        cfg, dec = self.config, self.config.decoder_config()
        self.embeddings = WordEmbeddings(cfg, self.dtype)
        self.encoder_embeddings = Embeddings(cfg, self.dtype)
        self.encoder = TransformerStack(cfg, self.dtype)
        self.decoder_embeddings = Embeddings(dec, self.dtype)
        self.decoder = TransformerStack(dec, self.dtype, causal=True, cross_attention=True)
        self.final_logits_bias = self.param("final_logits_bias", nn.initializers.zeros, (1, cfg.vocab_size))

    def encode(
        self, input_ids, attention_mask=None, *, deterministic: bool = True, output_attentions: bool = False
    ) -> EncoderOutput:
        """The encoder: ``input_ids [B, S]``, ``attention_mask [B, S]`` -> :class:`EncoderOutput` (``[B, S, H]``)."""
        ids, mask, _ = validate_inputs(self.config, input_ids, attention_mask, None)
        x = self.encoder_embeddings(ids, None, deterministic, word_vectors=self.embeddings(ids))
        stack = self.encoder(x, mask, deterministic, output_attentions)
        return EncoderOutput(stack.hidden_states[-1], stack.hidden_states, stack.attentions)

    def decode(
        self,
        decoder_input_ids,
        encoder_hidden_states,
        encoder_attention_mask=None,
        decoder_attention_mask=None,
        *,
        cache=None,
        deterministic: bool = True,
        output_attentions: bool = False,
        head_transform=None,
    ) -> DecoderOutput:
        """The decoder: ``decoder_input_ids [B, L]`` attending to ``encoder_hidden_states [B, S, H]`` (real tokens
        ``encoder_attention_mask [B, S]``, default all) -> :class:`DecoderOutput` with ``logits [B, L, vocab_size]``.

        With ``cache`` (:func:`~isojax.models.cache.init_cache` of the decoder config), the tokens are appended at
        its slots and the cross-attention keys/values are computed on the first call, then reused.
        ``head_transform(h [B, L, H], mask [B, L]) -> [B, L, H]``, when given, maps the decoder's last hidden state
        before the LM head (a callable bound to the module that owns its parameters); ``last_hidden_state`` is the
        state before it.
        """
        dec = self.config.decoder_config()
        ids, mask, _ = validate_inputs(dec, decoder_input_ids, decoder_attention_mask, None, prefix="decoder_")
        if encoder_attention_mask is None:
            encoder_attention_mask = jnp.ones(encoder_hidden_states.shape[:2], bool)
        encoder_attention_mask = jnp.asarray(encoder_attention_mask).astype(bool)
        if encoder_attention_mask.shape != encoder_hidden_states.shape[:2]:
            raise ValueError(
                f"encoder_attention_mask has shape {encoder_attention_mask.shape}, the encoder output "
                f"{encoder_hidden_states.shape[:2]}"
            )
        positions = self.decoder_embeddings.position_ids(ids) + (0 if cache is None else cache.index)
        x = self.decoder_embeddings(ids, None, deterministic, position_ids=positions, word_vectors=self.embeddings(ids))
        stack = self.decoder(
            x,
            mask,
            deterministic,
            output_attentions,
            memory=encoder_hidden_states,
            memory_mask=encoder_attention_mask,
            cache=cache,
        )
        h = stack.hidden_states[-1]
        head_input = h if head_transform is None else head_transform(h, mask)
        logits = self.embeddings.attend(head_input) + self.final_logits_bias
        return DecoderOutput(logits, h, stack.hidden_states, stack.attentions, stack.cross_attentions, stack.cache)

    def __call__(
        self,
        input_ids,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        *,
        deterministic: bool = True,
        output_attentions: bool = False,
        head_transform=None,
    ) -> Seq2SeqOutput:
        if decoder_input_ids is None:
            raise ValueError(
                f"decoder_input_ids is required: {self.config.model_type} is an encoder-decoder; pass the "
                "decoder inputs (for teacher forcing, the targets shifted right behind "
                f"decoder_start_token_id={self.config.decoder_start_token_id}), or decode with "
                "isojax.models.generate"
            )
        encoder = self.encode(
            input_ids, attention_mask, deterministic=deterministic, output_attentions=output_attentions
        )
        decoder = self.decode(
            decoder_input_ids,
            encoder.last_hidden_state,
            attention_mask,
            decoder_attention_mask,
            deterministic=deterministic,
            output_attentions=output_attentions,
            head_transform=head_transform,
        )
        return Seq2SeqOutput(encoder, decoder)


# BART's config.json name -> TransformerConfig field, and transformers' BartConfig defaults (MBartConfig: no
# decoder_start_token_id)
_NAMES = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "encoder_layers": "num_hidden_layers",
    "encoder_attention_heads": "num_attention_heads",
    "encoder_ffn_dim": "intermediate_size",
    "decoder_layers": "decoder_layers",
    "decoder_attention_heads": "decoder_attention_heads",
    "decoder_ffn_dim": "decoder_ffn_dim",
    "activation_function": "hidden_act",
    "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "activation_dropout": "activation_dropout",
    "max_position_embeddings": "max_position_embeddings",
    "init_std": "initializer_range",
    "scale_embedding": "scale_embedding",
    "pad_token_id": "pad_token_id",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "decoder_start_token_id": "decoder_start_token_id",
    "forced_bos_token_id": "forced_bos_token_id",
    "forced_eos_token_id": "forced_eos_token_id",
}
_DEFAULTS = {
    "vocab_size": REQUIRED,
    "d_model": REQUIRED,
    "encoder_layers": REQUIRED,
    "encoder_attention_heads": REQUIRED,
    "encoder_ffn_dim": REQUIRED,
    "decoder_layers": REQUIRED,
    "decoder_attention_heads": REQUIRED,
    "decoder_ffn_dim": REQUIRED,
    "activation_function": "gelu",
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "max_position_embeddings": 1024,
    "init_std": 0.02,
    "scale_embedding": False,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
    "forced_bos_token_id": None,
    "forced_eos_token_id": 2,
}
_FIXED = {"encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "tie_word_embeddings": True}
_ARCHITECTURES = {"bart": "BartForConditionalGeneration", "mbart": "MBartForConditionalGeneration"}


def config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of a BART or mBART ``config.json`` (mBART: pre-LN; LayerNorm epsilon 1e-5, torch's
    default; the position tables have ``max_position_embeddings + 2`` rows)."""
    check_supported(hf, _FIXED)
    defaults = dict(_DEFAULTS, decoder_start_token_id=None) if hf["model_type"] == "mbart" else _DEFAULTS
    fields = renamed_fields(hf, _NAMES, defaults)
    fields["max_position_embeddings"] += _POSITION_OFFSET
    return TransformerConfig(
        **fields,
        type_vocab_size=0,
        layer_norm_eps=1e-5,
        position_offset=_POSITION_OFFSET,
        pre_norm=hf["model_type"] == "mbart",
    )


def config_to_hf(config: TransformerConfig) -> dict:
    out = renamed_hf(config, _NAMES, _ARCHITECTURES[config.model_type])
    out["max_position_embeddings"] -= _POSITION_OFFSET
    return out


_BLOCK_NAMES = {
    "attention/query": "self_attn.q_proj",
    "attention/key": "self_attn.k_proj",
    "attention/value": "self_attn.v_proj",
    "attention/output": "self_attn.out_proj",
    "attention_norm": "self_attn_layer_norm",
    "cross_attention/query": "encoder_attn.q_proj",
    "cross_attention/key": "encoder_attn.k_proj",
    "cross_attention/value": "encoder_attn.v_proj",
    "cross_attention/output": "encoder_attn.out_proj",
    "cross_attention_norm": "encoder_attn_layer_norm",
    "intermediate": "fc1",
    "output": "fc2",
    "output_norm": "final_layer_norm",
}

BART_HF_NAMES = HFNames(
    prefix="model",
    rules=(
        (r"embeddings/word_embeddings", "shared"),
        (r"(encoder|decoder)_embeddings/position_embeddings", r"\1.embed_positions"),
        (r"(encoder|decoder)_embeddings/norm", r"\1.layernorm_embedding"),
        (r"(encoder|decoder)/final_norm", r"\1.layer_norm"),
        (r"(encoder|decoder)/layer_(\d+)/(?P<block>.+)", r"\1.layers.\2.{block}"),
    ),
    block=_BLOCK_NAMES,
    params={"final_logits_bias": "final_logits_bias"},
    head=("final_logits_bias",),
    tied={
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
        "lm_head.weight": "shared.weight",
    },
    namespaces=("shared.", "encoder.", "decoder."),
    ignore=r"^(encoder|decoder)\.version$",
)
"""Hugging Face names of BART and mBART (the same module names; mBART adds each stack's ``layer_norm``)."""

BART_PARTITION_RULES = ((r"(^|/)final_logits_bias$", P()),)

BART_BUFFERS = ("final_logits_bias",)
"""Top-level params that are buffers in transformers (``final_logits_bias``: registered, never trained)."""
