"""DistilBERT (Sanh et al. 2019): no token types, no pooler, its own parameter names."""
from isojax.models.checkpoint import HFNames
from isojax.models.layers import EncoderModel


class DistilBertModel(EncoderModel):
    """DistilBERT encoder (``token_type_ids`` must be None; ``pooler_output`` is None)."""

    has_pooler = False


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
