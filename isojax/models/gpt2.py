"""GPT-2 (Radford et al. 2019): a :class:`~isojax.models.causal_lm.CausalLM` of pre-LayerNorm blocks, and its
Hugging Face names.

    h_0    = wte[ids] + wpe[positions]                          (dropout; no LayerNorm)
    h_l    = x + MLP(ln_2(x)),  x = h_{l-1} + Attn(ln_1(h_{l-1}))   (causal self-attention; MLP with gelu_new)
    h_L    = ln_f(h_L)
    logits = h_L wteᵀ                                           (the LM head is tied to the token embeddings)

Hugging Face stores every projection as a ``Conv1D`` with weight ``[in, out]``, and the query, key and value
projections side by side in one ``c_attn [H, 3H]``.
"""

from __future__ import annotations

from isojax.models.checkpoint import Fused, HFNames
from isojax.models.config import REQUIRED, TransformerConfig, check_supported, renamed_fields, renamed_hf

# GPT-2's config.json name -> TransformerConfig field, and transformers' GPT2Config defaults
_NAMES = {
    "vocab_size": "vocab_size",
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_inner": "intermediate_size",
    "activation_function": "hidden_act",
    "resid_pdrop": "hidden_dropout_prob",
    "attn_pdrop": "attention_probs_dropout_prob",
    "n_positions": "max_position_embeddings",
    "layer_norm_epsilon": "layer_norm_eps",
    "initializer_range": "initializer_range",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
}
_DEFAULTS = {
    "vocab_size": REQUIRED,
    "n_embd": REQUIRED,
    "n_layer": REQUIRED,
    "n_head": REQUIRED,
    "n_inner": None,
    "activation_function": "gelu_new",
    "resid_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "n_positions": 1024,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
    "pad_token_id": None,
}
# options isojax does not implement: config.json key -> the only value it accepts (transformers' default)
_FIXED = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
    "tie_word_embeddings": True,
}


def config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of a GPT-2 ``config.json`` (pre-LN, no embedding LayerNorm, no token types;
    ``n_inner`` None = ``4 n_embd``; one dropout rate for embeddings and residuals)."""
    check_supported(hf, _FIXED)
    if hf.get("embd_pdrop", 0.1) != hf.get("resid_pdrop", 0.1):
        raise ValueError(
            f"GPT-2 with embd_pdrop={hf['embd_pdrop']} != resid_pdrop={hf.get('resid_pdrop', 0.1)} is not "
            "supported: isojax uses one dropout rate for the embeddings and the residual branches"
        )
    fields = renamed_fields(hf, _NAMES, _DEFAULTS)
    fields["intermediate_size"] = fields["intermediate_size"] or 4 * fields["hidden_size"]
    return TransformerConfig(**fields, type_vocab_size=0, pre_norm=True, embedding_norm=False)


def config_to_hf(config: TransformerConfig) -> dict:
    return renamed_hf(config, _NAMES, "GPT2LMHeadModel", embd_pdrop=config.hidden_dropout_prob)


GPT2_HF_NAMES = HFNames(
    prefix="transformer",
    rules=(
        (r"embeddings/word_embeddings", "wte"),
        (r"embeddings/position_embeddings", "wpe"),
        (r"decoder/final_norm", "ln_f"),
        (r"decoder/layer_(\d+)/(?P<block>.+)", r"h.\1.{block}"),
    ),
    block={
        "attention_norm": "ln_1",
        "attention/query": Fused("attn.c_attn", 0, 3),
        "attention/key": Fused("attn.c_attn", 1, 3),
        "attention/value": Fused("attn.c_attn", 2, 3),
        "attention/output": "attn.c_proj",
        "output_norm": "ln_2",
        "intermediate": "mlp.c_fc",
        "output": "mlp.c_proj",
    },
    tied={"lm_head.weight": "wte.weight"},
    transpose_kernels=False,
    namespaces=("wte.", "wpe.", "h.", "ln_f."),
    ignore=r"^h\.\d+\.attn\.(bias|masked_bias)$",
)
