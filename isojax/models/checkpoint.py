"""Hugging Face checkpoints <-> isojax params.

A Hugging Face state dict is a flat ``{name: array}`` with PyTorch layouts; isojax params are a nested dict with
canonical names (see :mod:`isojax.models.block`). Each architecture declares an :class:`HFNames` that maps the
module path of every parameter to its Hugging Face module name; leaves map as::

    Dense  kernel [in, out]  <->  weight [out, in] (transposed; GPT-2's Conv1D stores [in, out] as it is)
           bias              <->  bias
    LayerNorm scale          <->  weight (old checkpoints: gamma / beta)
    Embed  embedding         <->  weight

A :class:`Fused` name says that one Hugging Face weight holds several isojax kernels side by side along the output
features (GPT-2's ``c_attn`` = query | key | value): it is split on load and concatenated on save. Keys that repeat a
tied weight (``lm_head.weight`` = the word embeddings) are checked to be equal and not stored twice.

Parameters outside the encoder's Hugging Face names (e.g. a last-layer SoftDecay's alpha) are "extra": they are
kept in a separate ``isojax_extra.safetensors`` so that the main file stays loadable by transformers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Mapping

import numpy as np
from flax import traverse_util

log = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TORCH_WEIGHTS_NAME = "pytorch_model.bin"
EXTRA_WEIGHTS_NAME = "isojax_extra.safetensors"

_LEAF_TO_HF = {"kernel": "weight", "bias": "bias", "scale": "weight", "embedding": "weight"}
_BUFFERS = re.compile(r"(^|\.)(position_ids|token_type_ids)$")  # non-persistent buffers some checkpoints carry
_ENCODER_NAMESPACES = ("embeddings.", "encoder.", "transformer.", "pooler.")


@dataclasses.dataclass(frozen=True)
class Fused:
    """Part ``index`` of ``count`` equal slices, along the output features, of the Hugging Face module ``module``."""

    module: str
    index: int
    count: int


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where a parameter lives in a Hugging Face state dict: ``key``, and its slice ``index`` of ``count``."""

    key: str
    index: int = 0
    count: int = 1


@dataclasses.dataclass(frozen=True)
class HFNames:
    """How an architecture's isojax module paths are called in Hugging Face checkpoints.

    prefix: the base-model prefix of task checkpoints (``bert`` in ``bert.encoder.layer.0...``); stripped on load.
    rules: ``(regex, template)`` pairs tried in order on the ``/``-joined module path; the template may use
      ``\\1``-style groups and ``{block}``, which is replaced by ``block[<the named group 'block'>]``.
    block: canonical block-internal module path -> Hugging Face name, or a :class:`Fused` part of one.
    params: parameters named outright, ``/``-joined parameter path -> Hugging Face key (BART's
      ``final_logits_bias``, which belongs to no module).
    head: keys of the task model outside the base model (``final_logits_bias``). They are saved without ``prefix``
      while every other key is saved with it (the file is then a task-model checkpoint), and a base-model checkpoint
      that lacks them loads them as zeros, as transformers does.
    tied: Hugging Face keys that repeat a tied weight -> the key they repeat (``lm_head.weight`` -> the word
      embeddings); on load they must equal it, on save they are left out (transformers ties them again).
    transpose_kernels: False where the checkpoint stores kernels ``[in, out]`` (GPT-2's Conv1D).
    namespaces: key prefixes of the base model: an unused key under one of them is an error when loading strictly.
    ignore: regex of keys that are buffers rather than weights (GPT-2's causal-mask ``attn.bias``), never used.
    """

    prefix: str
    rules: tuple[tuple[str, str], ...]
    block: Mapping[str, str | Fused]
    params: Mapping[str, str] = dataclasses.field(default_factory=dict)
    head: tuple[str, ...] = ()
    tied: Mapping[str, str] = dataclasses.field(default_factory=dict)
    transpose_kernels: bool = True
    namespaces: tuple[str, ...] = _ENCODER_NAMESPACES
    ignore: str | None = None

    def hf_module(self, module_path: str) -> tuple[str, int, int] | None:
        """``(Hugging Face module name, slice index, slice count)`` of an isojax module path, or None."""
        for pattern, template in self.rules:
            m = re.fullmatch(pattern, module_path)
            if m:
                name = m.expand(template)
                if "block" not in m.groupdict():
                    return name, 0, 1
                inner = self.block.get(m["block"])
                if inner is None:
                    return None
                inner = inner if isinstance(inner, Fused) else Fused(inner, 0, 1)
                return name.replace("{block}", inner.module), inner.index, inner.count
        return None

    def hf_slot(self, path: tuple[str, ...]) -> Slot | None:
        """Where the parameter ``(module, ..., leaf)`` lives in a Hugging Face state dict, or None (an extra one)."""
        joined = "/".join(path)
        if joined in self.params:
            return Slot(self.params[joined])
        module = self.hf_module("/".join(path[:-1]))
        if module is None or path[-1] not in _LEAF_TO_HF:
            return None
        name, index, count = module
        return Slot(f"{name}.{_LEAF_TO_HF[path[-1]]}", index, count)

    def hf_key(self, path: tuple[str, ...]) -> str | None:
        """Hugging Face key of a parameter path ``(module, ..., leaf)``, or None for an extra parameter."""
        slot = self.hf_slot(path)
        return None if slot is None else slot.key

    def to_isojax_layout(self, path: tuple[str, ...], value: np.ndarray) -> np.ndarray:
        """A Hugging Face weight in isojax's layout: kernels ``[in, out]``."""
        return value.T if path[-1] == "kernel" and self.transpose_kernels else value


def read_state_dict(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read the weights of a Hugging Face model directory as numpy arrays.

    Tries ``model.safetensors``, a sharded ``model.safetensors.index.json``, then ``pytorch_model.bin``
    (that one needs PyTorch). Raises ``FileNotFoundError`` naming the directory and the files looked for, and a
    ``ValueError`` naming the file that is not a readable safetensors file (truncated, empty) or index.
    """
    directory = os.fspath(directory)
    single = os.path.join(directory, WEIGHTS_NAME)
    if os.path.exists(single):
        return load_safetensors(single)
    index = os.path.join(directory, WEIGHTS_INDEX_NAME)
    if os.path.exists(index):
        with open(index) as f:
            try:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{index}: not a safetensors index with a 'weight_map' object ({e!r})") from None
        state: dict[str, np.ndarray] = {}
        for shard in shards:
            state.update(load_safetensors(os.path.join(directory, shard)))
        return state
    binary = os.path.join(directory, TORCH_WEIGHTS_NAME)
    if os.path.exists(binary):
        try:
            import torch
        except ImportError as e:
            raise ImportError(f"{binary} is a PyTorch pickle; reading it needs torch (pip install torch)") from e
        tensors = torch.load(binary, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in tensors.items()}
    raise FileNotFoundError(
        f"no weights in {directory}: looked for {WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME}, {TORCH_WEIGHTS_NAME}"
    )


def load_safetensors(path: str) -> dict[str, np.ndarray]:
    """``safetensors.numpy.load_file(path)``, its errors (a truncated or empty file) as ``ValueError`` naming ``path``."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except SafetensorError as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None


def _normalise_keys(state: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """Strip the task-model prefix (``bert.``) and rename old LayerNorm ``gamma``/``beta``."""
    out = {}
    for key, value in state.items():
        if key.startswith(prefix + "."):
            key = key[len(prefix) + 1 :]
        key = re.sub(r"(LayerNorm|layer_norm|_norm)\.gamma$", r"\1.weight", key)
        key = re.sub(r"(LayerNorm|layer_norm|_norm)\.beta$", r"\1.bias", key)
        out[key] = value
    return out


def has_pooler(state: Mapping[str, np.ndarray], names: HFNames) -> bool:
    """Whether a state dict carries the pooler's weights."""
    return any(k.startswith("pooler") for k in _normalise_keys(state, names.prefix))


def params_from_state_dict(state: Mapping[str, np.ndarray], names: HFNames, template, *, extra=None, strict=True):
    """Fill a params template (shapes, e.g. from ``jax.eval_shape(model.init, ...)``) from a HF state dict.

    extra: values for the parameters that have no Hugging Face name (flat ``{"a/b/c": array}``); those not given
      are taken from ``template`` itself, which must then hold arrays rather than shapes.
    strict: raise on base-model keys the model does not use (head keys such as ``classifier.*`` are only logged).

    Raises ``ValueError`` naming every missing key, every unexpected base-model key, a key whose shape does not
    fit (with both shapes), and a tied key (``lm_head.weight``) that differs from the weight it should repeat.
    """
    state = _normalise_keys(state, names.prefix)
    extra = dict(extra or {})
    flat = traverse_util.flatten_dict(template)
    params, missing, used = {}, [], set()
    for path, leaf in flat.items():
        slot = names.hf_slot(path)
        if slot is None:
            joined = "/".join(path)
            params[path] = np.asarray(extra.pop(joined)) if joined in extra else leaf
            continue
        if slot.key not in state:
            if slot.key in names.head:
                params[path] = np.zeros(leaf.shape, np.float32)
            else:
                missing.append(slot.key)
            continue
        value = names.to_isojax_layout(path, state[slot.key])
        if slot.count > 1:
            if value.shape[-1] % slot.count:
                raise ValueError(
                    f"checkpoint key {slot.key!r} has shape {tuple(state[slot.key].shape)}, whose last "
                    f"axis does not split into {slot.count} equal parts (query, key, value)"
                )
            value = np.split(value, slot.count, axis=-1)[slot.index]
        if tuple(value.shape) != tuple(leaf.shape):
            transposed = (
                " (after transposing the PyTorch [out, in] weight)"
                if path[-1] == "kernel" and names.transpose_kernels
                else ""
            )
            part = f" (part {slot.index + 1} of {slot.count} along its last axis)" if slot.count > 1 else ""
            raise ValueError(
                f"checkpoint key {slot.key!r} has shape {tuple(state[slot.key].shape)}, but the model expects "
                f"{tuple(leaf.shape)} for params {'/'.join(path)!r}{part}{transposed}"
            )
        params[path] = np.asarray(value, dtype=np.float32)
        used.add(slot.key)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} key(s) the model needs: {missing}")
    if extra:
        raise ValueError(f"extra params given for paths the model does not have: {sorted(extra)}")
    for key, source in names.tied.items():
        if key in state and source in state and key not in used:  # an untied head's own weight is no repeat
            if state[key].shape != state[source].shape or not np.array_equal(state[key], state[source]):
                raise ValueError(
                    f"checkpoint key {key!r} differs from {source!r}: isojax ties the output embedding "
                    "matrix to the input one and cannot load an untied head"
                )
            used.add(key)
    ignore = re.compile(names.ignore) if names.ignore else None
    unused = [k for k in state if k not in used and not _BUFFERS.search(k) and not (ignore and ignore.search(k))]
    unexpected = [k for k in unused if k.startswith(names.namespaces)]
    if unexpected and strict:
        raise ValueError(f"checkpoint has {len(unexpected)} unexpected base-model key(s): {unexpected}")
    ignored = [k for k in unused if k not in unexpected]
    if ignored:
        log.warning("ignoring %d checkpoint key(s) outside the base model (task heads): %s", len(ignored), ignored[:8])
    return traverse_util.unflatten_dict(params)


def state_dict_from_params(params, names: HFNames) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inverse of :func:`params_from_state_dict`: ``(hf_state_dict, extra)``, numpy float32, PyTorch layouts.

    Fused parts are concatenated in order; with ``names.head`` the keys get the task-model ``prefix`` (head keys
    excepted). ``extra`` holds the parameters without a Hugging Face name, flat ``{"a/b/c": array}``.
    """
    parts: dict[str, dict[int, np.ndarray]] = {}
    paths: dict[str, tuple[str, ...]] = {}
    extra = {}
    for path, leaf in traverse_util.flatten_dict(params).items():
        value = np.asarray(leaf, dtype=np.float32)
        slot = names.hf_slot(path)
        if slot is None:
            extra["/".join(path)] = value
            continue
        parts.setdefault(slot.key, {})[slot.index] = value
        paths[slot.key] = path
    state = {}
    for key, pieces in parts.items():
        value = np.concatenate([pieces[i] for i in sorted(pieces)], axis=-1) if len(pieces) > 1 else pieces[0]
        value = names.to_isojax_layout(paths[key], value)  # the layout change is its own inverse (a transpose)
        if names.head and key not in names.head:
            key = f"{names.prefix}.{key}"
        state[key] = np.ascontiguousarray(value)
    return state, extra


def mlm_head_params(state: Mapping[str, np.ndarray], prefix: str, head, config) -> dict:
    """The params of :class:`isojax.models.heads.MaskedLMHead` from a Hugging Face ``...ForMaskedLM`` state dict.

    ``head``: the architecture's :class:`~isojax.models.heads.MLMHeadNames`; ``prefix``: its base-model prefix.
    Raises ``ValueError`` naming the missing keys when the checkpoint has no masked-LM head (a base model, a
    sentence-transformers checkpoint), a key whose shape does not fit, or a stored decoder weight or bias that
    differs from the word embeddings / the output bias it is tied to.
    """
    state = _normalise_keys(state, prefix)
    width, vocab = config.embedding_size, config.vocab_size
    wanted = {
        ("dense", "kernel"): (f"{head.dense}.weight", (config.hidden_size, width)),
        ("dense", "bias"): (f"{head.dense}.bias", (width,)),
        ("norm", "scale"): (f"{head.norm}.weight", (width,)),
        ("norm", "bias"): (f"{head.norm}.bias", (width,)),
        ("bias",): (head.bias, (vocab,)),
    }
    missing = [key for key, _ in wanted.values() if key not in state]
    if missing:
        raise ValueError(
            f"checkpoint has no masked-LM head: missing {missing} (a base-model or sentence-transformers "
            "checkpoint carries none; load a ...ForMaskedLM checkpoint)"
        )
    params = {}
    for path, (key, shape) in wanted.items():
        value = state[key].T if path[-1] == "kernel" else state[key]
        if tuple(value.shape) != shape:
            raise ValueError(
                f"checkpoint key {key!r} has shape {tuple(state[key].shape)}, but the masked-LM head "
                f"expects {shape}" + (" after transposing" if path[-1] == "kernel" else "")
            )
        params[path] = np.asarray(value, np.float32)
    tied = {f"{head.decoder}.weight": "embeddings.word_embeddings.weight", f"{head.decoder}.bias": head.bias}
    for key, source in tied.items():
        if key != source and key in state and source in state and not np.array_equal(state[key], state[source]):
            raise ValueError(
                f"checkpoint key {key!r} differs from {source!r}: isojax ties the masked-LM decoder to "
                "them and cannot load an untied head"
            )
    return traverse_util.unflatten_dict(params)
