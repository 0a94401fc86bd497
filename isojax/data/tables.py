"""Column tables read through 🤗 ``datasets`` from a Hub id or from local files in the Hub's layout.

Every dataset that isojax loads through ``datasets`` (GLUE, STS12–16, SICK-R, STS-B) goes through
:func:`load_table`, so the Hub path and the local-file path are one code path: a local directory
laid out like the Hub repository (``test.jsonl.gz``, ``cola/train-00000-of-00001.parquet``, ...) or a
single CSV/TSV/JSON Lines/Parquet file is read with ``datasets.load_dataset("csv"|"json"|"parquet")``.

Each row remembers where it came from, so a bad value is reported as ``file: line N`` (CSV/TSV with
a header row and one line per record, ``.jsonl``) or ``file: row N`` (``.json``, Parquet, the Hub),
both 1-based. ``datasets`` honours ``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE``: offline, a Hub id is
served from the local ``datasets`` cache or fails at once with ``ConnectionError``.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import socket
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from isojax.data.utf8 import not_utf8

__all__ = ["Table", "load_table", "local_files"]

log = logging.getLogger(__name__)

# suffix -> (datasets builder, extra builder kwargs, first data line of row 0 or None for "row N")
_FORMATS = {
    ".csv": ("csv", {}, 2),
    ".tsv": ("csv", {"sep": "\t"}, 2),
    ".jsonl": ("json", {}, 1),
    ".json": ("json", {}, None),  # JSON Lines or one JSON array: count records
    ".parquet": ("parquet", {}, None),
}


def _format(path: Path):
    suffixes = path.suffixes[-2:]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    fmt = _FORMATS.get(suffixes[-1].lower() if suffixes else "")
    if fmt is None or (fmt[0] == "parquet" and path.suffix == ".gz"):
        raise ValueError(
            f"source: cannot read {path}; expected one of {sorted(_FORMATS)} (optionally .gz, not for parquet)"
        )
    return fmt


@dataclass(frozen=True)
class _Part:
    """A contiguous block of rows from one file (or one Hub split)."""

    name: str
    start: int
    stop: int
    numbers: Sequence[int]  # 1-based line (or row) number of each row of the block
    unit: str = "line"  # "line", or "row" where the file's records are counted, not its lines

    def where(self, i: int) -> str:
        return f"{self.name}: {self.unit} {self.numbers[i - self.start]}"


@dataclass(frozen=True)
class Table:
    """Columns of one split, and where each row came from (for error messages).

    Attributes:
      columns: column name -> its ``len(table)`` values.
      parts: the files (or Hub splits) the rows came from, in order, with each row's line.
    """

    columns: dict[str, list]
    parts: tuple[_Part, ...]

    @classmethod
    def from_file(cls, name: str, columns: dict[str, list], lines: Sequence[int]) -> Table:
        """The rows of one file: row ``i`` of every column came from line ``lines[i]`` (1-based) of ``name``."""
        return cls(columns, (_Part(name, 0, len(lines), lines),))

    def rename(self, names: dict[str, str]) -> Table:
        """The columns ``names.values()`` under the new names ``names.keys()`` (missing ones: ``ValueError``)."""
        self.require(list(names.values()))
        return Table({new: self.columns[old] for new, old in names.items()}, self.parts)

    def __len__(self) -> int:
        return self.parts[-1].stop if self.parts else 0

    def where(self, i: int) -> str:
        """``file: line N`` (or ``row N``) of row ``i``."""
        return next(p for p in self.parts if p.start <= i < p.stop).where(i)

    @property
    def origin(self) -> str:
        return ", ".join(p.name for p in self.parts)

    def require(self, names) -> None:
        """Raise ``ValueError`` naming the source unless every column in ``names`` is present."""
        missing = [n for n in names if n not in self.columns]
        if missing:
            raise ValueError(f"{self.origin}: missing column(s) {missing}; found {sorted(self.columns)}")

    def text(self, name: str) -> list[str]:
        """Column ``name`` as ``list[str]``; a missing or non-string value is a ``ValueError`` at its line."""
        self.require([name])
        values = self.columns[name]
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise ValueError(f"{self.where(i)}: column {name!r} must be text, got {v!r}")
        return list(values)

    def sentences(self, name: str) -> list[str]:
        """Column ``name`` as :meth:`text`, each value holding a non-space character: an empty or
        whitespace-only sentence is a ``ValueError`` at its line (drop such rows first with
        :meth:`without_blank` where that is the documented handling)."""
        values = self.text(name)
        for i, v in enumerate(values):
            if not v.strip():
                raise ValueError(
                    f"{self.where(i)}: column {name!r} is empty{' (whitespace only)' if v else ''}; "
                    "every sentence must hold text"
                )
        return values

    def take(self, rows: Sequence[int]) -> Table:
        """Rows ``rows`` (increasing indices), each still reported at its own file and line."""
        rows = list(rows)
        parts, start = [], 0
        for p in self.parts:
            kept = [p.numbers[i - p.start] for i in rows if p.start <= i < p.stop]
            parts.append(_Part(p.name, start, start + len(kept), kept, p.unit))
            start += len(kept)
        return Table({k: [v[i] for i in rows] for k, v in self.columns.items()}, tuple(parts))

    def without_blank(self, names) -> Table:
        """This table without its rows whose text in a column of ``names`` is empty or whitespace only; how
        many were left out, and where the first ones were, is logged as a warning."""
        self.require(names)
        blank = {i for name in names for i, v in enumerate(self.columns[name]) if isinstance(v, str) and not v.strip()}
        if not blank:
            return self
        first = "; ".join(self.where(i) for i in sorted(blank)[:3])
        log.warning(
            "%s: skipped %d of %d rows with an empty text in %s (first: %s)",
            self.origin,
            len(blank),
            len(self),
            ", ".join(names),
            first,
        )
        return self.take([i for i in range(len(self)) if i not in blank])

    def number(self, name: str, *, low=None, high=None, integer=False, allowed=(), classes=()) -> np.ndarray:
        """Column ``name`` as float64; each value must be finite, within ``[low, high]`` (and an integer
        when ``integer``) unless it is one of ``allowed`` (e.g. GLUE's ``-1`` for an unlabelled test row).
        Text values are parsed as numbers; a value equal to ``classes[k]`` (a label name) reads as ``k``."""
        self.require([name])
        values = self.columns[name]
        ids = {c: k for k, c in enumerate(classes)}
        if ids:
            values = [ids.get(v, v) if isinstance(v, str) else v for v in values]
        try:
            out = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            out = np.array([_to_float(v) for v in values], dtype=np.float64)
        ok = np.isfinite(out)
        if integer:
            ok &= out == np.round(out)
        if low is not None:
            ok &= out >= low
        if high is not None:
            ok &= out <= high
        ok |= np.isin(out, allowed)
        if not ok.all():
            i = int(np.argmin(ok))
            where, v = f"{self.where(i)}: column {name!r}", values[i]
            if not np.isfinite(out[i]):
                what = f"one of {list(classes)} or a class id" if classes else "a finite number"
                raise ValueError(f"{where} must be {what}, got {v!r}")
            if integer and out[i] != round(out[i]):
                raise ValueError(f"{where} must be an integer, got {v!r}")
            extra = f" or one of {list(allowed)}" if allowed else ""
            raise ValueError(f"{where} must lie in [{low}, {high}]{extra}, got {v!r}")
        return out


def _to_float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def local_files(directory, split: str) -> list[Path]:
    """Data files of ``split`` in ``directory`` or its ``data/`` folder, named like the Hub's files:
    ``{split}.{ext}`` or ``{split}-{anything}.{ext}`` (``test.jsonl.gz``, ``train-00000-of-00001.parquet``).

    Other sub-directories are not searched (in a GLUE copy they hold the other tasks), and
    ``validation`` does not match ``validation_matched-*``, unlike ``datasets``' own split inference.

    Args:
      directory: the local copy.
      split: the split's name.

    Returns:
      The matching files, sorted; ``FileNotFoundError`` naming the expected names when there is none.

    Examples:
      >>> import tempfile
      >>> root = Path(tempfile.mkdtemp())
      >>> (root / "data").mkdir()
      >>> for name in ("validation.jsonl", "data/validation-00000-of-00001.parquet", "validation_matched.jsonl"):
      ...     _ = (root / name).write_text("")
      >>> [str(p.relative_to(root)) for p in local_files(root, "validation")]
      ['data/validation-00000-of-00001.parquet', 'validation.jsonl']
    """
    directory = Path(directory)
    pattern = re.compile(rf"{re.escape(split)}([-.].*)?")
    files = sorted(
        p
        for folder in (directory, directory / "data")
        if folder.is_dir()
        for p in folder.iterdir()
        if p.is_file() and pattern.fullmatch(p.name) and _is_data(p)
    )
    if not files:
        raise FileNotFoundError(
            f"source: no file for split {split!r} in {directory} or {directory / 'data'} (expected e.g. "
            f"{split}.jsonl.gz, {split}.csv or {split}-00000-of-00001.parquet)"
        )
    return files


def _is_data(path: Path) -> bool:
    try:
        _format(path)
    except ValueError:
        return False
    return True


def _read_file(path: Path) -> dict[str, list]:
    """The columns of one local file, read by ``datasets``."""
    import datasets

    builder, kwargs, _ = _format(path)
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs).to_dict()
    except UnicodeDecodeError:  # the json builder keeps undecodable bytes; converting them to Python fails
        raise not_utf8(path) from None
    except datasets.exceptions.DatasetGenerationError as e:
        if isinstance(e.__cause__, UnicodeDecodeError):  # the csv builder fails while reading
            raise not_utf8(path) from None
        raise ValueError(f"{path}: cannot read as {builder}: {e.__cause__ or e}") from e


@functools.lru_cache(maxsize=1)
def _hub_unreachable_reason() -> str | None:
    """Why the Hub cannot be used right now (offline flag, or no TCP connection in 3 s), or None."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return None  # datasets serves its cache, or fails at once, by itself
    host = urllib.parse.urlparse(constants.ENDPOINT).hostname
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError as e:
        return f"{host} is unreachable ({e})"
    return None


def _require_hub() -> None:
    """Fail at once with ``ConnectionError`` when the Hub is unreachable (``datasets`` would retry for ~20 s)."""
    reason = _hub_unreachable_reason()
    if reason:
        raise ConnectionError(f"Hugging Face Hub: {reason}; set HF_DATASETS_OFFLINE=1 to read its cache")


def load_table(source, split: str, *, config: str | None = None) -> Table:
    r"""Read one split from a Hub dataset id or a local file/directory in the same layout.

    Args:
      source: an existing local file (read whole, whatever ``split`` is), an existing local directory
        (its files for ``split``, see :func:`local_files`; in ``source/config/`` when that
        sub-directory exists, as in the GLUE repository),
        or a Hub dataset id (``datasets.load_dataset(source, config, split=split)``).
      split: split name, e.g. ``"train"``, ``"validation_matched"``, ``"test"``.
      config: Hub configuration (GLUE task); for a local directory, the optional sub-directory.

    Returns:
      A :class:`Table` of the split's columns, rows in file order (several files: concatenated).

    Examples:
      >>> import tempfile
      >>> path = Path(tempfile.mkdtemp()) / "dev.csv"
      >>> _ = path.write_text("sentence1,sentence2,score\nA cat.,A kitten.,4.2\n")
      >>> table = load_table(path, "validation")
      >>> table.columns["sentence2"], len(table)
      (['A kitten.'], 1)
    """
    import datasets

    path = Path(os.fspath(source)).expanduser()
    if path.is_file() or path.is_dir():
        if path.is_dir():
            sub = path / config if config else path
            files = local_files(sub if sub.is_dir() else path, split)
        else:
            files = [path]
        pieces = [(str(f), _read_file(f), _format(f)[2]) for f in files]
    else:
        _require_hub()
        ds = datasets.load_dataset(str(source), config, split=split)
        pieces = [(f"{source}{'/' + config if config else ''} [{split}]", ds.to_dict(), None)]

    columns: dict[str, list] = {}
    parts: list[_Part] = []
    start = 0
    for name, piece, first_line in pieces:  # piece: {column: values}, from one Arrow conversion
        if parts and sorted(piece) != sorted(columns):
            raise ValueError(f"{name}: columns {sorted(piece)} differ from {sorted(columns)} in {parts[0].name}")
        for col, values in piece.items():
            columns.setdefault(col, []).extend(values)
        n = len(next(iter(piece.values()), ()))
        numbers = range(first_line or 1, (first_line or 1) + n)
        parts.append(_Part(name, start, start + n, numbers, "line" if first_line else "row"))
        start += n
    return Table(columns, tuple(parts))
