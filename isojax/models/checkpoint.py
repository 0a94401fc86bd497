"""Hugging Face checkpoints <-> isojax params.

A Hugging Face state dict is a flat ``{name: array}`` with PyTorch layouts; isojax params are a nested dict with
canonical names (see :mod:`isojax.models.layers`). Each architecture declares an :class:`HFNames` that maps the
module path of every parameter to its Hugging Face module name; leaves map as::

    Dense  kernel [in, out]  <->  weight [out, in] (transposed)      bias  <->  bias
    LayerNorm scale          <->  weight (old checkpoints: gamma / beta)
    Embed  embedding         <->  weight

Parameters outside the encoder's Hugging Face names (e.g. a last-layer SoftDecay's alpha) are "extra": they are
kept in a separate ``isojax_extra.safetensors`` so that the main file stays loadable by transformers.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import Mapping

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
class HFNames:
    """How an architecture's isojax module paths are called in Hugging Face checkpoints.

    prefix: the base-model prefix of task checkpoints (``bert`` in ``bert.encoder.layer.0...``); stripped on load.
    rules: ``(regex, template)`` pairs tried in order on the ``/``-joined module path; the template may use
      ``\\1``-style groups and ``{block}``, which is replaced by ``block[<the named group 'block'>]``.
    block: canonical block-internal module path -> Hugging Face name.
    """

    prefix: str
    rules: tuple[tuple[str, str], ...]
    block: Mapping[str, str]

    def hf_module(self, module_path: str) -> str | None:
        """The Hugging Face module name of an isojax module path, or None if it has none."""
        for pattern, template in self.rules:
            m = re.fullmatch(pattern, module_path)
            if m:
                name = m.expand(template)
                if "block" in m.groupdict():
                    inner = self.block.get(m["block"])
                    if inner is None:
                        return None
                    name = name.replace("{block}", inner)
                return name
        return None

    def hf_key(self, path: tuple[str, ...]) -> str | None:
        """Hugging Face key of a parameter path ``(module, ..., leaf)``, or None for an extra parameter."""
        module = self.hf_module("/".join(path[:-1]))
        if module is None or path[-1] not in _LEAF_TO_HF:
            return None
        return f"{module}.{_LEAF_TO_HF[path[-1]]}"


def read_state_dict(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read the weights of a Hugging Face model directory as numpy arrays.

    Tries ``model.safetensors``, a sharded ``model.safetensors.index.json``, then ``pytorch_model.bin``
    (that one needs PyTorch). Raises ``FileNotFoundError`` naming the directory and the files looked for.
    """
    from safetensors.numpy import load_file

    directory = os.fspath(directory)
    single = os.path.join(directory, WEIGHTS_NAME)
    if os.path.exists(single):
        return load_file(single)
    index = os.path.join(directory, WEIGHTS_INDEX_NAME)
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        state: dict[str, np.ndarray] = {}
        for shard in shards:
            state.update(load_file(os.path.join(directory, shard)))
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


def _normalise_keys(state: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """Strip the task-model prefix (``bert.``) and rename old LayerNorm ``gamma``/``beta``."""
    out = {}
    for key, value in state.items():
        if key.startswith(prefix + "."):
            key = key[len(prefix) + 1:]
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
    strict: raise on encoder keys the model does not use (head keys such as ``classifier.*`` are only logged).

    Raises ``ValueError`` naming every missing key, every unexpected encoder key, and a key whose shape does not
    fit (with both shapes).
    """
    state = _normalise_keys(state, names.prefix)
    extra = dict(extra or {})
    flat = traverse_util.flatten_dict(template)
    params, missing, used = {}, [], set()
    for path, leaf in flat.items():
        key = names.hf_key(path)
        if key is None:
            joined = "/".join(path)
            params[path] = np.asarray(extra.pop(joined)) if joined in extra else leaf
            continue
        if key not in state:
            missing.append(key)
            continue
        value = state[key]
        if path[-1] == "kernel":
            value = value.T
        if tuple(value.shape) != tuple(leaf.shape):
            raise ValueError(
                f"checkpoint key {key!r} has shape {tuple(state[key].shape)}, but the model expects "
                f"{tuple(leaf.shape)} for params {'/'.join(path)!r}"
                + (" (after transposing the PyTorch [out, in] weight)" if path[-1] == "kernel" else "")
            )
        params[path] = np.asarray(value, dtype=np.float32)
        used.add(key)
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} key(s) the model needs: {missing}")
    if extra:
        raise ValueError(f"extra params given for paths the model does not have: {sorted(extra)}")
    unused = [k for k in state if k not in used and not _BUFFERS.search(k)]
    unexpected = [k for k in unused if k.startswith(_ENCODER_NAMESPACES)]
    if unexpected and strict:
        raise ValueError(f"checkpoint has {len(unexpected)} unexpected encoder key(s): {unexpected}")
    ignored = [k for k in unused if k not in unexpected]
    if ignored:
        log.warning("ignoring %d checkpoint key(s) outside the encoder (task heads): %s", len(ignored), ignored[:8])
    return traverse_util.unflatten_dict(params)


def state_dict_from_params(params, names: HFNames) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inverse of :func:`params_from_state_dict`: ``(hf_state_dict, extra)``, numpy float32, PyTorch layouts.

    ``extra`` holds the parameters without a Hugging Face name, flat ``{"a/b/c": array}``.
    """
    state, extra = {}, {}
    for path, leaf in traverse_util.flatten_dict(params).items():
        value = np.asarray(leaf, dtype=np.float32)
        key = names.hf_key(path)
        if key is None:
            extra["/".join(path)] = value
        else:
            state[key] = np.ascontiguousarray(value.T if path[-1] == "kernel" else value)
    return state, extra
