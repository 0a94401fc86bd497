"""Flax (Linen) transformers that load and save Hugging Face checkpoints: BERT-family encoders, GPT-2, Llama, Qwen2,
Qwen3, Mistral, Gemma 3, BART and mBART; the model contract (:mod:`isojax.models.registry`) through which the rest of isojax uses them; greedy and beam
decoding with a key/value cache (:mod:`isojax.models.generate`)."""

from isojax.models.albert import AlbertModel
from isojax.models.bart import BartModel
from isojax.models.bert import BertModel
from isojax.models.cache import Cache, init_cache
from isojax.models.causal_lm import CausalLM
from isojax.models.config import TransformerConfig
from isojax.models.distilbert import DistilBertModel
from isojax.models.encoder import EncoderModel
from isojax.models.heads import MaskedLMHead
from isojax.models.hub import (
    DEFAULT_MODEL,
    from_pretrained,
    load_classification_head,
    load_mlm_head,
    require_tokenizer,
    resolve,
    save_pretrained,
)
from isojax.models.intermediates import capture
from isojax.models.mpnet import MPNetModel
from isojax.models.outputs import DecoderOutput, EncoderOutput, Seq2SeqOutput
from isojax.models.registry import (
    ARCHITECTURES,
    SUPPORTED_MODEL_TYPES,
    TRANSFORM,
    architecture,
    build_encoder,
    build_model,
    config_from_hf,
    config_to_hf,
    has_pooler,
    init_params,
    model_kind,
    partition_rules,
    require_kind,
    token_types,
    uses_token_types,
    word_embeddings,
)
from isojax.models.roberta import RobertaModel
from isojax.models.scan import to_scanned, to_unscanned

__all__ = [
    "ARCHITECTURES",
    "DEFAULT_MODEL",
    "SUPPORTED_MODEL_TYPES",
    "TRANSFORM",
    "AlbertModel",
    "BartModel",
    "BertModel",
    "Cache",
    "CausalLM",
    "DecoderOutput",
    "DistilBertModel",
    "EncoderModel",
    "EncoderOutput",
    "MPNetModel",
    "MaskedLMHead",
    "RobertaModel",
    "Seq2SeqOutput",
    "TransformerConfig",
    "architecture",
    "build_encoder",
    "build_model",
    "capture",
    "config_from_hf",
    "config_to_hf",
    "from_pretrained",
    "has_pooler",
    "init_cache",
    "init_params",
    "load_classification_head",
    "load_mlm_head",
    "model_kind",
    "partition_rules",
    "require_kind",
    "require_tokenizer",
    "resolve",
    "save_pretrained",
    "to_scanned",
    "to_unscanned",
    "token_types",
    "uses_token_types",
    "word_embeddings",
]
