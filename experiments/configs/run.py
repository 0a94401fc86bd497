"""Expand a GLUE run configuration (``experiments/configs/*.json``) into ``isojax finetune`` runs and run them.

    python -m experiments.configs.run experiments/configs/isotropy_calibration_glue.json [--dry-run]
        [--only task=rte,mrpc method=cosine] [--set devices=8 parallel=pmap] [--out runs]

A configuration holds ``defaults`` (``isojax finetune`` options, named as on the command line without ``--``),
a ``grid`` (option -> list of values; every combination is one run, ``seed`` included), and ``overrides``
(``{"when": {option: value or [values]}, "set": {option: value}}``, applied in order to the runs that match).
Each run writes to ``<out>/<config name>/<task>_<model>_<method>_seed<seed>/`` and resumes from there when
started again. ``--dry-run`` prints the commands.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import sys


def _matches(run: dict, when: dict) -> bool:
    return all(run.get(k) in (v if isinstance(v, list) else [v]) for k, v in when.items())


def expand(config: dict, name: str, out: str = "runs") -> list[list[str]]:
    """The ``isojax finetune`` argument lists of every run of ``config`` (see the module docstring)."""
    grid = config["grid"]
    runs = []
    for values in itertools.product(*grid.values()):
        run = {**config.get("defaults", {}), **dict(zip(grid, values))}
        for override in config.get("overrides", []):
            if _matches(run, override["when"]):
                run.update(override["set"])
        model = str(run["model"]).rstrip("/").split("/")[-1]
        run.setdefault("out", os.path.join(out, name, f"{run['task']}_{model}_{run['method']}_seed{run['seed']}"))
        args = ["finetune"]
        for key, value in run.items():
            if value is True:
                args.append(f"--{key}")
            elif value is not False and value is not None:
                args += [f"--{key}", str(value)]
        runs.append(args)
    return runs


def _pairs(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        out[key] = value.split(",") if "," in value else value
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="a JSON run configuration")
    ap.add_argument("--only", nargs="*", default=[], metavar="KEY=V1,V2", help="keep the runs with these values")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override an option in every run")
    ap.add_argument("--out", default="runs", help="root of the run directories (default runs)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)
    with open(args.config) as f:
        config = json.load(f)
    name = os.path.splitext(os.path.basename(args.config))[0]
    config["overrides"] = config.get("overrides", []) + [{"when": {}, "set": _pairs(args.set)}]
    only = {k: [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in _pairs(args.only).items()}
    runs = [r for r in expand(config, name, args.out)
            if all(r[r.index(f"--{k}") + 1] in v for k, v in only.items() if f"--{k}" in r)]
    print(f"{name}: {len(runs)} runs ({config.get('paper', '')})")
    from isojax.cli import main as isojax_main

    for run in runs:
        print("isojax " + shlex.join(run), flush=True)
        if not args.dry_run and isojax_main(run) != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
