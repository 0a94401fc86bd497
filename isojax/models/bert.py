"""BERT (Devlin et al. 2019): the shared encoder as it is, and its Hugging Face parameter names."""

from isojax.models.checkpoint import HFNames
from isojax.models.config import TransformerConfig, bert_style_fields, bert_style_hf, check_absolute_positions
from isojax.models.encoder import EncoderModel
from isojax.models.heads import MLMHeadNames


class BertModel(EncoderModel):
    """BERT encoder with pooler; see :class:`isojax.models.encoder.EncoderModel` for inputs and outputs.

    Attributes:
      config: the model's :class:`~isojax.models.config.TransformerConfig` (``model_type="bert"``).

    The other fields (``dtype``, ``last_layer_transform``, ``add_pooling_layer``, ``transform_placement``,
    ``scan_layers``, ``remat``) are those of :class:`~isojax.models.encoder.EncoderModel`.
    """


def config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of a BERT ``config.json``."""
    check_absolute_positions(hf)
    return TransformerConfig(**bert_style_fields(hf))


def config_to_hf(config: TransformerConfig) -> dict:
    return bert_style_hf(config, "BertModel")


BERT_BLOCK_NAMES = {
    "attention/query": "attention.self.query",
    "attention/key": "attention.self.key",
    "attention/value": "attention.self.value",
    "attention/output": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
    "output_norm": "output.LayerNorm",
}

BERT_HF_NAMES = HFNames(
    prefix="bert",
    rules=(
        (r"embeddings/norm", "embeddings.LayerNorm"),
        (r"embeddings/(\w+)", r"embeddings.\1"),
        (r"encoder/layer_(\d+)/(?P<block>.+)", r"encoder.layer.\1.{block}"),
        (r"pooler/dense", "pooler.dense"),
    ),
    block=BERT_BLOCK_NAMES,
)

BERT_MLM_HEAD = MLMHeadNames(
    dense="cls.predictions.transform.dense",
    norm="cls.predictions.transform.LayerNorm",
    bias="cls.predictions.bias",
    decoder="cls.predictions.decoder",
)
