"""Evaluation metrics of fine-tuning.

References: the binary phi coefficient from the 2x2 counts and, for several classes, MCC as the correlation of
one-hot label/prediction matrices (Gorodkin 2004, written with numpy covariances); F1 from counted TP/FP/FN;
scipy's Pearson and Spearman; numpy PCA and SVD for the explained variance and anisotropy; the ``isoscore``
package; the partition function Z(c) = sum_w exp(c.w) over numpy's eigenvectors of W^T W, both signs.
"""

import numpy as np
import pytest
import scipy.stats
from conftest import require

from isojax.data.glue import glue_task
from isojax.train.evaluation import binary_f1, isotropy_metrics, matthews_corrcoef, task_metrics

RNG = np.random.default_rng(0)


def test_mcc_binary_is_the_phi_coefficient():
    y, p = RNG.integers(0, 2, 200), RNG.integers(0, 2, 200)
    p[:120] = y[:120]
    tp, tn = np.sum((y == 1) & (p == 1)), np.sum((y == 0) & (p == 0))
    fp, fn = np.sum((y == 0) & (p == 1)), np.sum((y == 1) & (p == 0))
    phi = (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    assert matthews_corrcoef(y, p, 2) == pytest.approx(phi, rel=1e-12)


def test_mcc_multiclass_is_the_correlation_of_one_hot_matrices():
    y, p = RNG.integers(0, 3, 300), RNG.integers(0, 3, 300)
    p[:150] = y[:150]
    x1, x2 = np.eye(3)[y], np.eye(3)[p]
    cov = lambda a, b: np.sum((a - a.mean(0)) * (b - b.mean(0)))  # noqa: E731
    assert matthews_corrcoef(y, p, 3) == pytest.approx(cov(x1, x2) / np.sqrt(cov(x1, x1) * cov(x2, x2)), rel=1e-12)
    assert matthews_corrcoef(y, np.zeros_like(y), 3) == 0.0  # constant prediction: undefined -> 0


def test_binary_f1_and_task_metrics():
    y, p = RNG.integers(0, 2, 100), RNG.integers(0, 2, 100)
    tp, fp, fn = np.sum((y == 1) & (p == 1)), np.sum((y == 0) & (p == 1)), np.sum((y == 1) & (p == 0))
    assert binary_f1(y, p) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    logits = np.stack([-p, p], 1).astype(np.float32)
    out = task_metrics(glue_task("mrpc"), logits, y)
    assert out["accuracy"] == pytest.approx(100 * np.mean(p == y))
    assert out["f1"] == pytest.approx(100 * binary_f1(y, p))
    assert set(task_metrics(glue_task("mnli"), RNG.normal(size=(30, 3)), RNG.integers(0, 3, 30))) == {
        "accuracy",
        "matthews_corrcoef",
    }
    scores, pred = RNG.uniform(0, 5, 50), RNG.normal(size=(50, 1))
    reg = task_metrics(glue_task("stsb"), pred, scores)
    assert reg["pearson"] == pytest.approx(100 * scipy.stats.pearsonr(pred[:, 0], scores)[0], rel=1e-6)
    assert reg["spearman"] == pytest.approx(100 * scipy.stats.spearmanr(pred[:, 0], scores)[0], rel=1e-6)


def test_isotropy_metrics_match_numpy_and_isoscore_package():
    x = RNG.normal(size=(300, 8)) * np.linspace(3, 0.5, 8) + 2.0
    w = RNG.normal(size=(50, 8)) + 0.3
    got = isotropy_metrics(x, w)
    pca = np.sort(np.linalg.eigvalsh(np.cov(x.T)))[::-1]
    for k in (1, 2, 3):
        assert got[f"ev{k}"] == pytest.approx(pca[:k].sum() / pca.sum(), rel=1e-4)
    s = np.linalg.svd(x, compute_uv=False)
    assert got["anisotropy"] == pytest.approx(s[0] ** 2 / np.sum(s**2), rel=1e-4)
    assert got["anisotropy_centered"] == pytest.approx(got["ev1"], rel=1e-6)
    assert got["isoscore"] == pytest.approx(float(require("IsoScore.IsoScore").IsoScore(x)), rel=1e-3)
    _, vecs = np.linalg.eigh(w.T @ w)
    z = np.exp(np.concatenate([w @ vecs, -(w @ vecs)], 1)).sum(0)
    assert got["I1"] == pytest.approx(z.min() / z.max(), rel=1e-4)
    assert got["I2"] == pytest.approx(z.std() / z.mean(), rel=1e-4)
