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
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from flax import traverse_util

log = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TORCH_WEIGHTS_NAME = "pytorch_model.bin"
TORCH_WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
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


class LazyStateDict(Mapping[str, np.ndarray]):
    """A read-only state dict whose arrays are read from disk one at a time, when indexed.

    The keys are known up front; ``state[key]`` calls ``read(key)`` each time (nothing is cached), so a caller that
    takes one array, places it and drops it never holds the whole checkpoint on the host.

    Args:
      keys: the Hugging Face keys, in file order.
      read: ``key -> numpy array`` (PyTorch layout, the file's dtype or float32).
      source: the file or directory named in errors.

    Examples:
      >>> state = LazyStateDict(["a", "b"], lambda key: np.full(2, ord(key), np.float32), "in memory")
      >>> list(state), state["b"]
      (['a', 'b'], array([98., 98.], dtype=float32))
    """

    def __init__(self, keys, read: Callable[[str], np.ndarray], source: str):
        self._keys = dict.fromkeys(keys)
        self._read = read
        self.source = source

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._keys:
            raise KeyError(key)
        return self._read(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __repr__(self) -> str:
        return f"LazyStateDict({self.source!r}, {len(self)} keys)"


def open_state_dict(directory: str | os.PathLike) -> LazyStateDict:
    """The weights of a Hugging Face model directory as a :class:`LazyStateDict` (read tensor by tensor).

    Looks for, in order: ``model.safetensors``; ``model.safetensors.index.json`` and its shards;
    ``pytorch_model.bin``; ``pytorch_model.bin.index.json`` and its shards ``pytorch_model-0000i-of-0000n.bin``
    (the ``.bin`` files need PyTorch; they are memory-mapped where their format allows). Safetensors files are
    checked and their keys listed here, each array read with one plain file read when indexed (bfloat16 as
    float32), so that only the arrays a caller holds occupy memory.

    Raises ``FileNotFoundError`` naming the directory and the files looked for (or the missing shard), and a
    ``ValueError`` naming the file that is not a readable safetensors file (truncated, empty) or index.
    """
    directory = os.fspath(directory)
    single = os.path.join(directory, WEIGHTS_NAME)
    if os.path.exists(single):
        return _open_shards(directory, [WEIGHTS_NAME], _SafetensorsFile)
    index = os.path.join(directory, WEIGHTS_INDEX_NAME)
    if os.path.exists(index):
        return _open_shards(directory, _index_shards(index), _SafetensorsFile)
    binary = os.path.join(directory, TORCH_WEIGHTS_NAME)
    if os.path.exists(binary):
        return _open_shards(directory, [TORCH_WEIGHTS_NAME], _TorchFile)
    torch_index = os.path.join(directory, TORCH_WEIGHTS_INDEX_NAME)
    if os.path.exists(torch_index):
        return _open_shards(directory, _index_shards(torch_index), _TorchFile)
    raise FileNotFoundError(
        f"no weights in {directory}: looked for {WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME}, {TORCH_WEIGHTS_NAME}, "
        f"{TORCH_WEIGHTS_INDEX_NAME}"
    )


def read_state_dict(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read all the weights of a Hugging Face model directory as numpy arrays (:func:`open_state_dict`, read whole).

    Floating-point ``.bin`` tensors and bfloat16 safetensors come as float32; other arrays in their stored dtype.
    Raises as :func:`open_state_dict` does.
    """
    state = open_state_dict(directory)
    return {key: state[key] for key in state}


def _index_shards(index: str) -> list[str]:
    """The shard file names of a ``*.index.json`` (its ``weight_map`` values), sorted."""
    with open(index) as f:
        try:
            return sorted(set(json.load(f)["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index}: not a checkpoint index with a 'weight_map' object ({e!r})") from None


def _open_shards(directory: str, shards: list[str], opener) -> LazyStateDict:
    files: dict[str, Any] = {}
    for shard in shards:
        path = os.path.join(directory, shard)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} does not exist; the checkpoint index of {directory} names it")
        handle = opener(path)
        files.update(dict.fromkeys(handle.keys(), handle))
    return LazyStateDict(files, lambda key: files[key].get(key), directory)


_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


class _SafetensorsFile:
    """One safetensors file; ``get(key)`` reads that array's bytes with one ``read`` (no memory map, so nothing but
    the array itself stays in the process's memory), bfloat16 as float32."""

    def __init__(self, path: str):
        from safetensors import SafetensorError, safe_open

        self.path = path
        try:
            with safe_open(path, framework="np"):  # validates the header and sizes against the file's length
                pass
        except SafetensorError as e:
            raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            self._header = {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
        self._start = 8 + n

    def keys(self) -> list[str]:
        return list(self._header)

    def get(self, key: str) -> np.ndarray:
        entry = self._header[key]
        if entry["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{self.path}: tensor {key!r} has dtype {entry['dtype']}, which isojax cannot read")
        import ml_dtypes

        dtype = (
            np.dtype(ml_dtypes.bfloat16) if entry["dtype"] == "BF16" else np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]])
        )
        begin, stop = entry["data_offsets"]
        buffer = np.empty(stop - begin, np.uint8)
        with open(self.path, "rb") as f:
            f.seek(self._start + begin)
            if f.readinto(buffer.data) != stop - begin:
                raise ValueError(f"{self.path}: tensor {key!r} runs past the end of the file")
        value = buffer.view(dtype).reshape(entry["shape"])
        return value.astype(np.float32) if entry["dtype"] == "BF16" else value


class _TorchFile:
    """One PyTorch pickle (``torch.load(weights_only=True)``, memory-mapped when its format allows)."""

    def __init__(self, path: str):
        try:
            import torch
        except ImportError as e:
            raise ImportError(f"{path} is a PyTorch pickle; reading it needs torch (pip install torch)") from e
        try:
            self._tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (pre-zip) format cannot be memory-mapped
            self._tensors = torch.load(path, map_location="cpu", weights_only=True)

    def keys(self) -> list[str]:
        return list(self._tensors)

    def get(self, key: str) -> np.ndarray:
        value = self._tensors[key]
        return value.float().numpy() if value.is_floating_point() else value.numpy()


def load_safetensors(path: str) -> dict[str, np.ndarray]:
    """``safetensors.numpy.load_file(path)``, its errors (a truncated or empty file) as ``ValueError`` naming ``path``."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except SafetensorError as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None


def _normalise_keys(state: Mapping[str, np.ndarray], prefix: str) -> LazyStateDict:
    """Strip the task-model prefix (``bert.``) and rename old LayerNorm ``gamma``/``beta`` (a view: nothing read)."""
    names = {}
    for original in state:
        key = original[len(prefix) + 1 :] if original.startswith(prefix + ".") else original
        key = re.sub(r"(LayerNorm|layer_norm|_norm)\.gamma$", r"\1.weight", key)
        key = re.sub(r"(LayerNorm|layer_norm|_norm)\.beta$", r"\1.bias", key)
        names[key] = original
    return LazyStateDict(names, lambda key: state[names[key]], getattr(state, "source", "state dict"))


def has_pooler(state: Mapping[str, np.ndarray], names: HFNames) -> bool:
    """Whether a state dict carries the pooler's weights."""
    return any(k.startswith("pooler") for k in _normalise_keys(state, names.prefix))


def params_from_state_dict(
    state: Mapping[str, np.ndarray], names: HFNames, template, *, extra=None, strict=True, place=None
):
    """Fill a params template (shapes, e.g. from ``jax.eval_shape(model.init, ...)``) from a HF state dict.

    state: ``{key: array}``, or a :class:`LazyStateDict` (:func:`open_state_dict`, the GGUF reader) whose arrays are
      read one at a time: each is read, laid out, handed to ``place`` and dropped before the next is read.
    extra: values for the parameters that have no Hugging Face name (flat ``{"a/b/c": array}``); those not given
      are taken from ``template`` itself, which must then hold arrays rather than shapes.
    strict: raise on base-model keys the model does not use (head keys such as ``classifier.*`` are only logged).
    place: ``(path, float32 numpy array) -> leaf``, applied to every parameter as soon as it is read (e.g. a
      ``jax.device_put`` onto its sharding); None keeps the numpy arrays.

    Raises ``ValueError`` naming every missing key, every unexpected base-model key, a key whose shape does not
    fit (with both shapes), and a tied key (``lm_head.weight``) that differs from the weight it should repeat.
    """
    state = _normalise_keys(state, names.prefix)
    extra = dict(extra or {})
    place = place or (lambda path, value: value)
    flat = traverse_util.flatten_dict(template)
    params, missing, used = {}, [], set()
    last: tuple[str | None, Any] = (None, None)  # a fused weight (GPT-2's c_attn) is read once for its parts
    for path, leaf in flat.items():
        slot = names.hf_slot(path)
        if slot is None:
            joined = "/".join(path)
            params[path] = place(path, np.asarray(extra.pop(joined)) if joined in extra else leaf)
            continue
        if slot.key not in state:
            if slot.key in names.head:
                params[path] = place(path, np.zeros(leaf.shape, np.float32))
            else:
                missing.append(slot.key)
            continue
        raw = last[1] if last[0] == slot.key else state[slot.key]
        last = (slot.key, raw) if slot.count > 1 else (None, None)
        value = names.to_isojax_layout(path, raw)
        if slot.count > 1:
            if value.shape[-1] % slot.count:
                raise ValueError(
                    f"checkpoint key {slot.key!r} has shape {tuple(raw.shape)}, whose last "
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
                f"checkpoint key {slot.key!r} has shape {tuple(raw.shape)}, but the model expects "
                f"{tuple(leaf.shape)} for params {'/'.join(path)!r}{part}{transposed}"
            )
        params[path] = place(path, np.asarray(value, dtype=np.float32))
        del raw, value
        used.add(slot.key)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} key(s) the model needs: {missing}")
    if extra:
        raise ValueError(f"extra params given for paths the model does not have: {sorted(extra)}")
    for key, source in names.tied.items():
        if key in state and source in state and key not in used:  # an untied head's own weight is no repeat
            tied, original = state[key], state[source]
            if tied.shape != original.shape or not np.array_equal(tied, original):
                raise ValueError(
                    f"checkpoint key {key!r} differs from {source!r}: isojax ties the output embedding "
                    "matrix to the input one and cannot load an untied head"
                )
            del tied, original
            used.add(key)
    ignore = re.compile(names.ignore) if names.ignore else None
    unused = [k for k in state if k not in used and not _BUFFERS.search(k) and not (ignore and ignore.search(k))]
    unexpected = [k for k in unused if k.startswith(names.namespaces)]
    if unexpected and strict:
        raise ValueError(f"checkpoint has {len(unexpected)} unexpected base-model key(s): {unexpected}")
    ignored = [k for k in unused if k not in unexpected]
    if ignored:
        log.warning(
            "ignoring %d checkpoint key(s) outside the base model (task heads; isojax.models.load_classification_head "
            "reads a sequence-classification head): %s",
            len(ignored),
            ignored[:8],
        )
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
