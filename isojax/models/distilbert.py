"""DistilBERT (Sanh et al. 2019): no token types, no pooler, its own parameter names."""
from isojax.models.checkpoint import HFNames
from isojax.models.config import EncoderConfig
from isojax.models.layers import EncoderModel


class DistilBertModel(EncoderModel):
    """DistilBERT encoder (``token_type_ids`` must be None; ``pooler_output`` is None)."""

    has_pooler = False


# DistilBERT's config.json name -> EncoderConfig field
_NAMES = {"vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_hidden_layers",
          "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size", "activation": "hidden_act",
          "dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
          "max_position_embeddings": "max_position_embeddings", "pad_token_id": "pad_token_id",
          "initializer_range": "initializer_range", "sinusoidal_pos_embds": "sinusoidal_pos_embds"}
_REQUIRED = ("vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "max_position_embeddings")


def config_from_hf(hf) -> EncoderConfig:
    """:class:`EncoderConfig` of a DistilBERT ``config.json`` (its own names; no token types; no dropout after
    the attention output projection)."""
    missing = [k for k in _REQUIRED if k not in hf]
    if missing:
        raise ValueError(f"config.json of model_type 'distilbert' has no {missing}")
    fields = {field: hf[name] for name, field in _NAMES.items() if name in hf}
    return EncoderConfig(model_type="distilbert", **fields, type_vocab_size=0, attention_output_dropout=False,
                         hf_config=dict(hf))


def config_to_hf(config: EncoderConfig) -> dict:
    return dict({name: getattr(config, field) for name, field in _NAMES.items()}, model_type="distilbert",
                architectures=["DistilBertModel"])


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
