"""``model_type`` -> architecture (Linen class and Hugging Face names), and :func:`build_encoder`."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from isojax.models.albert import ALBERT_HF_NAMES, AlbertModel
from isojax.models.bert import BERT_HF_NAMES, BertModel
from isojax.models.checkpoint import HFNames
from isojax.models.config import EncoderConfig
from isojax.models.distilbert import DISTILBERT_HF_NAMES, DistilBertModel
from isojax.models.layers import EncoderModel
from isojax.models.roberta import ROBERTA_HF_NAMES, RobertaModel


@dataclasses.dataclass(frozen=True)
class Architecture:
    module_cls: type[EncoderModel]
    hf_names: HFNames


ARCHITECTURES = {
    "bert": Architecture(BertModel, BERT_HF_NAMES),
    "roberta": Architecture(RobertaModel, ROBERTA_HF_NAMES),
    "albert": Architecture(AlbertModel, ALBERT_HF_NAMES),
    "distilbert": Architecture(DistilBertModel, DISTILBERT_HF_NAMES),
}


def build_encoder(config: EncoderConfig, *, dtype: Any = jnp.float32, last_layer_transform=None,
                  add_pooling_layer: bool = True) -> EncoderModel:
    """The Linen encoder for ``config.model_type`` (``dtype`` = compute dtype; params are float32)."""
    return ARCHITECTURES[config.model_type].module_cls(
        config, dtype=dtype, last_layer_transform=last_layer_transform, add_pooling_layer=add_pooling_layer)
