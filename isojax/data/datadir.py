"""The data directory: where isojax reads the original releases of the evaluation sets.

The loaders of :mod:`isojax.data` take it as ``data_dir=`` (on the command line ``--data-dir``); without
it they use the environment variable ``ISOJAX_DATA_DIR``; without either they read the Hugging Face Hub.
Its layout is that of the project's ``../shared/data``::

    sts/STS12 ... sts/STS16   SemEval STS release folders: STS.input.<name>.txt + STS.gs.<name>.txt
                              (STS16: STS2016.input.<name>.txt + STS2016.gs.<name>.txt)
    sick/                     SICK_train.txt, SICK_trial.txt, SICK_test_annotated.txt (SemEval-2014 task 1)
    glue/<Task>/              GLUE's download-script files: CoLA, SST-2, MRPC, RTE, WNLI, STS-B, QNLI, QQP, MNLI
                              with train.tsv, dev.tsv, test.tsv (MNLI: dev_matched.tsv, dev_mismatched.tsv, ...)

A directory may hold only some of them. Not to be confused with ``ISOJAX_DATA``, the cache of files fetched
from PyPI (:mod:`isojax.data.assets`; STS-B and the word-similarity sets come from there).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DATA_DIR_ENV", "DATA_DIR_HELP", "DATA_DIR_HINT", "release_path", "resolve_data_dir"]

DATA_DIR_ENV = "ISOJAX_DATA_DIR"
DATA_DIR_HINT = (
    f"pass data_dir=DIR (command line: --data-dir DIR) or set {DATA_DIR_ENV}=DIR, DIR holding the "
    "original releases (sts/STS12..STS16, sick/, glue/<Task>/)"
)
DATA_DIR_HELP = (
    f"directory of the original data releases: sts/STS12..STS16, sick/, glue/<Task>/ (default "
    f"${DATA_DIR_ENV}; without either, the Hugging Face Hub)"
)


def resolve_data_dir(source, data_dir) -> Path | None:
    """The data directory a loader reads, or ``None`` when it reads ``source`` instead.

    ``source`` ``"auto"`` (or ``None``) reads ``data_dir``, else ``$ISOJAX_DATA_DIR``, else nothing (``None``:
    the Hub). Any other ``source`` is read as asked, and passing ``data_dir`` with it is a ``ValueError``.
    A data directory that does not exist is a ``FileNotFoundError``.

    Args:
      source: a loader's ``source`` argument.
      data_dir: a loader's ``data_dir`` argument (a path), or None.

    Returns:
      The directory as a ``Path``, or None.

    Examples:
      >>> import tempfile
      >>> root = tempfile.mkdtemp()
      >>> resolve_data_dir("auto", root) == Path(root), resolve_data_dir("hub", None)
      (True, None)
    """
    if source not in (None, "auto"):
        if data_dir is not None:
            raise ValueError(
                f"data_dir: the original release files are read with source='auto' (the default); "
                f"got source={source!r} as well, pass one of the two"
            )
        return None
    origin = "data_dir"
    if data_dir is None:
        data_dir, origin = os.environ.get(DATA_DIR_ENV) or None, f"${DATA_DIR_ENV}"
        if data_dir is None:
            return None
    path = Path(os.fspath(data_dir)).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"{origin}: {path} is not a directory; expected a directory of the original "
            "releases (sts/STS12..STS16, sick/, glue/<Task>/)"
        )
    return path


def release_path(data_dir: Path, relative: str, what: str) -> Path:
    """``data_dir / relative``, or a ``FileNotFoundError`` naming the missing path, ``what`` it should hold
    and the expected layout.

    Args:
      data_dir: the data directory.
      relative: the path expected in it.
      what: what that path holds, for the error.

    Returns:
      The existing path.

    Examples:
      >>> import tempfile
      >>> release_path(Path(tempfile.mkdtemp()), "sick", "SICK release folder")
      Traceback (most recent call last):
      ...
      FileNotFoundError: .../sick: not found; the data directory ... has no SICK release folder (expected sick in the layout of isojax.data.datadir)
    """
    path = Path(data_dir) / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: not found; the data directory {data_dir} has no {what} "
            f"(expected {relative} in the layout of isojax.data.datadir)"
        )
    return path
