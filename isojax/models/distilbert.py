"""DistilBERT (Sanh et al. 2019): no token types, no pooler, its own parameter names."""

from isojax.models.checkpoint import HFNames
from isojax.models.config import REQUIRED, TransformerConfig, renamed_fields, renamed_hf
from isojax.models.encoder import EncoderModel
from isojax.models.heads import MLMHeadNames


class DistilBertModel(EncoderModel):
    """DistilBERT encoder (``token_type_ids`` must be None; ``pooler_output`` is None).

    Attributes:
      config: the model's :class:`~isojax.models.config.TransformerConfig` (``model_type="distilbert"``).

    The other fields (``dtype``, ``last_layer_transform``, ``add_pooling_layer``, ``transform_placement``,
    ``scan_layers``, ``remat``) are those of :class:`~isojax.models.encoder.EncoderModel`.
    """

    has_pooler = False


# DistilBERT's config.json name -> TransformerConfig field
_NAMES = {
    "vocab_size": "vocab_size",
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "hidden_dim": "intermediate_size",
    "activation": "hidden_act",
    "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "max_position_embeddings": "max_position_embeddings",
    "pad_token_id": "pad_token_id",
    "initializer_range": "initializer_range",
    "sinusoidal_pos_embds": "sinusoidal_pos_embds",
}
# transformers' DistilBertConfig defaults; the sizes are required
_DEFAULTS = {
    "vocab_size": REQUIRED,
    "dim": REQUIRED,
    "n_layers": REQUIRED,
    "n_heads": REQUIRED,
    "hidden_dim": REQUIRED,
    "max_position_embeddings": REQUIRED,
    "activation": "gelu",
    "dropout": 0.1,
    "attention_dropout": 0.1,
    "pad_token_id": 0,
    "initializer_range": 0.02,
    "sinusoidal_pos_embds": False,
}


def config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of a DistilBERT ``config.json`` (its own names; no token types; no dropout after
    the attention output projection)."""
    return TransformerConfig(**renamed_fields(hf, _NAMES, _DEFAULTS), type_vocab_size=0, attention_output_dropout=False)


def config_to_hf(config: TransformerConfig) -> dict:
    return renamed_hf(config, _NAMES, "DistilBertModel")


DISTILBERT_HF_NAMES = HFNames(
    prefix="distilbert",
    rules=(
        (r"embeddings/norm", "embeddings.LayerNorm"),
        (r"embeddings/(\w+)", r"embeddings.\1"),
        (r"encoder/layer_(\d+)/(?P<block>.+)", r"transformer.layer.\1.{block}"),
    ),
    block={
        "attention/query": "attention.q_lin",
        "attention/key": "attention.k_lin",
        "attention/value": "attention.v_lin",
        "attention/output": "attention.out_lin",
        "attention_norm": "sa_layer_norm",
        "intermediate": "ffn.lin1",
        "output": "ffn.lin2",
        "output_norm": "output_layer_norm",
    },
)

DISTILBERT_MLM_HEAD = MLMHeadNames(
    dense="vocab_transform",
    norm="vocab_layer_norm",
    bias="vocab_projector.bias",
    decoder="vocab_projector",
    norm_eps=1e-12,
)
