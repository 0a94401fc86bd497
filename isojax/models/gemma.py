"""Gemma 3 (text; Gemma team 2025): the Llama-family block with Gemma's options and Hugging Face names.

    h_0 = embed(ids) · sqrt(hidden_size)
    h_l = x + norm₄(GeGLU(norm₃(x))),  x = h_{l-1} + norm₂(Attn(norm₁(h_{l-1})))   (sandwich norms)
    RMSNorm(x) = x / sqrt(mean x² + eps) · (1 + w);   scores · query_pre_attn_scalar^(-1/2);   q/k RMSNorm

Layers alternate sliding-window and full attention (``layer_types``), each kind with its own RoPE base
(``rope_parameters["sliding_attention"]`` / ``["full_attention"]``, formerly ``rope_local_base_freq`` /
``rope_theta``). Logit soft-capping and bidirectional attention are refused by name.
"""

from __future__ import annotations

from isojax.models.config import TransformerConfig, check_supported
from isojax.models.llama import BLOCK_NAMES, DEFAULTS, NAMES, decoder_fields, decoder_hf, decoder_hf_names
from isojax.models.rope import Rope, rope_from_hf, rope_to_hf

# Gemma calls the activation hidden_activation
GEMMA3_NAMES = {("hidden_activation" if key == "hidden_act" else key): field for key, field in NAMES.items()}
GEMMA3_DEFAULTS = dict(
    {key: value for key, value in DEFAULTS.items() if key != "hidden_act"},
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=131072,
    head_dim=256,
    tie_word_embeddings=True,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)
_FIXED = {"final_logit_softcapping": None, "attn_logit_softcapping": None, "use_bidirectional_attention": False}


def config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of a Gemma 3 text ``config.json`` (``model_type`` ``gemma3_text``)."""
    check_supported(hf, _FIXED)
    n = hf["num_hidden_layers"]
    pattern = hf.get("sliding_window_pattern", 6)
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    parameters = hf.get("rope_parameters") or {}
    if "full_attention" in parameters:
        rope = rope_from_hf(hf, parameters["full_attention"])
        local = rope_from_hf(hf, parameters.get("sliding_attention") or {"rope_theta": 10000.0})
    else:
        rope = rope_from_hf(dict(hf, rope_theta=hf.get("rope_theta", 1_000_000.0)))
        local = Rope(theta=float(hf.get("rope_local_base_freq", 10000.0)))
    return decoder_fields(
        hf,
        GEMMA3_DEFAULTS,
        GEMMA3_NAMES,
        norm_weight_offset=1.0,
        scale_embedding=True,
        sandwich_norm=True,
        qk_norm=True,
        query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256),
        layer_types=tuple(types),
        sliding_window=hf.get("sliding_window", 4096),
        rope=rope,
        local_rope=local,
    )


def config_to_hf(config: TransformerConfig) -> dict:
    assert config.rope is not None and config.local_rope is not None
    out = decoder_hf(
        config,
        "Gemma3ForCausalLM",
        GEMMA3_NAMES,
        query_pre_attn_scalar=config.query_pre_attn_scalar,
        sliding_window=config.sliding_window,
        layer_types=list(config.layer_types or ()),
    )
    out["rope_parameters"] = {
        "full_attention": rope_to_hf(config.rope),
        "sliding_attention": rope_to_hf(config.local_rope),
    }
    return out


GEMMA3_HF_NAMES = decoder_hf_names(
    dict(
        BLOCK_NAMES,
        attention_post_norm="post_attention_layernorm",
        output_norm="pre_feedforward_layernorm",
        output_post_norm="post_feedforward_layernorm",
    )
)
