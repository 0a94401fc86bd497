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
