"""One configuration for every isojax transformer (BERT-family encoders, GPT-2, BART, mBART, Llama, Qwen2, Qwen3,
Mistral, Gemma 3), under BERT's names.

Each architecture names the same quantities differently in its Hugging Face ``config.json`` (DistilBERT's
``dim``/``n_layers``, ALBERT's ``embedding_size``, GPT-2's ``n_embd``, BART's ``d_model``/``encoder_layers``); the
translation lives in the architecture's own file (``config_from_hf`` / ``config_to_hf``, reached through
:mod:`isojax.models.registry`). :class:`TransformerConfig` holds the quantities under BERT's names plus the few switches
that say where the architectures really differ.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

from isojax.models.activations import ACTIVATIONS
from isojax.models.rope import Rope

_LEAST = {
    "vocab_size": 1,
    "hidden_size": 1,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "intermediate_size": 1,
    "max_position_embeddings": 1,
    "type_vocab_size": 0,
    "num_hidden_groups": 1,
    "inner_group_num": 1,
    "position_offset": 0,
    "relative_attention_num_buckets": 0,
    "decoder_layers": 0,
    "decoder_attention_heads": 0,
    "decoder_ffn_dim": 0,
    "num_key_value_heads": 0,
    "head_dim": 0,
    "sliding_window": 0,
}
"""The integer fields of :class:`TransformerConfig` and the least value each may take."""

_RATES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "activation_dropout")
NORMS = ("layer_norm", "rms_norm")
"""``TransformerConfig.norm``: LayerNorm (BERT, GPT-2, BART) or RMSNorm (Llama, Qwen, Mistral, Gemma)."""
LAYER_TYPES = ("full_attention", "sliding_attention")
"""``TransformerConfig.layer_types``: each layer attends to every earlier key, or to the last ``sliding_window``."""
"""The dropout-rate fields: each in ``[0, 1)``."""

REQUIRED = object()
"""Marks a ``config.json`` key without a default: a file that lacks it is rejected."""

# BERT's config.json names of the fields every BERT-style config carries, with BERT's defaults
_BERT_FIELDS = {
    "vocab_size": REQUIRED,
    "hidden_size": REQUIRED,
    "num_hidden_layers": REQUIRED,
    "num_attention_heads": REQUIRED,
    "intermediate_size": REQUIRED,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
    "initializer_range": 0.02,
}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of a transformer (a BERT-family encoder, GPT-2, BART or mBART), under BERT's names.

    Beyond Hugging Face's attributes it has these.

    Attributes:
      embedding_size: width of the token embeddings (ALBERT factorises them; elsewhere = hidden_size).
      num_hidden_groups, inner_group_num: ALBERT's parameter sharing (layer i uses group
        ``i * num_hidden_groups // num_hidden_layers``; each group holds ``inner_group_num`` blocks).
      sinusoidal_pos_embds: DistilBERT's option: the position table starts as the fixed sinusoidal table
        (:func:`isojax.models.embeddings.sinusoidal_init`) instead of random values. It stays a trainable parameter,
        as in transformers 5 (freeze it with an optax mask); a loaded checkpoint's table replaces it either way.
      embedding_projection: whether a dense layer maps the embeddings to hidden_size (ALBERT).
      attention_output_dropout, ffn_output_dropout: whether dropout follows the attention output
        projection / the feed-forward output (DistilBERT omits the first, ALBERT the second).
      position_offset: index of the first position embedding a real token uses (RoBERTa and MPNet count
        positions after the padding index: ``pad_token_id + 1``), so the longest input is
        ``max_position_embeddings - position_offset``.
      relative_attention_num_buckets: rows of MPNet's relative-position bias table shared by every layer
        (0 = no relative position bias).
      pre_norm: pre-LayerNorm blocks, ``x + f(LayerNorm(x))`` per sublayer, and a LayerNorm ``final_norm`` at the
        end of every stack (GPT-2, mBART); False: post-LayerNorm, ``LayerNorm(x + f(x))`` (BERT, BART).
      embedding_norm: whether a LayerNorm follows the sum of the embeddings (all but GPT-2).
      scale_embedding: token embeddings are multiplied by ``sqrt(hidden_size)`` (BART's option).
      activation_dropout: dropout rate after the feed-forward activation (BART; 0 elsewhere).
      decoder_layers, decoder_attention_heads, decoder_ffn_dim: the decoder stack of an encoder-decoder
        (``decoder_layers = 0``: no separate decoder); :meth:`decoder_config` is the decoder's own config.
      bos_token_id, eos_token_id, decoder_start_token_id: special token ids (decoding; teacher forcing).
      forced_bos_token_id, forced_eos_token_id: tokens decoding forces as the first generated token (mBART's target
        language) and as the last one at ``max_length`` (BART's default ``forced_eos_token_id=2``), as
        ``config.json`` gives them to transformers' ``generate``.
      norm: one of :data:`NORMS`: ``"layer_norm"`` (with bias) or ``"rms_norm"`` ``x / sqrt(mean x² + eps) · w``
        (Llama and after; ``layer_norm_eps`` is its epsilon).
      norm_weight_offset: the norms multiply by ``(norm_weight_offset + w)`` (Gemma's RMSNorm: 1, weights stored
        around 0).
      rope: the :class:`~isojax.models.rope.Rope` applied to queries and keys, or None: a learnt absolute position
        table (BERT, GPT-2, BART).
      local_rope: the RoPE of ``sliding_attention`` layers where it differs (Gemma 3's ``rope_local_base_freq``).
      num_key_value_heads: heads of keys and values, each shared by ``num_attention_heads / num_key_value_heads``
        query heads (grouped-query attention; 1: multi-query); 0: as many as query heads.
      head_dim: width of a head (Gemma, Qwen3: may differ from ``hidden_size / num_attention_heads``); 0: that ratio.
      attention_bias, attention_output_bias, mlp_bias: whether the query/key/value, attention output and feed-forward
        projections have biases (BERT: all; Llama: none; Qwen2: query/key/value only).
      gated_mlp: the feed-forward is ``down(act(gate(x)) · up(x))`` (SwiGLU with silu, GeGLU with a gelu).
      qk_norm: each head's queries and keys go through an RMSNorm of ``head_dim`` before RoPE (Qwen3, Gemma 3).
      sandwich_norm: each sublayer's output is normalised too, ``x + norm'(f(norm(x)))`` (Gemma 2 and 3).
      sliding_window: a ``sliding_attention`` layer's query at slot ``i`` sees keys at slots ``j > i - sliding_window``.
      layer_types: per layer one of :data:`LAYER_TYPES` (None: all full attention).
      query_pre_attn_scalar: scores are scaled by ``query_pre_attn_scalar^(-1/2)`` (Gemma) instead of
        ``head_dim^(-1/2)``; None: the latter.
      tie_word_embeddings: a causal LM's output projection is the word-embedding matrix (else its own ``lm_head``).
      hf_config: the original ``config.json`` dictionary, written back by ``save_pretrained``.
    The other attributes are those of Hugging Face's ``BertConfig`` (BERT-base defaults); ``__post_init__`` raises
    ``ValueError`` naming the field of a size that is not a positive integer (counts that may be 0, such as
    ``type_vocab_size``, non-negative), a dropout rate outside ``[0, 1)``, a ``layer_norm_eps`` that is not a
    finite positive number, or the fields of an inconsistent config.

    Examples:
      RoBERTa counts positions after the padding index, so 514 position embeddings hold 512 tokens; an unset
      ``embedding_size`` is the hidden size:

      >>> config = TransformerConfig(model_type="roberta", max_position_embeddings=514, position_offset=2)
      >>> config.max_sequence_length, config.embedding_size
      (512, 768)
      >>> TransformerConfig(hidden_size=100, num_attention_heads=12)
      Traceback (most recent call last):
      ...
      ValueError: hidden_size (100) must be divisible by num_attention_heads (12)
      >>> TransformerConfig(attention_probs_dropout_prob=1.0)
      Traceback (most recent call last):
      ...
      ValueError: attention_probs_dropout_prob must be a dropout rate in [0, 1), got 1.0
    """

    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    initializer_range: float = 0.02
    embedding_size: int | None = None
    num_hidden_groups: int = 1
    inner_group_num: int = 1
    sinusoidal_pos_embds: bool = False
    embedding_projection: bool = False
    attention_output_dropout: bool = True
    ffn_output_dropout: bool = True
    position_offset: int = 0
    relative_attention_num_buckets: int = 0
    pre_norm: bool = False
    embedding_norm: bool = True
    scale_embedding: bool = False
    activation_dropout: float = 0.0
    decoder_layers: int = 0
    decoder_attention_heads: int = 0
    decoder_ffn_dim: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    decoder_start_token_id: int | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None
    norm: str = "layer_norm"
    norm_weight_offset: float = 0.0
    rope: Rope | None = None
    local_rope: Rope | None = None
    num_key_value_heads: int = 0
    head_dim: int = 0
    attention_bias: bool = True
    attention_output_bias: bool = True
    mlp_bias: bool = True
    gated_mlp: bool = False
    qk_norm: bool = False
    sandwich_norm: bool = False
    sliding_window: int = 0
    layer_types: tuple[str, ...] | None = None
    query_pre_attn_scalar: float | None = None
    tie_word_embeddings: bool = True
    hf_config: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        for name, least in _LEAST.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if self.embedding_size is not None and (
            not isinstance(self.embedding_size, numbers.Integral) or self.embedding_size < 1
        ):
            raise ValueError(f"embedding_size must be None or an integer >= 1, got {self.embedding_size!r}")
        for name in _RATES:
            if not (isinstance(getattr(self, name), numbers.Real) and 0 <= getattr(self, name) < 1):
                raise ValueError(f"{name} must be a dropout rate in [0, 1), got {getattr(self, name)!r}")
        if not (isinstance(self.layer_norm_eps, numbers.Real) and 0 < self.layer_norm_eps < float("inf")):
            raise ValueError(f"layer_norm_eps must be a finite number > 0, got {self.layer_norm_eps!r}")
        for heads in ("num_attention_heads", "decoder_attention_heads"):
            if not self.head_dim and getattr(self, heads) and self.hidden_size % getattr(self, heads):
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) must be divisible by {heads} ({getattr(self, heads)})"
                )
        if self.decoder_layers and not (self.decoder_attention_heads and self.decoder_ffn_dim):
            raise ValueError(
                f"decoder_layers={self.decoder_layers} needs decoder_attention_heads and decoder_ffn_dim "
                f"(got {self.decoder_attention_heads} and {self.decoder_ffn_dim})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r}; expected one of {tuple(ACTIVATIONS)}")
        if self.num_hidden_layers % self.num_hidden_groups:
            raise ValueError(
                f"num_hidden_layers ({self.num_hidden_layers}) must be divisible by num_hidden_groups "
                f"({self.num_hidden_groups})"
            )
        if not 0 <= self.position_offset < self.max_position_embeddings:
            raise ValueError(
                f"position_offset ({self.position_offset}) must lie in [0, max_position_embeddings="
                f"{self.max_position_embeddings})"
            )
        if self.num_attention_heads % self.key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by num_key_value_heads "
                f"({self.num_key_value_heads})"
            )
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= set(LAYER_TYPES):
                raise ValueError(
                    f"layer_types must name one of {LAYER_TYPES} for each of the {self.num_hidden_layers} layers, "
                    f"got {self.layer_types!r}"
                )
            if "sliding_attention" in self.layer_types and not self.sliding_window:
                raise ValueError("layer_types has sliding_attention layers but sliding_window is 0")
        if self.embedding_size is None:
            object.__setattr__(self, "embedding_size", self.hidden_size)

    @property
    def key_value_heads(self) -> int:
        """Heads of keys and values (``num_key_value_heads``, or ``num_attention_heads`` when that is 0)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def attention_head_dim(self) -> int:
        """Width of one attention head (``head_dim``, or ``hidden_size // num_attention_heads`` when that is 0)."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def layer_window(self, layer: int) -> int:
        """The sliding window of layer ``layer`` (0: it attends to every earlier key)."""
        if self.layer_types is None or self.layer_types[layer] == "full_attention":
            return 0
        return self.sliding_window

    @property
    def max_sequence_length(self) -> int:
        """Longest input the position embeddings cover."""
        return self.max_position_embeddings - self.position_offset

    def decoder_config(self) -> TransformerConfig:
        """The config of an encoder-decoder's decoder stack: its depth, heads and feed-forward width."""
        if not self.decoder_layers:
            raise ValueError(f"{self.model_type} has no separate decoder (decoder_layers = 0)")
        return dataclasses.replace(
            self,
            num_hidden_layers=self.decoder_layers,
            num_attention_heads=self.decoder_attention_heads,
            intermediate_size=self.decoder_ffn_dim,
        )

    @classmethod
    def bert_base(cls, **overrides) -> TransformerConfig:
        """BERT-base (12 layers, 768 wide, 12 heads) with random weights, for benchmarks and tests."""
        return cls(**overrides)


def renamed_fields(hf: Mapping[str, Any], names: Mapping[str, str], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`TransformerConfig` fields from a ``config.json`` that uses its own names.

    ``names`` maps a ``config.json`` key to its field; a key the file lacks takes ``defaults[key]`` (the default of
    the transformers config class); a :data:`REQUIRED` key that is missing raises ``ValueError`` naming it.
    ``model_type`` and ``hf_config`` (the whole file) are included.
    """
    out = {}
    for key, field in names.items():
        value = hf.get(key, defaults.get(key, REQUIRED))
        if value is REQUIRED:
            raise ValueError(f"no {key!r} (required for model_type {hf.get('model_type')!r})")
        out[field] = value
    return dict(out, model_type=hf["model_type"], hf_config=dict(hf))


def renamed_hf(config: TransformerConfig, names: Mapping[str, str], architecture: str, **extra) -> dict[str, Any]:
    """Inverse of :func:`renamed_fields` for a config made in code: the ``config.json`` keys plus ``extra``."""
    return dict(
        {key: getattr(config, field) for key, field in names.items()},
        model_type=config.model_type,
        architectures=[architecture],
        **extra,
    )


def bert_style_fields(hf: Mapping[str, Any], **defaults) -> dict[str, Any]:
    """The :class:`TransformerConfig` fields a config.json written under BERT's names carries.

    ``defaults`` override BERT's defaults for keys the file may omit (RoBERTa's ``pad_token_id=1``); a required
    key (sizes, vocabulary) that is missing raises ``ValueError`` naming it. ``hf_config`` keeps the file.
    """
    return renamed_fields(hf, {name: name for name in _BERT_FIELDS}, {**_BERT_FIELDS, **defaults})


def bert_style_hf(config: TransformerConfig, architecture: str, **extra) -> dict[str, Any]:
    """Inverse of :func:`bert_style_fields` for a config made in code: BERT's names plus ``extra``."""
    return renamed_hf(config, {name: name for name in _BERT_FIELDS}, architecture, **extra)


def check_absolute_positions(hf: Mapping[str, Any]) -> None:
    """BERT-style configs may ask for relative position embeddings (Shaw / Huang); isojax has only absolute."""
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"position_embedding_type {kind!r} is not supported (only 'absolute')")


def check_supported(hf: Mapping[str, Any], fixed: Mapping[str, Any]) -> None:
    """``fixed`` maps ``config.json`` options isojax does not implement to the one value it accepts (transformers'
    default, also when the file omits the key); any other value raises ``ValueError`` naming the option."""
    for key, value in fixed.items():
        if hf.get(key, value) != value:
            raise ValueError(f"{hf.get('model_type')} with {key}={hf[key]!r} is not supported (only {value!r})")
