"""RoBERTa (Liu et al. 2019): BERT's layout; positions count from ``pad_token_id + 1`` and skip padding."""

import dataclasses

import jax.numpy as jnp

from isojax.models.bert import BERT_HF_NAMES
from isojax.models.config import TransformerConfig, bert_style_fields, bert_style_hf, check_absolute_positions
from isojax.models.embeddings import Embeddings
from isojax.models.encoder import EncoderModel
from isojax.models.heads import MLMHeadNames


class RobertaEmbeddings(Embeddings):
    """Embeddings whose position ids are ``cumsum(ids != pad) * (ids != pad) + pad`` (fairseq's ``make_positions``)."""

    def position_ids(self, input_ids):
        pad = self.config.pad_token_id
        real = (input_ids != pad).astype(jnp.int32)
        return jnp.cumsum(real, axis=1) * real + pad


class RobertaModel(EncoderModel):
    """RoBERTa encoder with pooler; see :class:`isojax.models.encoder.EncoderModel` for inputs and outputs.

    Attributes:
      config: the model's :class:`~isojax.models.config.TransformerConfig` (``model_type="roberta"``).

    The other fields (``dtype``, ``last_layer_transform``, ``add_pooling_layer``, ``transform_placement``,
    ``scan_layers``, ``remat``) are those of :class:`~isojax.models.encoder.EncoderModel`.
    """

    embeddings_cls = RobertaEmbeddings


def config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of a RoBERTa ``config.json`` (positions start after ``pad_token_id``)."""
    check_absolute_positions(hf)
    fields = bert_style_fields(hf, pad_token_id=1)
    return TransformerConfig(**fields, position_offset=fields["pad_token_id"] + 1)


def config_to_hf(config: TransformerConfig) -> dict:
    return bert_style_hf(config, "RobertaModel")


ROBERTA_HF_NAMES = dataclasses.replace(BERT_HF_NAMES, prefix="roberta")

ROBERTA_MLM_HEAD = MLMHeadNames(
    dense="lm_head.dense", norm="lm_head.layer_norm", bias="lm_head.bias", decoder="lm_head.decoder", activation="gelu"
)
