"""Writing experiment results: a Markdown table with the command, commit and machine that made it, plus JSON."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from experiments.tooling.files import write_atomic, write_json

EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(EXPERIMENTS)
"""The repository's root (the experiments are run from there: ``python -m experiments.<package>.<name>``)."""
RESULTS = os.path.join(EXPERIMENTS, "results")
# The original data releases (STS12-16, SICK, GLUE) beside the repository, where CI and these machines keep them.
SHARED_DATA = os.path.normpath(os.path.join(ROOT, "..", "shared", "data"))


def module_path(name: str) -> str:
    """The dotted module of an experiment by its file name: ``"glue_power"`` ->
    ``"experiments.reproductions.glue_power"`` (reproductions, benchmarks, tooling or the top level), or of an
    experiment package run as ``python -m``: ``"campaign"`` -> ``"experiments.campaign"``."""
    if os.path.isfile(os.path.join(EXPERIMENTS, name, "__main__.py")):
        return f"experiments.{name}"
    for package in ("", "reproductions", "benchmarks", "tooling"):
        if os.path.isfile(os.path.join(EXPERIMENTS, package, f"{name}.py")):
            return ".".join(["experiments", *([package] if package else []), name])
    raise ValueError(f"no experiment module {name!r} under {EXPERIMENTS}")


def provenance(module: str) -> dict[str, str]:
    """Command line (``python -m experiments.<package>.<module> ...``), git commit (marked if the tree was dirty),
    machine and date."""

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = " (uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    dev = jax.devices()[0]
    return {
        "command": f"python -m {module_path(module)} {shlex.join(sys.argv[1:])}".strip(),
        "commit": (git("rev-parse", "--short", "HEAD") or "unknown") + dirty,
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, jax {jax.__version__} on {dev.platform} "
        f"({dev.device_kind})",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def display_name(model: str) -> str:
    """The model's Hub name for tables (``default`` -> sentence-transformers/all-MiniLM-L6-v2)."""
    from isojax.models.hub import DEFAULT_MODEL

    return DEFAULT_MODEL if model == "default" else model


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub Markdown table; floats with two decimals unless they are small (then four)."""

    def cell(v):
        if isinstance(v, float):
            return f"{v:.4f}" if abs(v) < 1 else f"{v:.2f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# Isotropy columns of the fine-tuning tables: keys of isojax.train.evaluation's records, headers, decimals.
# The shrink paper's centered anisotropy sigma_1^2 / sum sigma_i^2 of the centered embeddings is EV1 by
# definition, so it has no column of its own.
ISOTROPY_COLUMNS = (
    ("isoscore", "IsoScore", 4),
    ("ev1", "EV1 (= aniso c)", 4),
    ("ev2", "EV2", 4),
    ("ev3", "EV3", 4),
    ("anisotropy", "aniso (raw)", 4),
    ("I1", "I1(W)", 4),
    ("I2", "I2(W)", 4),
)


def mean_std(values, digits: int) -> str:
    """``mean ± std`` (population std over seeds) of the values that are not None; one value alone has no
    ``±``; none at all gives ``–``."""
    a = np.asarray([v for v in values if v is not None], np.float64)
    if not len(a):
        return "–"
    return f"{a.mean():.{digits}f} ± {a.std():.{digits}f}" if len(a) > 1 else f"{a.mean():.{digits}f}"


def seeds_table(rows: dict[str, list[dict]], columns) -> str:
    """A Markdown table with one line per ``rows`` entry (name -> one record per seed) and the column
    ``(key, header, decimals)`` of each record as mean ± std over the seeds."""
    return markdown_table(
        ["method", "seeds", *(header for _, header, _ in columns)],
        [
            [name, len(records), *(mean_std([r.get(key) for r in records], digits) for key, _, digits in columns)]
            for name, records in rows.items()
        ],
    )


def write_result(
    name: str, title: str, sections: list[str], payload: dict, prov: dict | None = None, directory: str = RESULTS
) -> str:
    """Write ``<directory>/<name>.md`` (title, provenance, sections) and ``<name>.json``, each written whole
    (through a ``.part`` file); return the .md path.

    ``name`` is also the experiment's module name (``python -m experiments.<name>``). ``prov``: the provenance
    to record (default: :func:`provenance` now; an experiment that runs long takes it before it runs)."""
    prov = provenance(name) if prov is None else prov
    header = [f"# {title}", "", *(f"- {k}: `{v}`" for k, v in prov.items()), ""]
    path = os.path.join(directory, f"{name}.md")
    write_atomic(Path(path), "\n".join(header + [s.rstrip() + "\n" for s in sections]).encode())
    write_json(Path(directory, f"{name}.json"), {"provenance": prov, **payload})
    return path
