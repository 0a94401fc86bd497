"""The bundled default model (all-MiniLM-L6-v2) against PyTorch and against its published STS-B score."""

import numpy as np
import pytest
import scipy.stats
from conftest import require

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
