"""Qwen2 and Qwen3 (Qwen team 2024, 2025): the Llama block with Qwen2's query/key/value biases, or Qwen3's RMSNorm of
each head's queries and keys before RoPE; sliding-window layers where ``use_sliding_window`` asks for them. Hugging
Face names: those of :mod:`isojax.models.llama` (``self_attn.q_norm`` / ``k_norm`` for Qwen3's norms)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from isojax.models.config import TransformerConfig
from isojax.models.llama import DEFAULTS, decoder_fields, decoder_hf

QWEN_DEFAULTS = dict(
    DEFAULTS, max_position_embeddings=32768, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False
)


def layer_types(hf: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Each layer's attention (``layer_types``, else from ``use_sliding_window`` and ``max_window_layers``: layers
    from ``max_window_layers`` on slide), or None when every layer attends fully."""
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
        first = hf.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n)]
    return tuple(types) if "sliding_attention" in types else None


def sliding_options(hf: Mapping[str, Any]) -> dict[str, Any]:
    types = layer_types(hf)
    return {} if types is None else dict(layer_types=types, sliding_window=hf["sliding_window"])


def qwen2_config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of a Qwen2 ``config.json`` (biases on q, k, v; none on the output projection)."""
    return decoder_fields(hf, QWEN_DEFAULTS, attention_bias=True, attention_output_bias=False, **sliding_options(hf))


def qwen3_config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of a Qwen3 ``config.json`` (q/k RMSNorm; ``attention_bias`` on all four)."""
    return decoder_fields(hf, dict(QWEN_DEFAULTS, head_dim=128), qk_norm=True, **sliding_options(hf))


def sliding_hf(config: TransformerConfig) -> dict[str, Any]:
    types = config.layer_types or ("full_attention",) * config.num_hidden_layers
    return dict(
        layer_types=list(types),
        use_sliding_window=config.layer_types is not None,
        sliding_window=config.sliding_window or None,
    )


def qwen2_config_to_hf(config: TransformerConfig) -> dict:
    return decoder_hf(config, "Qwen2ForCausalLM", **sliding_hf(config))


def qwen3_config_to_hf(config: TransformerConfig) -> dict:
    return decoder_hf(config, "Qwen3ForCausalLM", **sliding_hf(config))
