"""One configuration for every BERT-family encoder, read from (and written back to) Hugging Face ``config.json``.

Each architecture names the same quantities differently (DistilBERT's ``dim``/``n_layers``, ALBERT's
``embedding_size``); :class:`EncoderConfig` holds them under BERT's names, plus the few switches that
say where the architectures really differ.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("bert", "roberta", "albert", "distilbert")

_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")


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
    hf_config: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unknown model_type {self.model_type!r}; isojax supports {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
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
        if self.embedding_size is None:
            object.__setattr__(self, "embedding_size", self.hidden_size)

    @property
    def max_sequence_length(self) -> int:
        """Longest input the position embeddings cover (RoBERTa's positions start after ``pad_token_id``)."""
        if self.model_type == "roberta":
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    @classmethod
    def bert_base(cls, **overrides) -> "EncoderConfig":
        """BERT-base (12 layers, 768 wide, 12 heads) with random weights, for benchmarks and tests."""
        return cls(**overrides)

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "EncoderConfig":
        """Read a Hugging Face ``config.json`` dictionary.

        Raises ``ValueError`` for an unknown ``model_type`` or a feature isojax does not implement
        (relative position embeddings).
        """
        hf = dict(hf)
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unknown model_type {model_type!r} in config.json; isojax supports "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        pos_type = hf.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise ValueError(f"position_embedding_type {pos_type!r} is not supported (only 'absolute')")
        if model_type == "distilbert":
            return cls(
                model_type=model_type,
                vocab_size=hf["vocab_size"],
                hidden_size=hf["dim"],
                num_hidden_layers=hf["n_layers"],
                num_attention_heads=hf["n_heads"],
                intermediate_size=hf["hidden_dim"],
                hidden_act=hf.get("activation", "gelu"),
                hidden_dropout_prob=hf.get("dropout", 0.1),
                attention_probs_dropout_prob=hf.get("attention_dropout", 0.1),
                max_position_embeddings=hf["max_position_embeddings"],
                type_vocab_size=0,
                layer_norm_eps=1e-12,
                pad_token_id=hf.get("pad_token_id", 0),
                initializer_range=hf.get("initializer_range", 0.02),
                sinusoidal_pos_embds=hf.get("sinusoidal_pos_embds", False),
                attention_output_dropout=False,
                hf_config=hf,
            )
        common = dict(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            intermediate_size=hf["intermediate_size"],
            hidden_act=hf.get("hidden_act", "gelu_new" if model_type == "albert" else "gelu"),
            hidden_dropout_prob=hf.get("hidden_dropout_prob", 0.1),
            attention_probs_dropout_prob=hf.get("attention_probs_dropout_prob", 0.1),
            max_position_embeddings=hf.get("max_position_embeddings", 512),
            type_vocab_size=hf.get("type_vocab_size", 2),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            pad_token_id=hf.get("pad_token_id", 1 if model_type == "roberta" else 0),
            initializer_range=hf.get("initializer_range", 0.02),
            hf_config=hf,
        )
        if model_type == "albert":
            return cls(
                **common,
                embedding_size=hf.get("embedding_size", 128),
                num_hidden_groups=hf.get("num_hidden_groups", 1),
                inner_group_num=hf.get("inner_group_num", 1),
                embedding_projection=True,
                ffn_output_dropout=False,
            )
        return cls(**common)

    def to_hf(self) -> dict[str, Any]:
        """The ``config.json`` dictionary: the original one when there is one, else built from the fields."""
        if self.hf_config is not None:
            return dict(self.hf_config)
        if self.model_type == "distilbert":
            return dict(
                model_type="distilbert", architectures=["DistilBertModel"], vocab_size=self.vocab_size,
                dim=self.hidden_size, n_layers=self.num_hidden_layers, n_heads=self.num_attention_heads,
                hidden_dim=self.intermediate_size, activation=self.hidden_act, dropout=self.hidden_dropout_prob,
                attention_dropout=self.attention_probs_dropout_prob,
                max_position_embeddings=self.max_position_embeddings, pad_token_id=self.pad_token_id,
                initializer_range=self.initializer_range, sinusoidal_pos_embds=self.sinusoidal_pos_embds,
            )
        names = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                 "type_vocab_size", "layer_norm_eps", "pad_token_id", "initializer_range")
        out = {n: getattr(self, n) for n in names}
        arch = {"bert": "BertModel", "roberta": "RobertaModel", "albert": "AlbertModel"}[self.model_type]
        out.update(model_type=self.model_type, architectures=[arch])
        if self.model_type == "albert":
            out.update(embedding_size=self.embedding_size, num_hidden_groups=self.num_hidden_groups,
                       inner_group_num=self.inner_group_num)
        return out
