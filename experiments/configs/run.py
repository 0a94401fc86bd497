"""Expand a GLUE or sequence-to-sequence run configuration (``experiments/configs/*.json``) into ``isojax finetune`` runs and run them.

    python -m experiments.configs.run experiments/configs/isotropy_calibration_glue.json [--dry-run | --summary]
        [--only task=rte,mrpc method=cosine] [--set devices=8 parallel=pmap] [--out runs]

A configuration holds ``defaults`` (``isojax finetune`` options, named as on the command line without ``--``),
a ``grid`` (option -> list of values; every combination is one run, ``seed`` included), and ``overrides``
(``{"when": {option: value or [values]}, "set": {option: value}}``, applied in order to the runs that match).
Each run writes to ``<out>/<config name>/<task>_<model>_<method>_seed<seed>/`` and resumes from there when
started again. ``--dry-run`` prints the commands. ``--summary`` runs nothing: it reads the finished runs'
``results.json`` and writes ``<out>/<config name>/summary.md``, the papers' table shape: per task and model, one
line per method (``isotropy_layer``: stage 1 and stage 2) with the task metrics and the isotropy of the evaluated
embeddings as mean ± std over seeds, and the number of runs still missing. A sequence-to-sequence task's table has
its generation metrics (BLEU or ROUGE-1/2/L), I1 and I2 of the output embedding matrix and the seconds per epoch
(isotropy-calibration-evaluation Tables 2, 3 and 5).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import sys
from collections import defaultdict


def _matches(run: dict, when: dict) -> bool:
    return all(run.get(k) in (v if isinstance(v, list) else [v]) for k, v in when.items())


def expand_runs(config: dict, name: str, out: str = "runs") -> list[dict]:
    """Every run of ``config`` as a dict of ``isojax finetune`` options (see the module docstring)."""
    grid = config["grid"]
    runs = []
    for values in itertools.product(*grid.values()):
        run = {**config.get("defaults", {}), **dict(zip(grid, values))}
        for override in config.get("overrides", []):
            if _matches(run, override["when"]):
                run.update(override["set"])
        model = str(run["model"]).rstrip("/").split("/")[-1]
        run.setdefault("out", os.path.join(out, name, f"{run['task']}_{model}_{run['method']}_seed{run['seed']}"))
        runs.append(run)
    return runs


def arguments(run: dict) -> list[str]:
    """The ``isojax finetune`` argument list of a run dict."""
    args = ["finetune"]
    for key, value in run.items():
        if value is True:
            args.append(f"--{key}")
        elif value is not False and value is not None:
            args += [f"--{key}", str(value)]
    return args


def expand(config: dict, name: str, out: str = "runs") -> list[list[str]]:
    """The ``isojax finetune`` argument lists of every run of ``config``."""
    return [arguments(run) for run in expand_runs(config, name, out)]


def summary(runs: list[dict], title: str) -> str:
    """Markdown tables of the finished runs (module docstring); a run without ``results.json`` counts as
    missing."""
    from experiments.report import ISOTROPY_COLUMNS, seeds_table
    from isojax.data.glue import glue_task
    from isojax.data.seq2seq import SEQ2SEQ_TASKS

    groups, missing = defaultdict(lambda: defaultdict(list)), defaultdict(int)
    for run in runs:
        key = (str(run["task"]), str(run["model"]))
        path = os.path.join(run["out"], "results.json")
        if not os.path.exists(path):
            missing[key] += 1
            continue
        with open(path) as f:
            results = json.load(f)
        stages = results["stages"]
        for stage, evaluation in stages.items():
            label = run["method"] if len(stages) == 1 else f"{run['method']}: {stage}"
            groups[key][label].append({**evaluation, **results.get("timing", {}).get(stage, {})})
    sections = [f"# {title}"]
    for key in sorted(set(groups) | set(missing)):
        task, model = key
        if task in SEQ2SEQ_TASKS:
            columns = [(m, m, 2) for m in SEQ2SEQ_TASKS[task].metrics] + [
                ("I1", "I1(W)", 2),
                ("I2", "I2(W)", 2),
                ("seconds_per_epoch", "s / epoch", 0),
            ]
        else:
            columns = [(m, m, 2) for m in glue_task(task).metrics] + list(ISOTROPY_COLUMNS)
        sections.append(
            f"## {task}, {model}\n\n{missing[key]} run(s) missing\n\n"
            + (seeds_table(groups[key], columns) if groups[key] else "")
        )
    return "\n\n".join(sections) + "\n"


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
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the commands only")
    mode.add_argument("--summary", action="store_true", help="tabulate the finished runs (module docstring)")
    args = ap.parse_args(argv)
    with open(args.config) as f:
        config = json.load(f)
    name = os.path.splitext(os.path.basename(args.config))[0]
    config["overrides"] = config.get("overrides", []) + [{"when": {}, "set": _pairs(args.set)}]
    only = {k: [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in _pairs(args.only).items()}
    runs = expand_runs(config, name, args.out)
    unknown = sorted(k for k in only if k not in runs[0])
    if unknown:
        raise SystemExit(f"--only: {', '.join(unknown)} is not an option of these runs ({', '.join(runs[0])})")
    runs = [r for r in runs if all(str(r[k]) in v for k, v in only.items())]
    print(f"{name}: {len(runs)} runs ({config.get('paper', '')})")
    if args.summary:
        path = os.path.join(args.out, name, "summary.md")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(summary(runs, f"{name}: {config.get('paper', '')}"))
        print(open(path).read() + f"written: {path}")
        return 0
    from isojax.cli import main as isojax_main

    for run in runs:
        print("isojax " + shlex.join(arguments(run)), flush=True)
        if not args.dry_run and isojax_main(arguments(run)) != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
