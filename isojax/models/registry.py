"""The model contract: what ``train/`` and ``eval/`` may know about an architecture, in one place.

Every architecture is one :class:`Architecture` entry in :data:`ARCHITECTURES` (its kind, Linen class, Hugging Face
names, config translation and the partition rules of its own layers). Code outside ``models/`` reaches a
model only through the functions below, never through parameter names::

    model_kind(config)             "encoder" (BERT family), "causal_lm" (GPT-2, Llama, Qwen, Mistral, Gemma) or
                                   "encoder_decoder" (BART, mBART)
    require_kind(config, kinds, …) ValueError naming the model's kind where a command needs another one
    word_embeddings(params)        W [vocab_size, embedding_size], the input (= tied output) embedding matrix
    uses_token_types(config)       whether the model takes token_type_ids (False: pass None)
    token_types(config, ids)       the token_type_ids to pass: ``ids`` or None
    has_pooler(module)             whether ``pooler_output`` is computed
    partition_rules(config)        (regex, PartitionSpec) for every parameter of the model
    parameter_group(path)          the block (``layer_3``, ``decoder_layer_0``) or top-level part a parameter belongs to
    buffers(params)                keys of the params that are buffers, never trained (BART's ``final_logits_bias``)
    TRANSFORM                      params key of the last-layer transform (SoftDecay's theta lives below it)
    config_from_hf / config_to_hf  config.json <-> TransformerConfig
    build_model / build_encoder    the Linen module of a config (any kind / an encoder with its options)
    init_params(module, key)       freshly initialised params of a module
    mlm_head(config)               where the pretrained masked-LM head lives in checkpoints (encoders)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

import flax.linen as nn
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from isojax.models import albert, bart, bert, distilbert, gemma, gpt2, llama, mistral, mpnet, qwen, roberta
from isojax.models.causal_lm import CausalLM
from isojax.models.checkpoint import HFNames
from isojax.models.config import TransformerConfig
from isojax.models.embeddings import word_embeddings
from isojax.models.encoder import TRANSFORM, EncoderModel
from isojax.models.heads import MLMHeadNames
from isojax.models.partitioning import PARTITION_RULES

PartitionRules = tuple[tuple[str, PartitionSpec], ...]

KINDS = {
    "encoder": "an encoder (BERT family)",
    "causal_lm": "a causal language model (decoder only)",
    "encoder_decoder": "an encoder-decoder",
}
"""The kinds of model, and how error messages describe them."""


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One architecture of :data:`ARCHITECTURES`.

    Attributes:
      module_cls: its Linen class.
      hf_names: its Hugging Face parameter names (:class:`~isojax.models.checkpoint.HFNames`).
      config_from_hf: ``config.json`` dict -> :class:`~isojax.models.config.TransformerConfig`.
      config_to_hf: :class:`~isojax.models.config.TransformerConfig` -> ``config.json`` dict, for a config made in
        code.
      partition_rules: the partition rules of the layers it adds to the shared ones
        (:data:`~isojax.models.partitioning.PARTITION_RULES`).
      kind: a key of :data:`KINDS`.
      mlm_head: the checkpoint names of its masked-LM head (encoders), or None.
      buffers: its top-level params that are buffers in transformers (never trained there; kept as parameters
        here so that checkpoints round-trip).
    """

    module_cls: type[nn.Module]
    hf_names: HFNames
    config_from_hf: Callable[[Mapping[str, Any]], TransformerConfig]
    config_to_hf: Callable[[TransformerConfig], dict]
    partition_rules: PartitionRules = ()
    kind: str = "encoder"
    mlm_head: MLMHeadNames | None = None
    buffers: tuple[str, ...] = ()


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(
        bert.BertModel, bert.BERT_HF_NAMES, bert.config_from_hf, bert.config_to_hf, mlm_head=bert.BERT_MLM_HEAD
    ),
    "roberta": Architecture(
        roberta.RobertaModel,
        roberta.ROBERTA_HF_NAMES,
        roberta.config_from_hf,
        roberta.config_to_hf,
        mlm_head=roberta.ROBERTA_MLM_HEAD,
    ),
    "albert": Architecture(
        albert.AlbertModel,
        albert.ALBERT_HF_NAMES,
        albert.config_from_hf,
        albert.config_to_hf,
        mlm_head=albert.ALBERT_MLM_HEAD,
    ),
    "distilbert": Architecture(
        distilbert.DistilBertModel,
        distilbert.DISTILBERT_HF_NAMES,
        distilbert.config_from_hf,
        distilbert.config_to_hf,
        mlm_head=distilbert.DISTILBERT_MLM_HEAD,
    ),
    "mpnet": Architecture(
        mpnet.MPNetModel,
        mpnet.MPNET_HF_NAMES,
        mpnet.config_from_hf,
        mpnet.config_to_hf,
        mpnet.MPNET_PARTITION_RULES,
        mlm_head=mpnet.MPNET_MLM_HEAD,
    ),
    "gpt2": Architecture(CausalLM, gpt2.GPT2_HF_NAMES, gpt2.config_from_hf, gpt2.config_to_hf, kind="causal_lm"),
    "llama": Architecture(
        CausalLM,
        llama.LLAMA_HF_NAMES,
        llama.config_from_hf,
        llama.config_to_hf,
        llama.DECODER_PARTITION_RULES,
        kind="causal_lm",
    ),
    "qwen2": Architecture(
        CausalLM,
        llama.LLAMA_HF_NAMES,
        qwen.qwen2_config_from_hf,
        qwen.qwen2_config_to_hf,
        llama.DECODER_PARTITION_RULES,
        kind="causal_lm",
    ),
    "qwen3": Architecture(
        CausalLM,
        llama.LLAMA_HF_NAMES,
        qwen.qwen3_config_from_hf,
        qwen.qwen3_config_to_hf,
        llama.DECODER_PARTITION_RULES,
        kind="causal_lm",
    ),
    "mistral": Architecture(
        CausalLM,
        llama.LLAMA_HF_NAMES,
        mistral.config_from_hf,
        mistral.config_to_hf,
        llama.DECODER_PARTITION_RULES,
        kind="causal_lm",
    ),
    "gemma3_text": Architecture(
        CausalLM,
        gemma.GEMMA3_HF_NAMES,
        gemma.config_from_hf,
        gemma.config_to_hf,
        llama.DECODER_PARTITION_RULES,
        kind="causal_lm",
    ),
    "bart": Architecture(
        bart.BartModel,
        bart.BART_HF_NAMES,
        bart.config_from_hf,
        bart.config_to_hf,
        bart.BART_PARTITION_RULES,
        kind="encoder_decoder",
        buffers=bart.BART_BUFFERS,
    ),
    "mbart": Architecture(
        bart.BartModel,
        bart.BART_HF_NAMES,
        bart.config_from_hf,
        bart.config_to_hf,
        bart.BART_PARTITION_RULES,
        kind="encoder_decoder",
        buffers=bart.BART_BUFFERS,
    ),
}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)
_BUFFERS = frozenset(key for arch in ARCHITECTURES.values() for key in arch.buffers)
_BLOCK = re.compile(r"(group_\d+_)?layer_\d+")  # the block names of TransformerStack.layout and ALBERT's


def architecture(model_type: str | None) -> Architecture:
    """The :class:`Architecture` of ``model_type``; ``ValueError`` naming the supported ones otherwise.

    Args:
      model_type: a Hugging Face ``model_type`` (a key of :data:`ARCHITECTURES`), e.g. ``"bert"``.

    Returns:
      Its :class:`Architecture` entry.

    Examples:
      >>> architecture("gpt2").kind
      'causal_lm'
      >>> architecture("t5")
      Traceback (most recent call last):
      ...
      ValueError: unknown model_type 't5'; isojax supports bert, roberta, albert, distilbert, mpnet, gpt2, llama,
      qwen2, qwen3, mistral, gemma3_text, bart, mbart
    """
    if model_type is None or model_type not in ARCHITECTURES:
        raise ValueError(f"unknown model_type {model_type!r}; isojax supports {', '.join(SUPPORTED_MODEL_TYPES)}")
    return ARCHITECTURES[model_type]


def config_from_hf(hf: Mapping[str, Any]) -> TransformerConfig:
    """Read a Hugging Face ``config.json`` dictionary (``ValueError`` for an unknown ``model_type``, a missing
    size, or a feature isojax does not implement).

    Args:
      hf: the parsed ``config.json``; its ``model_type`` picks the architecture's translation.

    Returns:
      A :class:`~isojax.models.config.TransformerConfig` under BERT's names, keeping ``hf`` as ``hf_config``.

    Examples:
      DistilBERT's own names become BERT's (``dim`` is the hidden size, ``hidden_dim`` the feed-forward width), and
      DistilBERT has no segment embeddings:

      >>> config = config_from_hf({"model_type": "distilbert", "vocab_size": 100, "dim": 32, "n_layers": 2,
      ...                          "n_heads": 4, "hidden_dim": 64, "max_position_embeddings": 64})
      >>> config.hidden_size, config.num_hidden_layers, config.intermediate_size, config.type_vocab_size
      (32, 2, 64, 0)
    """
    return architecture(hf.get("model_type")).config_from_hf(dict(hf))


def config_to_hf(config: TransformerConfig) -> dict:
    """The ``config.json`` dictionary: the original one when the config was read from one, else built.

    Args:
      config: the model's config.

    Returns:
      A JSON-serialisable dict with ``model_type`` and ``architectures`` that transformers' ``AutoConfig`` reads.

    Examples:
      >>> from isojax.models import TransformerConfig
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> hf = config_to_hf(config)
      >>> hf["model_type"], hf["architectures"], hf["hidden_size"]
      ('bert', ['BertModel'], 8)
      >>> config_from_hf(hf) == config
      True
    """
    if config.hf_config is not None:
        return dict(config.hf_config)
    return architecture(config.model_type).config_to_hf(config)


def model_kind(config: TransformerConfig) -> str:
    """``"encoder"``, ``"causal_lm"`` or ``"encoder_decoder"`` (see :data:`KINDS`).

    Args:
      config: the model's config.

    Returns:
      The kind of the architecture of ``config.model_type``.

    Examples:
      >>> from isojax.models import TransformerConfig
      >>> model_kind(TransformerConfig()), model_kind(TransformerConfig(model_type="gpt2"))
      ('encoder', 'causal_lm')
    """
    return architecture(config.model_type).kind


def require_kind(config: TransformerConfig, kinds: tuple[str, ...], purpose: str) -> None:
    """``ValueError`` naming the model and its kind when it is not one of ``kinds``.

    Args:
      config: the model's config.
      kinds: the kinds accepted (keys of :data:`KINDS`).
      purpose: what needs it, e.g. ``"isojax sts"``, named in the error.

    Returns:
      None.

    Examples:
      >>> from isojax.models import TransformerConfig
      >>> require_kind(TransformerConfig(), ("encoder",), "isojax sts")
      >>> require_kind(TransformerConfig(model_type="gpt2"), ("encoder",), "isojax sts")
      Traceback (most recent call last):
      ...
      ValueError: isojax sts needs an encoder (BERT family); this gpt2 model is a causal language model (decoder only)
    """
    kind = model_kind(config)
    if kind not in kinds:
        raise ValueError(
            f"{purpose} needs {' or '.join(KINDS[k] for k in kinds)}; this {config.model_type} model is {KINDS[kind]}"
        )


def build_model(config: TransformerConfig, *, dtype: Any = jnp.float32) -> nn.Module:
    """The Linen module for ``config.model_type`` with its default options.

    Args:
      config: the model's config (any kind).
      dtype: compute dtype; params are float32.

    Returns:
      The architecture's ``flax.linen.Module`` (unbound; :func:`init_params` gives its params).

    Examples:
      >>> from isojax.models import TransformerConfig
      >>> config = TransformerConfig(model_type="gpt2", vocab_size=10, hidden_size=8, num_hidden_layers=1,
      ...                            num_attention_heads=2, intermediate_size=16, max_position_embeddings=16)
      >>> type(build_model(config)).__name__
      'CausalLM'
    """
    return architecture(config.model_type).module_cls(config, dtype=dtype)


def build_encoder(
    config: TransformerConfig,
    *,
    dtype: Any = jnp.float32,
    last_layer_transform=None,
    add_pooling_layer: bool = True,
    transform_placement: str = "output",
    scan_layers: bool = False,
    remat: str = "none",
) -> EncoderModel:
    """The Linen encoder for ``config.model_type``; ``ValueError`` for a decoder model.

    Args:
      config: an encoder's config (BERT family).
      dtype: compute dtype; params are float32.
      last_layer_transform: optional Linen module applied to the last layer (e.g. ``SoftDecay()``).
      add_pooling_layer: whether to build the pooler (when the architecture has one).
      transform_placement: where ``last_layer_transform`` acts (``"output"`` or ``"block"``), see
        :class:`~isojax.models.encoder.EncoderModel`.
      scan_layers: run the blocks as one ``nn.scan`` loop, see :class:`~isojax.models.stack.TransformerStack`.
      remat: ``"none"``, or a key of :data:`isojax.models.stack.REMAT_POLICIES` to recompute the blocks in the
        backward pass, see :class:`~isojax.models.stack.TransformerStack`.

    Returns:
      An unbound :class:`~isojax.models.encoder.EncoderModel`; ``apply`` maps ``input_ids`` ``[B, T]`` int32 (and
      ``attention_mask`` ``[B, T]``) to an :class:`~isojax.models.outputs.EncoderOutput` with
      ``last_hidden_state`` ``[B, T, hidden_size]``.

    Examples:
      >>> from isojax.models import TransformerConfig
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> import jax, jax.numpy as jnp
      >>> module = build_encoder(config)
      >>> ids = jax.ShapeDtypeStruct((3, 5), jnp.int32)  # shapes alone (jax.eval_shape): nothing is computed
      >>> params = jax.eval_shape(lambda: init_params(module, jax.random.key(0)))
      >>> out = jax.eval_shape(module.apply, {"params": params}, ids, ids)
      >>> out.last_hidden_state.shape, out.pooler_output.shape
      ((3, 5, 8), (3, 8))
    """
    require_kind(config, ("encoder",), "build_encoder")
    # an encoder kind's module_cls is an EncoderModel (the registry's tests build each one)
    return cast(
        EncoderModel,
        architecture(config.model_type).module_cls(
            config,
            dtype=dtype,
            last_layer_transform=last_layer_transform,
            add_pooling_layer=add_pooling_layer,
            transform_placement=transform_placement,
            scan_layers=scan_layers,
            remat=remat,
        ),
    )


def init_params(module: nn.Module, key):
    """Freshly initialised params of a module :func:`build_model` or :func:`build_encoder` made (traced on a dummy
    two-token input, so ``jax.eval_shape(lambda: init_params(module, key))`` gives the shapes alone).

    Args:
      module: the unbound Linen module.
      key: a ``jax.random`` key.

    Returns:
      The ``params`` collection: a nested dict of float32 arrays.

    Examples:
      The word embeddings are ``[vocab_size, hidden_size]``, a query kernel ``[hidden_size, hidden_size]``:

      >>> from isojax.models import TransformerConfig
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> import jax
      >>> params = init_params(build_encoder(config), jax.random.key(0))
      >>> params["embeddings"]["word_embeddings"]["embedding"].shape
      (10, 8)
      >>> params["encoder"]["layer_1"]["attention"]["query"]["kernel"].shape
      (8, 8)
    """
    ids = jnp.zeros((1, 2), jnp.int32)
    args = (ids, None, ids) if model_kind(module.config) == "encoder_decoder" else (ids,)
    return module.init(key, *args)["params"]


def uses_token_types(config: TransformerConfig) -> bool:
    """Whether the model has token-type (segment) embeddings; without them ``token_type_ids`` must be None.

    Args:
      config: the model's config.

    Returns:
      ``config.type_vocab_size > 0``.

    Examples:
      >>> from isojax.models import TransformerConfig
      >>> uses_token_types(TransformerConfig()), uses_token_types(TransformerConfig(type_vocab_size=0))
      (True, False)
    """
    return config.type_vocab_size > 0


def token_types(config: TransformerConfig, token_type_ids):
    """``token_type_ids`` for a model that uses them, else None (DistilBERT, MPNet).

    Args:
      config: the model's config.
      token_type_ids: the batch's ``[B, T]`` int32 segment ids (or None).

    Returns:
      ``token_type_ids`` or None.

    Examples:
      >>> from isojax.models import TransformerConfig
      >>> token_types(TransformerConfig(), [[0, 1]]), token_types(TransformerConfig(type_vocab_size=0), [[0, 1]])
      ([[0, 1]], None)
    """
    return token_type_ids if uses_token_types(config) else None


def has_pooler(module: nn.Module) -> bool:
    """Whether ``module`` computes ``pooler_output`` (an encoder whose architecture has a pooler, built with it).

    Args:
      module: a Linen module :func:`build_model` or :func:`build_encoder` made.

    Returns:
      A bool.

    Examples:
      >>> from isojax.models import TransformerConfig
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> has_pooler(build_encoder(config)), has_pooler(build_encoder(config, add_pooling_layer=False))
      (True, False)
    """
    return model_kind(module.config) == "encoder" and bool(module.has_pooler and module.add_pooling_layer)


def mlm_head(config: TransformerConfig) -> MLMHeadNames:
    """The masked-LM head names of an encoder's architecture; ``ValueError`` for a model without one.

    Args:
      config: the model's config.

    Returns:
      Its :class:`~isojax.models.heads.MLMHeadNames`.

    Examples:
      >>> from isojax.models import TransformerConfig
      >>> mlm_head(TransformerConfig(model_type="gpt2"))
      Traceback (most recent call last):
      ...
      ValueError: a masked-LM head needs an encoder (BERT family); this gpt2 model is a causal language model (decoder only)
    """
    names = architecture(config.model_type).mlm_head
    if names is None:
        raise ValueError(
            f"a masked-LM head needs an encoder (BERT family); this {config.model_type} model is "
            f"{KINDS[model_kind(config)]}"
        )
    return names


def parameter_group(path: tuple[str, ...]) -> str:
    """The part of a model a parameter belongs to, from its ``path`` in the model's params: its block (``("encoder",
    "layer_3", ...)`` -> ``layer_3``, ALBERT's ``group_0_layer_1``; a decoder's blocks prefixed ``decoder_``:
    ``("decoder", "layer_0", ...)`` -> ``decoder_layer_0``), else its top-level module or parameter
    (``embeddings``, ``pooler``, ``last_layer_transform``, BART's ``final_logits_bias``; a stack's ``final_norm``
    and a scanned stack's blocks: the stack, ``encoder`` or ``decoder``). For per-group statistics such as
    gradient norms.

    Args:
      path: the parameter's keys in the model's params.

    Returns:
      The group's name.

    Examples:
      >>> parameter_group(("encoder", "group_0_layer_1", "attention", "query", "kernel"))
      'group_0_layer_1'
      >>> parameter_group(("decoder", "layer_0", "output", "bias")), parameter_group(("embeddings", "norm", "scale"))
      ('decoder_layer_0', 'embeddings')
    """
    index = next((i for i, key in enumerate(path) if _BLOCK.fullmatch(key)), None)
    if index is None:
        return path[0]
    return ("decoder_" if "decoder" in path[:index] else "") + path[index]


def buffers(params) -> tuple[str, ...]:
    """The keys of a model's ``params`` that hold buffers: values transformers keeps fixed (BART's
    ``final_logits_bias``), which training must leave as they are; () for a model without any.

    Args:
      params: a model's params (their top-level keys are read).

    Returns:
      A tuple of keys.

    Examples:
      >>> buffers({"shared": {}, "final_logits_bias": None}), buffers({"embeddings": {}})
      (('final_logits_bias',), ())
    """
    return tuple(key for key in params if key in _BUFFERS)


def partition_rules(config: TransformerConfig) -> PartitionRules:
    """``(regex, PartitionSpec)`` pairs that cover every parameter of the model of ``config`` (the shared
    layers' and the architecture's own); see :mod:`isojax.train.parallel` for how they are applied.

    Args:
      config: the model's config.

    Returns:
      A tuple of ``(regex, jax.sharding.PartitionSpec)`` pairs, matched against ``/``-joined parameter paths.

    Examples:
      Every parameter of a tiny BERT is matched by some rule:

      >>> from isojax.models import TransformerConfig
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> import re, jax
      >>> from flax import traverse_util
      >>> paths = traverse_util.flatten_dict(init_params(build_encoder(config), jax.random.key(0)), sep="/")
      >>> all(any(re.search(rule, path) for rule, _ in partition_rules(config)) for path in paths)
      True
    """
    return PARTITION_RULES + architecture(config.model_type).partition_rules


__all__ = [
    "ARCHITECTURES",
    "KINDS",
    "SUPPORTED_MODEL_TYPES",
    "TRANSFORM",
    "Architecture",
    "architecture",
    "buffers",
    "build_encoder",
    "build_model",
    "config_from_hf",
    "config_to_hf",
    "has_pooler",
    "init_params",
    "mlm_head",
    "model_kind",
    "parameter_group",
    "partition_rules",
    "require_kind",
    "token_types",
    "uses_token_types",
    "word_embeddings",
]
