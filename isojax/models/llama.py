"""Llama (Touvron et al. 2023; Llama 2, 3, 3.x, SmolLM2): a :class:`~isojax.models.causal_lm.CausalLM` of pre-RMSNorm
blocks with RoPE, grouped-query attention and a SwiGLU feed-forward; its Hugging Face names and config translation.

    h_l = x + down(silu(gate(n)) · up(n)),  n = RMSNorm(x),  x = h_{l-1} + Attn(RMSNorm(h_{l-1}))

Qwen2, Qwen3 and Mistral (:mod:`isojax.models.qwen`, :mod:`isojax.models.mistral`) are the same model with other
options and share these names (``model.layers.{i}.self_attn.q_proj``, ``mlp.gate_proj``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jax.sharding import PartitionSpec as P

from isojax.models.causal_lm import LM_HEAD
from isojax.models.checkpoint import HFNames
from isojax.models.config import REQUIRED, TransformerConfig, renamed_fields, renamed_hf
from isojax.models.rope import rope_from_hf, rope_to_hf

# config.json name -> TransformerConfig field, shared by the Llama family
NAMES = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "intermediate_size": "intermediate_size",
    "hidden_act": "hidden_act",
    "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "layer_norm_eps",
    "initializer_range": "initializer_range",
    "attention_dropout": "attention_probs_dropout_prob",
    "tie_word_embeddings": "tie_word_embeddings",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
}
# transformers' LlamaConfig defaults
DEFAULTS: dict[str, Any] = {
    "vocab_size": REQUIRED,
    "hidden_size": REQUIRED,
    "num_hidden_layers": REQUIRED,
    "num_attention_heads": REQUIRED,
    "num_key_value_heads": None,
    "head_dim": None,
    "intermediate_size": REQUIRED,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": None,
}


def decoder_fields(
    hf: Mapping[str, Any], defaults: Mapping[str, Any] = DEFAULTS, names: Mapping[str, str] = NAMES, **options
) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Llama-family ``config.json``: pre-RMSNorm, RoPE, no position table, no
    token types, no dropout but the attention's, gated feed-forward; ``names`` / ``defaults`` as for
    :func:`~isojax.models.config.renamed_fields`; ``options`` override fields (Qwen's biases). A list of end tokens
    keeps its first (decoding stops at one id)."""
    fields = renamed_fields(hf, names, defaults)
    heads = fields["num_attention_heads"]  # 0: the default (as many key/value heads; hidden_size / heads wide)
    if fields["num_key_value_heads"] in (None, heads):
        fields["num_key_value_heads"] = 0
    if fields["head_dim"] is None or fields["head_dim"] * heads == fields["hidden_size"]:
        fields["head_dim"] = 0
    if isinstance(fields["eos_token_id"], list):
        fields["eos_token_id"] = fields["eos_token_id"][0] if fields["eos_token_id"] else None
    settings: dict[str, Any] = dict(
        type_vocab_size=0,
        hidden_dropout_prob=0.0,
        pre_norm=True,
        embedding_norm=False,
        norm="rms_norm",
        rope=rope_from_hf(hf),
        gated_mlp=True,
        attention_bias=bool(hf.get("attention_bias", False)),
        attention_output_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
    )
    settings.update(options)
    return TransformerConfig(**fields, **settings)


def decoder_hf(
    config: TransformerConfig, architecture: str, names: Mapping[str, str] = NAMES, **extra
) -> dict[str, Any]:
    """Inverse of :func:`decoder_fields` for a config made in code: the Llama-family ``config.json`` keys."""
    assert config.rope is not None
    return renamed_hf(
        config,
        names,
        architecture,
        num_key_value_heads=config.key_value_heads,
        head_dim=config.attention_head_dim,
        rope_parameters=rope_to_hf(config.rope),
        attention_bias=config.attention_bias,
        mlp_bias=config.mlp_bias,
        **extra,
    )


def config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of a Llama ``config.json``."""
    return decoder_fields(hf)


def config_to_hf(config: TransformerConfig) -> dict:
    return decoder_hf(config, "LlamaForCausalLM")


BLOCK_NAMES = {
    "attention_norm": "input_layernorm",
    "attention/query": "self_attn.q_proj",
    "attention/key": "self_attn.k_proj",
    "attention/value": "self_attn.v_proj",
    "attention/output": "self_attn.o_proj",
    "attention/query_norm": "self_attn.q_norm",
    "attention/key_norm": "self_attn.k_norm",
    "output_norm": "post_attention_layernorm",
    "gate": "mlp.gate_proj",
    "intermediate": "mlp.up_proj",
    "output": "mlp.down_proj",
}


def decoder_hf_names(block: Mapping[str, str]) -> HFNames:
    """The Hugging Face names of a ``...ForCausalLM`` checkpoint of the Llama family with these block names."""
    return HFNames(
        prefix="",
        rules=(
            (r"embeddings/word_embeddings", "model.embed_tokens"),
            (r"decoder/final_norm", "model.norm"),
            (LM_HEAD, "lm_head"),
            (r"decoder/layer_(\d+)/(?P<block>.+)", r"model.layers.\1.{block}"),
        ),
        block=block,
        tied={"lm_head.weight": "model.embed_tokens.weight"},
        namespaces=("model.",),
        ignore=r"rotary_emb\.\w+$",
    )


LLAMA_HF_NAMES = decoder_hf_names(BLOCK_NAMES)

DECODER_PARTITION_RULES = ((rf"(^|/){LM_HEAD}/kernel$", P(None, "model")),)
"""The untied LM head is split by vocabulary over the model axis, as the gated feed-forward's input projections."""
