"""The model contract: what ``train/`` and ``eval/`` may know about an architecture, in one place.

Every architecture is one :class:`Architecture` entry in :data:`ARCHITECTURES` (its Linen class, Hugging Face
names, config translation and the partition rules of its own layers). Code outside ``models/`` reaches a
model only through the functions below, never through parameter names::

    word_embeddings(params)        W [vocab_size, embedding_size], the input (= tied output) embedding matrix
    uses_token_types(config)       whether the model takes token_type_ids (False: pass None)
    token_types(config, ids)       the token_type_ids to pass: ``ids`` or None
    has_pooler(module)             whether ``pooler_output`` is computed
    partition_rules(config)        (regex, PartitionSpec) for every parameter of the encoder
    TRANSFORM                      params key of the last-layer transform (SoftDecay's theta lives below it)
    config_from_hf / config_to_hf  config.json <-> EncoderConfig
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax.numpy as jnp
from jax.sharding import PartitionSpec

from isojax.models import albert, bert, distilbert, mpnet, roberta
from isojax.models.checkpoint import HFNames
from isojax.models.config import EncoderConfig
from isojax.models.layers import PARTITION_RULES, TRANSFORM, WORD_EMBEDDINGS, EncoderModel

PartitionRules = tuple[tuple[str, PartitionSpec], ...]


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One architecture: its Linen class, Hugging Face parameter names, ``config.json`` translation
    (``config_from_hf(dict) -> EncoderConfig``, ``config_to_hf(EncoderConfig) -> dict`` for a config made in
    code), and the partition rules of the layers it adds to the shared ones (:data:`layers.PARTITION_RULES`)."""

    module_cls: type[EncoderModel]
    hf_names: HFNames
    config_from_hf: Callable[[Mapping[str, Any]], EncoderConfig]
    config_to_hf: Callable[[EncoderConfig], dict]
    partition_rules: PartitionRules = ()


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(bert.BertModel, bert.BERT_HF_NAMES, bert.config_from_hf, bert.config_to_hf),
    "roberta": Architecture(roberta.RobertaModel, roberta.ROBERTA_HF_NAMES, roberta.config_from_hf,
                            roberta.config_to_hf),
    "albert": Architecture(albert.AlbertModel, albert.ALBERT_HF_NAMES, albert.config_from_hf, albert.config_to_hf),
    "distilbert": Architecture(distilbert.DistilBertModel, distilbert.DISTILBERT_HF_NAMES,
                               distilbert.config_from_hf, distilbert.config_to_hf),
    "mpnet": Architecture(mpnet.MPNetModel, mpnet.MPNET_HF_NAMES, mpnet.config_from_hf, mpnet.config_to_hf,
                          mpnet.MPNET_PARTITION_RULES),
}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)


def architecture(model_type: str) -> Architecture:
    """The :class:`Architecture` of ``model_type``; ``ValueError`` naming the supported ones otherwise."""
    if model_type not in ARCHITECTURES:
        raise ValueError(f"unknown model_type {model_type!r}; isojax supports {', '.join(SUPPORTED_MODEL_TYPES)}")
    return ARCHITECTURES[model_type]


def config_from_hf(hf: Mapping[str, Any]) -> EncoderConfig:
    """Read a Hugging Face ``config.json`` dictionary (``ValueError`` for an unknown ``model_type``, a missing
    size, or a feature isojax does not implement)."""
    return architecture(hf.get("model_type")).config_from_hf(dict(hf))


def config_to_hf(config: EncoderConfig) -> dict:
    """The ``config.json`` dictionary: the original one when the config was read from one, else built."""
    if config.hf_config is not None:
        return dict(config.hf_config)
    return architecture(config.model_type).config_to_hf(config)


def build_encoder(config: EncoderConfig, *, dtype: Any = jnp.float32, last_layer_transform=None,
                  add_pooling_layer: bool = True, transform_placement: str = "output") -> EncoderModel:
    """The Linen encoder for ``config.model_type`` (``dtype`` = compute dtype; params are float32;
    ``transform_placement``: where ``last_layer_transform`` acts, see :class:`~isojax.models.layers.EncoderModel`)."""
    return architecture(config.model_type).module_cls(
        config, dtype=dtype, last_layer_transform=last_layer_transform, add_pooling_layer=add_pooling_layer,
        transform_placement=transform_placement)


def word_embeddings(params):
    """The word (input = tied output) embedding matrix ``[vocab_size, embedding_size]`` of an encoder's params."""
    for key in WORD_EMBEDDINGS:
        params = params[key]
    return params


def uses_token_types(config: EncoderConfig) -> bool:
    """Whether the model has token-type (segment) embeddings; without them ``token_type_ids`` must be None."""
    return config.type_vocab_size > 0


def token_types(config: EncoderConfig, token_type_ids):
    """``token_type_ids`` for a model that uses them, else None (DistilBERT, MPNet)."""
    return token_type_ids if uses_token_types(config) else None


def has_pooler(module: EncoderModel) -> bool:
    """Whether ``module`` computes ``pooler_output`` (its architecture has a pooler and it was built with it)."""
    return bool(module.has_pooler and module.add_pooling_layer)


def partition_rules(config: EncoderConfig) -> PartitionRules:
    """``(regex, PartitionSpec)`` pairs that cover every parameter of the encoder of ``config`` (the shared
    layers' and the architecture's own); see :mod:`isojax.train.parallel` for how they are applied."""
    return PARTITION_RULES + architecture(config.model_type).partition_rules


__all__ = ["ARCHITECTURES", "SUPPORTED_MODEL_TYPES", "TRANSFORM", "Architecture", "architecture", "build_encoder",
           "config_from_hf", "config_to_hf", "has_pooler", "partition_rules", "token_types", "uses_token_types",
           "word_embeddings"]
