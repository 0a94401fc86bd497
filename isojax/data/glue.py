"""GLUE tasks (Wang et al., 2019) as columns of texts and labels.

Read through ``datasets`` from ``nyu-mll/glue`` on the Hub, or from a local directory in the same
layout (``{task}/{split}-00000-of-00001.parquet``, or the task's files directly in the directory), or
one local file; columns as on the Hub (``sentence`` / ``sentence1, sentence2`` / ``question, sentence``
/ ``question1, question2`` / ``premise, hypothesis``; ``label``; ``idx``). STS-B falls back to the
offline PyPI package (see :mod:`isojax.data.sts`) when the Hub cannot be reached. GLUE test splits
are unlabelled: their labels are ``-1`` (the package copy of the STS-B test set does carry scores).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from isojax.data.sts import load_stsb
from isojax.data.tables import load_table

__all__ = ["GLUE_HUB_ID", "GLUE_TASKS", "GlueData", "GlueTask", "glue_task", "load_glue"]

GLUE_HUB_ID = "nyu-mll/glue"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlueTask:
    """Static description of a GLUE task.

    ``num_labels == 1`` means regression (STS-B, scores in [0, 5]); ``metrics`` are the task's
    official GLUE metrics, named as in ``sklearn``/``scipy``.
    """

    name: str
    text_columns: tuple[str, ...]
    num_labels: int
    metrics: tuple[str, ...]
    splits: tuple[str, ...] = ("train", "validation", "test")

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


_MNLI_SPLITS = ("train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched")
GLUE_TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("cola", ("sentence",), 2, ("matthews_corrcoef",)),
    GlueTask("sst2", ("sentence",), 2, ("accuracy",)),
    GlueTask("mrpc", ("sentence1", "sentence2"), 2, ("accuracy", "f1")),
    GlueTask("qqp", ("question1", "question2"), 2, ("accuracy", "f1")),
    GlueTask("stsb", ("sentence1", "sentence2"), 1, ("pearson", "spearman")),
    GlueTask("mnli", ("premise", "hypothesis"), 3, ("accuracy",), _MNLI_SPLITS),
    GlueTask("qnli", ("question", "sentence"), 2, ("accuracy",)),
    GlueTask("rte", ("sentence1", "sentence2"), 2, ("accuracy",)),
    GlueTask("wnli", ("sentence1", "sentence2"), 2, ("accuracy",)),
)}


@dataclass(frozen=True)
class GlueData:
    """One split of a GLUE task: ``texts_a[i]`` (and ``texts_b[i]`` for pair tasks) with ``labels[i]``.

    ``labels`` is ``[n]`` int32 class ids (classification) or float32 scores (STS-B); ``-1`` marks an
    unlabelled row (GLUE test splits).
    """

    texts_a: list[str]
    texts_b: list[str] | None
    labels: np.ndarray
    task: GlueTask
    split: str

    def __len__(self) -> int:
        return len(self.texts_a)


def glue_task(task: str) -> GlueTask:
    """Look a task up by name, ignoring case and dashes (``"SST-2"`` -> ``sst2``); unknown -> ``ValueError``."""
    key = str(task).lower().replace("-", "").replace("_", "")
    if key not in GLUE_TASKS:
        raise ValueError(f"task: unknown GLUE task {task!r}; expected one of {sorted(GLUE_TASKS)}")
    return GLUE_TASKS[key]


def _from_table(task: GlueTask, split: str, source) -> GlueData:
    table = load_table(source, split, config=task.name)
    table.require([*task.text_columns, "label"])
    texts = [table.text(c) for c in task.text_columns]
    if task.is_regression:
        labels = table.number("label", low=0.0, high=5.0, allowed=(-1.0,)).astype(np.float32)
    else:
        labels = table.number("label", low=0, high=task.num_labels - 1, integer=True,
                              allowed=(-1.0,)).astype(np.int32)
    return GlueData(texts[0], texts[1] if task.is_pair else None, labels, task, split)


def _stsb_package(spec: GlueTask, split: str, cache_dir) -> GlueData:
    sts = load_stsb(split, source="package", cache_dir=cache_dir)
    return GlueData(sts.sentences1, sts.sentences2, sts.scores.astype(np.float32), spec, split)


def load_glue(task: str, split: str = "train", *, source="auto", cache_dir=None) -> GlueData:
    """Load ``split`` of a GLUE ``task``.

    ``source``: ``"auto"`` (the Hub; for STS-B the offline package when the Hub is unreachable),
    ``"hub"``, ``"package"`` (STS-B only), or a local file/directory in the Hub's layout.
    ``split``: one of the task's ``splits`` (MNLI: ``validation_matched`` etc.); ``"dev"`` means
    ``"validation"``.
    """
    spec = glue_task(task)
    split = "validation" if split == "dev" and "validation" in spec.splits else split
    if split not in spec.splits:
        raise ValueError(f"split: GLUE {spec.name} has splits {list(spec.splits)}, got {split!r}")
    if source == "package":
        if spec.name != "stsb":
            raise ValueError(f"source: only stsb has an offline package, not {spec.name}")
        return _stsb_package(spec, split, cache_dir)
    try:
        return _from_table(spec, split, GLUE_HUB_ID if source in ("auto", "hub") else source)
    except ConnectionError as e:
        if source == "auto" and spec.name == "stsb":
            log.info("GLUE stsb: Hub unreachable (%s); reading the offline package files", e)
            return _stsb_package(spec, split, cache_dir)
        raise ConnectionError(f"GLUE {spec.name} is read from the Hub ({GLUE_HUB_ID}), which cannot be "
                              f"reached: {e}. Pass source=<local directory in the same layout, e.g. "
                              f"{spec.name}/{split}-00000-of-00001.parquet>") from e
