"""Flax (Linen) BERT-family encoders that load and save Hugging Face checkpoints."""
from isojax.models.albert import AlbertModel
from isojax.models.bert import BertModel
from isojax.models.config import SUPPORTED_MODEL_TYPES, EncoderConfig
from isojax.models.distilbert import DistilBertModel
from isojax.models.hub import DEFAULT_MODEL, from_pretrained, resolve, save_pretrained
from isojax.models.layers import EncoderModel, EncoderOutput
from isojax.models.registry import ARCHITECTURES, build_encoder
from isojax.models.roberta import RobertaModel

__all__ = [
    "ARCHITECTURES", "DEFAULT_MODEL", "SUPPORTED_MODEL_TYPES", "AlbertModel", "BertModel", "DistilBertModel",
    "EncoderConfig", "EncoderModel", "EncoderOutput", "RobertaModel", "build_encoder", "from_pretrained", "resolve",
    "save_pretrained",
]
