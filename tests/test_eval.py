"""STS and word-similarity evaluation against numpy/scipy references."""

import numpy as np
import pytest
import scipy.stats

from isojax.data.wordsim import WordSimData
from isojax.eval import sts, wordsim


def test_cosine_scores_match_numpy_and_zero_rows():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(20, 5)), rng.normal(size=(20, 5))
    b[3] = 0
    ref = np.array([x @ y / (np.linalg.norm(x) * np.linalg.norm(y)) if np.any(y) else 0.0 for x, y in zip(a, b)])
    np.testing.assert_allclose(sts.cosine_scores(a, b), ref, atol=1e-12)


def test_correlations_match_scipy_and_refuse_fewer_than_two_pairs():
    """Two pairs are the fewest with a correlation (scipy's own error named neither array: "`x` and `y` must
    have length at least 2", which `isojax sts --limit 1` printed)."""
    rng = np.random.default_rng(2)
    predicted, gold = rng.normal(size=30), rng.uniform(0, 5, 30)
    got = sts.correlations(predicted, gold)
    assert got["spearman"] == pytest.approx(100 * scipy.stats.spearmanr(predicted, gold).statistic, abs=1e-10)
    assert got["pearson"] == pytest.approx(100 * np.corrcoef(predicted, gold)[0, 1], abs=1e-10)
    assert sts.correlations([1.0, 2.0], [3.0, 1.0]) == pytest.approx({"spearman": -100.0, "pearson": -100.0})
    for p, g in (([0.5], [1.0]), (predicted, gold[:-1]), (predicted[:, None], gold[:, None])):
        with pytest.raises(ValueError, match=r"correlations: predicted and gold must be \[N\] scores with N >= 2"):
            sts.correlations(p, g)


def test_sentence_isotropy_needs_more_embeddings_than_lsds_neighbours():
    x = np.random.default_rng(3).normal(size=(10, 4))
    with pytest.raises(ValueError, match=r"lsds_k=12 neighbours per embedding need at least 13 embeddings, got 10"):
        sts.sentence_isotropy(x, x)
    assert np.isfinite(list(sts.sentence_isotropy(x, x, lsds_k=9).values())).all()


def test_evaluate_pairs_each_method_against_reference_transform():
    """Spearman of every method equals scipy on cosines of the numpy-transformed embeddings."""
    rng = np.random.default_rng(1)
    base = rng.normal(size=(60, 8)) @ rng.normal(size=(8, 8)) + 3.0  # shifted, anisotropic
    a, b = base + 0.3 * rng.normal(size=base.shape), base + 0.3 * rng.normal(size=base.shape)
    gold = rng.uniform(0, 5, 60)
    both = np.concatenate([a, b])
    mu = both.mean(0)
    cov = np.cov(both.T)
    s, u = np.linalg.eigh(cov)
    refs = {
        "raw": both,
        "center": both - mu,
        "whiten": (both - mu) @ (u / np.sqrt(s)),
        "abtt": (both - mu) - np.outer((both - mu) @ u[:, -1], u[:, -1]),
    }
    for method, ref in refs.items():
        got = sts.evaluate_pairs(a.astype(np.float32), b.astype(np.float32), gold, sts.Transform(method))
        want = 100 * scipy.stats.spearmanr(sts.cosine_scores(ref[:60], ref[60:]), gold).statistic
        assert got["spearman"] == pytest.approx(want, abs=0.05), method


def test_softdecay_is_applied_to_each_side_separately():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(30, 6)).astype(np.float32), rng.normal(size=(30, 6)).astype(np.float32)
    ta, tb = sts.Transform("softdecay", alpha=-0.5)(a, b)
    from isojax.softdecay import soft_decay

    np.testing.assert_allclose(ta, soft_decay(a, -0.5), atol=1e-6)
    np.testing.assert_allclose(tb, soft_decay(b, -0.5), atol=1e-6)


def test_search_alpha_returns_the_best_scoring_alpha():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(40, 6)).astype(np.float32), rng.normal(size=(40, 6)).astype(np.float32)
    gold = sts.cosine_scores(a, b) + 0.1 * rng.normal(size=40)
    best, scores = sts.search_alpha(a, b, gold)
    assert set(scores) == set(sts.DEFAULT_ALPHAS) and scores[best] == max(scores.values())


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="unknown STS method 'pca'"):
        sts.Transform("pca")


class WordTokenizer:
    """A tiny tokenizer: known words are one token, others split into characters."""

    vocab = {w: i for i, w in enumerate(["cat", "dog", "car", "tiger", "bus", "apple", "pear", "x", "y", "z"])}

    def __call__(self, words, add_special_tokens=False):
        return {"input_ids": [[self.vocab[w]] if w in self.vocab else [0, 1] for w in words]}


def test_wordsim_skips_split_words_and_matches_scipy():
    rng = np.random.default_rng(4)
    w = rng.normal(size=(10, 4)) + 1.0
    pairs = [
        ("cat", "tiger"),
        ("dog", "cat"),
        ("car", "bus"),
        ("apple", "pear"),
        ("cat", "unknownword"),
        ("car", "apple"),
    ]
    data = WordSimData(pairs, np.array([9.0, 7.0, 6.5, 8.0, 3.0, 1.0]), "toy")
    tok = WordTokenizer()
    keep = [0, 1, 2, 3, 5]
    ids = [(tok.vocab[pairs[i][0]], tok.vocab[pairs[i][1]]) for i in keep]
    for similarity in ("cosine", "inner"):
        got = wordsim.evaluate_wordsim(w, tok, data, similarity=similarity)
        sims = [
            w[i] @ w[j] / ((np.linalg.norm(w[i]) * np.linalg.norm(w[j])) if similarity == "cosine" else 1)
            for i, j in ids
        ]
        assert got["pairs_used"] == 5 and got["pairs_total"] == 6
        assert got["pearson"] == pytest.approx(100 * scipy.stats.pearsonr(sims, data.scores[keep]).statistic)
        assert got["spearman"] == pytest.approx(100 * scipy.stats.spearmanr(sims, data.scores[keep]).statistic)


def test_embedding_isotropy_against_numpy_partition_function():
    rng = np.random.default_rng(5)
    w = (rng.normal(size=(500, 6)) * 0.5 + np.array([1.0, 0, 0, 0, 0, 0])).astype(np.float32)

    def partition_function(m):  # Z(c) over the eigenvectors of mᵀm and their negatives
        _, vecs = np.linalg.eigh(m.T.astype(np.float64) @ m)
        c = np.concatenate([vecs, -vecs], axis=1)
        return np.exp(m.astype(np.float64) @ c).sum(0)

    def i1(m):
        z = partition_function(m)
        return z.min() / z.max()

    mu = w.mean(0)
    out = wordsim.embedding_isotropy(w)
    # one key per measure, as fine-tuning logs them: I1 / I2 (the paper's I(W)), then _centered and _abtt
    assert set(out) == {f"I{k}{s}" for k in (1, 2) for s in ("", "_centered", "_abtt")} | {
        "avg_norm",
        "mean_norm",
        "mean_norm_ratio",
    }
    assert out["I1"] == pytest.approx(i1(w), rel=1e-4)
    z = partition_function(w)
    assert out["I2"] == pytest.approx(z.std() / z.mean(), rel=1e-3)
    assert out["I1_centered"] == pytest.approx(i1(w - mu), rel=1e-4)
    assert out["I1_centered"] > out["I1"]
    assert out["mean_norm"] == pytest.approx(np.linalg.norm(mu), rel=1e-5)
    assert out["mean_norm_ratio"] == pytest.approx(np.linalg.norm(mu) / np.linalg.norm(w, axis=1).mean(), rel=1e-5)


def test_embed_sets_encodes_each_distinct_sentence_once(monkeypatch):
    """All sets and poolings come from one encode call over the distinct sentences, mapped back to each side."""
    from isojax.data.sts import StsData

    calls = []

    def fake_encode(module, params, tokenizer, texts, *, reduce, **kwargs):
        calls.append(list(texts))
        out = np.array([[len(t), sum(map(ord, t)) % 97] for t in texts], np.float32)
        return {"mean": out, "cls": -out}  # stands in for reduce's {pooling: [N, d]}

    monkeypatch.setattr(sts, "encode", fake_encode)
    one = StsData(["a b", "c", "a b"], ["c", "dd", "e"], np.array([1.0, 2, 3]), "one", "test")
    two = StsData(["dd", "f"], ["a b", "c"], np.array([0.5, 4]), "two", "test")
    got = sts.embed_sets(None, None, None, [one, two], poolings=("mean", "cls"))
    assert len(calls) == 1 and calls[0] == ["a b", "c", "dd", "e", "f"]
    for k, data in enumerate([one, two]):
        for pooling, sign in (("mean", 1), ("cls", -1)):
            a, b = got[pooling][k]
            want = [[sign * len(t), sign * (sum(map(ord, t)) % 97)] for t in data.sentences1]
            np.testing.assert_array_equal(a, want)
            assert b.shape == (len(data), 2)


def test_evaluate_sets_one_alpha_from_dev_and_the_average():
    rng = np.random.default_rng(6)

    def pairs(n):
        base = rng.normal(size=(n, 6)) + 2.0
        a, b = base + 0.5 * rng.normal(size=base.shape), base + 0.5 * rng.normal(size=base.shape)
        gold = -np.linalg.norm(a - b, axis=1) + 0.1 * rng.normal(size=n)
        return a.astype(np.float32), b.astype(np.float32), gold

    sets, dev = {"x": pairs(40), "y": pairs(30)}, pairs(50)
    out = sts.evaluate_sets(
        sets, [sts.Transform("raw"), sts.Transform("softdecay", alpha=-0.9)], dev=dev, alphas=(-0.2, -0.5, -0.9)
    )
    best, scores = sts.search_alpha(*dev, alphas=(-0.2, -0.5, -0.9))
    assert out["alpha_search"] == {"spearman": {str(k): v for k, v in scores.items()}, "best": best}
    raw = {k: 100 * scipy.stats.spearmanr(sts.cosine_scores(a, b), g).statistic for k, (a, b, g) in sets.items()}
    assert [rows[0]["spearman"] for rows in out["sets"].values()] == pytest.approx(list(raw.values()))
    assert out["sets"]["x"][1]["method"] == f"softdecay (alpha={best:g})"
    assert out["average"]["raw"] == pytest.approx(np.mean(list(raw.values())))
    assert set(out["average"]) == {"raw", f"softdecay (alpha={best:g})"}
    fixed = sts.evaluate_sets(sets, [sts.Transform("softdecay", alpha=-0.9)])
    assert "alpha_search" not in fixed and fixed["sets"]["y"][0]["method"] == "softdecay (alpha=-0.9)"
