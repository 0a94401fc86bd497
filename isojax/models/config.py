"""One configuration for every BERT-family encoder, under BERT's names.

Each architecture names the same quantities differently in its Hugging Face ``config.json`` (DistilBERT's
``dim``/``n_layers``, ALBERT's ``embedding_size``); the translation lives in the architecture's own file
(``config_from_hf`` / ``config_to_hf``, reached through :mod:`isojax.models.registry`). :class:`EncoderConfig`
holds the quantities under BERT's names plus the few switches that say where the architectures really differ.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")

# BERT's config.json names of the fields every BERT-style config carries, with BERT's defaults
_BERT_FIELDS = {
    "vocab_size": None, "hidden_size": None, "num_hidden_layers": None, "num_attention_heads": None,
    "intermediate_size": None, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
    "layer_norm_eps": 1e-12, "pad_token_id": 0, "initializer_range": 0.02,
}


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Hyper-parameters of a BERT-family encoder, under BERT's names.

    Attributes beyond Hugging Face's:
      embedding_size: width of the token embeddings (ALBERT factorises them; elsewhere = hidden_size).
      num_hidden_groups, inner_group_num: ALBERT's parameter sharing (layer i uses group
        ``i * num_hidden_groups // num_hidden_layers``; each group holds ``inner_group_num`` blocks).
      embedding_projection: whether a dense layer maps the embeddings to hidden_size (ALBERT).
      attention_output_dropout, ffn_output_dropout: whether dropout follows the attention output
        projection / the feed-forward output (DistilBERT omits the first, ALBERT the second).
      position_offset: index of the first position embedding a real token uses (RoBERTa and MPNet count
        positions after the padding index: ``pad_token_id + 1``), so the longest input is
        ``max_position_embeddings - position_offset``.
      relative_attention_num_buckets: rows of MPNet's relative-position bias table shared by every layer
        (0 = no relative position bias).
      hf_config: the original ``config.json`` dictionary, written back by ``save_pretrained``.
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
    pad_token_id: int = 0
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
    hf_config: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r}; expected one of {_ACTIVATIONS}")
        if self.num_hidden_layers % self.num_hidden_groups:
            raise ValueError(
                f"num_hidden_layers ({self.num_hidden_layers}) must be divisible by num_hidden_groups "
                f"({self.num_hidden_groups})"
            )
        if not 0 <= self.position_offset < self.max_position_embeddings:
            raise ValueError(f"position_offset ({self.position_offset}) must lie in [0, max_position_embeddings="
                             f"{self.max_position_embeddings})")
        if self.embedding_size is None:
            object.__setattr__(self, "embedding_size", self.hidden_size)

    @property
    def max_sequence_length(self) -> int:
        """Longest input the position embeddings cover."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def bert_base(cls, **overrides) -> "EncoderConfig":
        """BERT-base (12 layers, 768 wide, 12 heads) with random weights, for benchmarks and tests."""
        return cls(**overrides)


def bert_style_fields(hf: Mapping[str, Any], **defaults) -> dict[str, Any]:
    """The :class:`EncoderConfig` fields a config.json written under BERT's names carries.

    ``defaults`` override BERT's defaults for keys the file may omit (RoBERTa's ``pad_token_id=1``); a required
    key (sizes, vocabulary) that is missing raises ``ValueError`` naming it. ``hf_config`` keeps the file.
    """
    out = {}
    for name, default in {**_BERT_FIELDS, **defaults}.items():
        if name in hf:
            out[name] = hf[name]
        elif default is None:
            raise ValueError(f"config.json of model_type {hf.get('model_type')!r} has no {name!r}")
        else:
            out[name] = default
    return dict(out, model_type=hf["model_type"], hf_config=dict(hf))


def bert_style_hf(config: EncoderConfig, architecture: str, **extra) -> dict[str, Any]:
    """Inverse of :func:`bert_style_fields` for a config made in code: BERT's names plus ``extra``."""
    return dict({name: getattr(config, name) for name in _BERT_FIELDS}, model_type=config.model_type,
                architectures=[architecture], **extra)


def check_absolute_positions(hf: Mapping[str, Any]) -> None:
    """BERT-style configs may ask for relative position embeddings (Shaw / Huang); isojax has only absolute."""
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"position_embedding_type {kind!r} is not supported (only 'absolute')")
