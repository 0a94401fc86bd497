"""The bundled default model (all-MiniLM-L6-v2) against PyTorch and against its published STS-B score."""

import numpy as np
import pytest
import scipy.stats
from conftest import require, save_tiny_encoder

import isojax
from isojax.eval import encode
from isojax.models.hub import bundled_model_path

torch = require("torch")
transformers = require("transformers")

SENTENCES = [
    "A man is playing a guitar.",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Isotropy",
    "Three children are playing football in a park while their parents watch from a bench.",
    "A woman slices an onion.",
]


@pytest.fixture(scope="module")
def default_model(default_model_path):
    return isojax.from_pretrained("default")


def test_default_resolves_to_bundled_package(default_model):
    module, params, tokenizer = default_model
    assert isojax.models.resolve("default") == bundled_model_path()
    assert module.config.model_type == "bert" and module.config.hidden_size == 384
    assert tokenizer is not None


def test_every_hidden_state_matches_pytorch(default_model):
    module, params, tokenizer = default_model
    ref = transformers.AutoModel.from_pretrained(bundled_model_path()).eval()
    enc = tokenizer(SENTENCES, padding=True, return_tensors="np")
    with torch.no_grad():
        theirs = ref(**{k: torch.tensor(v) for k, v in enc.items()}, output_hidden_states=True).hidden_states
    mine = module.apply({"params": params}, enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    real = enc["attention_mask"].astype(bool)
    assert len(mine.hidden_states) == len(theirs) == 7
    for a, b in zip(mine.hidden_states, theirs):
        np.testing.assert_allclose(np.asarray(a)[real], b.numpy()[real], atol=1e-4, rtol=0)


def _pytorch_mean_of_each_text(path, tokenizer, texts, max_length):
    """The reference of :func:`encode`'s default: each text alone, truncated by the tokenizer, through PyTorch."""
    ref = transformers.AutoModel.from_pretrained(str(path)).eval()
    rows = []
    for text in texts:
        enc = tokenizer([text], truncation=True, max_length=max_length, return_tensors="pt")
        with torch.no_grad():
            rows.append(ref(**enc).last_hidden_state[0].mean(0).numpy())
    return np.stack(rows)


def test_encode_truncates_to_a_max_length_that_is_no_multiple_of_the_padding(default_model):
    """max_length=9 with batches padded to multiples of 16 (a tokenizer error before: "truncation length (9) is not
    a multiple of pad_to_multiple_of (16)"): every text cut to 9 tokens, in batches of mixed lengths."""
    module, params, tokenizer = default_model
    mine = encode(module, params, tokenizer, SENTENCES, max_length=9, batch_size=2)
    theirs = _pytorch_mean_of_each_text(bundled_model_path(), tokenizer, SENTENCES, 9)
    np.testing.assert_allclose(mine, theirs, atol=1e-4, rtol=0)


def test_encode_pads_no_wider_than_the_positions_and_refuses_longer_texts(default_model, tmp_path):
    """A 20-position model: 18 tokens padded to the next multiple of 16 (32) asked for positions it does not have;
    a text longer than its positions after truncation is refused up front, naming max_length."""
    tokenizer = default_model[2]
    path = save_tiny_encoder(tmp_path / "m", tokenizer, positions=20)
    module, params, tokenizer = isojax.from_pretrained(path)
    texts = [" ".join(["word"] * 16), "a b"]  # 18 and 4 tokens
    mine = encode(module, params, tokenizer, texts, batch_size=2)
    np.testing.assert_allclose(mine, _pytorch_mean_of_each_text(path, tokenizer, texts, 128), atol=1e-5, rtol=0)
    longer = [" ".join(["word"] * 30), "a b"]
    with pytest.raises(ValueError, match=r"the longest holds 32 tokens after truncation to max_length=128, more than"):
        encode(module, params, tokenizer, longer)
    within = encode(module, params, tokenizer, longer, max_length=20)
    np.testing.assert_allclose(within, _pytorch_mean_of_each_text(path, tokenizer, longer, 20), atol=1e-5, rtol=0)
    for bad, message in ((1, "max_length must be an integer >= 2, got 1"), (20.0, "max_length must be an integer")):
        with pytest.raises(ValueError, match=message):
            encode(module, params, tokenizer, texts, max_length=bad)
    with pytest.raises(ValueError, match="pad_to_multiple_of must be a positive integer, got 0"):
        encode(module, params, tokenizer, texts, pad_to_multiple_of=0)


@pytest.mark.compute_bound
def test_stsb_test_spearman_is_the_published_82_03(default_model):
    """Mean pooling + cosine on STS-B test (1379 pairs): published 82.03 (sentence-transformers model card)."""
    from isojax.data.sts import load_stsb

    module, params, tokenizer = default_model
    data = load_stsb("test", source="package")
    emb = encode(module, params, tokenizer, data.sentences1 + data.sentences2, pooling="mean", max_length=256)
    a, b = emb[: len(data)], emb[len(data) :]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    spearman = 100 * scipy.stats.spearmanr(cos, data.scores).statistic
    assert abs(spearman - 82.03) <= 0.05, spearman
