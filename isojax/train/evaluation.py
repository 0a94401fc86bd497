"""Evaluation during fine-tuning: the task metrics and the isotropy of the evaluated embeddings.

Task metrics (×100, named as GLUE's): ``accuracy``, ``f1`` (binary tasks, positive class 1),
``matthews_corrcoef`` (MCC, multi-class form of Gorodkin 2004 = the binary phi coefficient for two classes),
``pearson``, ``spearman`` (regression).

Isotropy of the embeddings the head reads (``head_input``, [CLS] or pooled, after IsoBN / Isotropy Layer), as in
the papers' tables: ``isoscore`` (isotropy-layer Table 2), ``ev1 ev2 ev3`` the cumulative explained variance
of the top 1-3 principal components (isotropy-layer Table 3), ``anisotropy`` and ``anisotropy_centered``
(sigma_1^2 / sum sigma_i^2 of the raw and centered embeddings, shrink-the-longest Table 3), and the
partition-function isotropy ``I1`` / ``I2`` of the word (= output) embedding matrix (calibration-evaluation
Table 4).
"""

from __future__ import annotations

import jax
import numpy as np

from isojax import metrics
from isojax.data.glue import GlueTask
from isojax.eval.sts import correlations
from isojax.train.feed import Rows, Split, batch_indices, process_batches
from isojax.train.model import word_embeddings

ISOTROPY_KEYS = ("isoscore", "ev1", "ev2", "ev3", "anisotropy", "anisotropy_centered", "I1", "I2")


def matthews_corrcoef(labels, predictions, num_classes: int) -> float:
    """MCC from the confusion matrix C (rows = true class): ``(c s - t.p) / sqrt((s^2 - p.p)(s^2 - t.t))``
    with ``c = trace C``, ``s = sum C``, ``t``/``p`` the true/predicted class counts; 0 when undefined."""
    conf = np.zeros((num_classes, num_classes), np.float64)
    np.add.at(conf, (np.asarray(labels), np.asarray(predictions)), 1)
    t, p, c, s = conf.sum(1), conf.sum(0), np.trace(conf), conf.sum()
    den = np.sqrt((s * s - p @ p) * (s * s - t @ t))
    return float((c * s - t @ p) / den) if den > 0 else 0.0


def binary_f1(labels, predictions) -> float:
    """F1 of the positive class 1: ``2 TP / (2 TP + FP + FN)`` (0 when there are no positives at all)."""
    labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
    tp = np.sum(labels & predictions)
    den = 2 * tp + np.sum(~labels & predictions) + np.sum(labels & ~predictions)
    return float(2 * tp / den) if den else 0.0


def task_metrics(task: GlueTask, logits, labels) -> dict[str, float]:
    """Metrics of predictions ``logits [N, num_labels]`` against ``labels [N]`` (see the module docstring)."""
    logits, labels = np.asarray(logits), np.asarray(labels)
    if task.is_regression:
        return correlations(logits[:, 0], labels)
    predictions = logits.argmax(-1)
    out = {
        "accuracy": 100 * float(np.mean(predictions == labels)),
        "matthews_corrcoef": 100 * matthews_corrcoef(labels, predictions, task.num_labels),
    }
    if task.num_labels == 2:
        out["f1"] = 100 * binary_f1(labels, predictions)
    return out


def isotropy_metrics(embeddings, word_embeddings) -> dict[str, float]:
    """Isotropy of the evaluated ``embeddings [N, H]`` and of the word embedding matrix ``[V, E]``."""
    measures = jax.jit(_isotropy_metrics)(np.asarray(embeddings, np.float32), np.asarray(word_embeddings, np.float32))
    return {name: float(value) for name, value in measures.items()}


def _isotropy_metrics(x, w):
    """The measures of :func:`isotropy_metrics`, jitted by the caller as one call (compiled once per run: the shapes
    are fixed); op by op they are slower."""
    out = {"isoscore": metrics.isoscore(x)}
    for k in (1, 2, 3):
        out[f"ev{k}"] = metrics.explained_variance(x, k, center=True)
    out["anisotropy"] = metrics.anisotropy(x)
    out["anisotropy_centered"] = metrics.anisotropy(x, center=True)
    out["I1"], out["I2"] = metrics.partition_isotropy(w)
    return out


def predict_all(runner, placed_state, data: Rows, batch_size: int) -> dict[str, np.ndarray]:
    """Run ``runner.predict`` over every row of ``data`` in order, each process feeding its rows of each batch
    (:mod:`isojax.train.feed`); the last batch is padded to ``batch_size`` rows (repeats of its first row, dropped
    from the output) so that it divides over the devices."""
    order = batch_indices(len(data), batch_size)
    padded = [np.concatenate([b, np.repeat(b[:1], batch_size - len(b))]) for b in order]
    fed = process_batches(data, padded, runner.process_rows(batch_size))
    chunks = [{k: v[: len(b)] for k, v in runner.predict(placed_state, rows).items()} for b, rows in zip(order, fed)]
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def evaluate(runner, placed_state, data: Split, task: GlueTask, batch_size: int) -> dict[str, float]:
    """Task metrics of the model in ``placed_state`` on ``data`` (all rows, ``batch_size`` per predicted batch) and
    isotropy metrics of its head input and of its word embedding matrix."""
    out = predict_all(runner, placed_state, data, batch_size)
    w = runner.host(word_embeddings(placed_state.params))
    return {**task_metrics(task, out["logits"], data.labels), **isotropy_metrics(out["head_input"], w)}
