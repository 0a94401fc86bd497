"""Mistral (Jiang et al. 2023): the Llama block whose every layer attends to the last ``sliding_window`` keys only
(none when ``sliding_window`` is null). Hugging Face names: those of :mod:`isojax.models.llama`."""

from __future__ import annotations

from isojax.models.config import TransformerConfig
from isojax.models.llama import DEFAULTS, decoder_fields, decoder_hf


def config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of a Mistral ``config.json``."""
    window = hf.get("sliding_window", 4096)
    options = (
        {}
        if window is None
        else dict(sliding_window=window, layer_types=("sliding_attention",) * hf.get("num_hidden_layers", 0))
    )
    return decoder_fields(hf, dict(DEFAULTS, max_position_embeddings=131072), **options)


def config_to_hf(config: TransformerConfig) -> dict:
    return decoder_hf(config, "MistralForCausalLM", sliding_window=config.sliding_window or None)
