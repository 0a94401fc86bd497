"""Flax (Linen) BERT-family encoders that load and save Hugging Face checkpoints, and the model contract
(:mod:`isojax.models.registry`) through which the rest of isojax uses them."""
from isojax.models.albert import AlbertModel
from isojax.models.bert import BertModel
from isojax.models.config import EncoderConfig
from isojax.models.distilbert import DistilBertModel
from isojax.models.hub import DEFAULT_MODEL, from_pretrained, resolve, save_pretrained
from isojax.models.layers import EncoderModel, EncoderOutput
from isojax.models.mpnet import MPNetModel
from isojax.models.registry import (ARCHITECTURES, SUPPORTED_MODEL_TYPES, TRANSFORM, architecture, build_encoder,
                                    config_from_hf, config_to_hf, has_pooler, partition_rules, token_types,
                                    uses_token_types, word_embeddings)
from isojax.models.roberta import RobertaModel

__all__ = [
    "ARCHITECTURES", "DEFAULT_MODEL", "SUPPORTED_MODEL_TYPES", "TRANSFORM", "AlbertModel", "BertModel",
    "DistilBertModel", "EncoderConfig", "EncoderModel", "EncoderOutput", "MPNetModel", "RobertaModel",
    "architecture", "build_encoder", "config_from_hf", "config_to_hf", "from_pretrained", "has_pooler",
    "partition_rules", "resolve", "save_pretrained", "token_types", "uses_token_types", "word_embeddings",
]
