"""Tiny random GPT-2 / BART / mBART made with transformers' PyTorch classes, and padded batches, for the decoder
tests (the independent reference)."""

import numpy as np
import torch
import transformers

BART_SIZES = dict(
    vocab_size=99,
    d_model=32,
    encoder_layers=2,
    decoder_layers=3,
    encoder_attention_heads=4,
    decoder_attention_heads=2,
    encoder_ffn_dim=37,
    decoder_ffn_dim=29,
    max_position_embeddings=40,
    scale_embedding=True,
)


def tiny_hf_model(arch: str, *, seed: int = 0, scale: float = 0.1, norm_scale: float | None = None):
    """A random tiny PyTorch LM of ``arch`` whose every parameter (LayerNorms, biases, final_logits_bias) is
    informative: Hugging Face's initialisation plus ``scale`` x N(0, 1) noise (``norm_scale`` for LayerNorms)."""
    torch.manual_seed(seed)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=99, n_embd=32, n_layer=3, n_head=4, n_positions=40, n_inner=37, bos_token_id=0, eos_token_id=5
        )
        model = transformers.GPT2LMHeadModel(cfg)
    elif arch == "bart":
        model = transformers.BartForConditionalGeneration(transformers.BartConfig(**BART_SIZES))
    elif arch == "mbart":
        cfg = transformers.MBartConfig(**BART_SIZES, decoder_start_token_id=2)
        model = transformers.MBartForConditionalGeneration(cfg)
    else:
        raise AssertionError(arch)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = "norm" in name or ".ln_" in name
            p.add_((scale if norm_scale is None or not is_norm else norm_scale) * torch.randn_like(p))
        if arch != "gpt2":
            model.final_logits_bias.add_(scale * torch.randn_like(model.final_logits_bias))
    return model.eval()


def padded(lengths, width, vocab, pad, *, left=False, seed=0, low=3):
    """Token ids ``[B, width]`` (real ids in [low, vocab)) and mask, padded on the right (or left) with ``pad``."""
    rng = np.random.default_rng(seed)
    ids = np.full((len(lengths), width), pad, np.int64)
    mask = np.zeros(ids.shape, np.int64)
    for i, n in enumerate(lengths):
        where = slice(width - n, width) if left else slice(0, n)
        ids[i, where], mask[i, where] = rng.integers(low, vocab, n), 1
    return ids, mask


LLM_COMMON = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37)
LLM_CASES = {  # case -> (transformers config class name, options): each block option at least once
    "llama-gqa-llama3-rope": (
        "LlamaConfig",
        dict(
            num_key_value_heads=2,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    "llama-mqa-linear-rope-tied": (
        "LlamaConfig",
        dict(num_key_value_heads=1, rope_scaling=dict(rope_type="linear", factor=2.0), tie_word_embeddings=True),
    ),
    "qwen2-biases-sliding-layers": (
        "Qwen2Config",
        dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=3, max_window_layers=1),
    ),
    "qwen3-qk-norm-wide-heads": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)),
    "mistral-sliding-window": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=3)),
    "gemma3-layer-pattern": (
        "Gemma3TextConfig",
        dict(
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=3,
            sliding_window_pattern=2,
            query_pre_attn_scalar=10,
            rope_local_base_freq=100.0,
        ),
    ),
}


def tiny_llm(case: str, *, seed: int = 0, scale: float = 0.1, max_position_embeddings: int = 64):
    """A random tiny PyTorch ``...ForCausalLM`` of an :data:`LLM_CASES` case (eager attention), every parameter
    informative: transformers' initialisation plus ``scale`` x N(0, 1) noise (norm weights included)."""
    torch.manual_seed(seed)
    name, options = LLM_CASES[case]
    config = getattr(transformers, name)(**LLM_COMMON, max_position_embeddings=max_position_embeddings, **options)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model.eval()
