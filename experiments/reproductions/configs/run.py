"""Expand a GLUE or sequence-to-sequence run configuration (``experiments/reproductions/configs/*.json``) into fine-tuning runs
(:class:`~isojax.train.config.TrainConfig`) and run them.

    python -m experiments.reproductions.configs.run experiments/reproductions/configs/isotropy_calibration_glue.json [--dry-run | --summary]
        [--only task.name=rte,mrpc method.name=cosine] [--set placement.devices=8 placement.parallel=pmap]
        [--out runs]

A configuration holds ``defaults`` (in the shape of ``TrainConfig.to_json()``, only the settings that differ from
its defaults), a ``grid`` (dotted setting -> list of values; every combination is one run, ``seed`` included), and
``overrides`` (``{"when": {setting: value or [values]}, "set": {setting: value}}`` with dotted settings, applied in
order to the runs that match). Each run writes to ``<out>/<config name>/<task>_<model>_<method>_seed<seed>/``
(``logging.output_dir``) and resumes from there when started again. ``--dry-run`` prints each run's settings.
``--summary`` runs nothing: it reads the finished runs' ``results.json`` and writes ``<out>/<config name>/summary.md``,
the papers' table shape: per task and model, one line per method (``isotropy_layer``: stage 1 and stage 2) with the
task metrics and the isotropy of the evaluated embeddings as mean ± std over seeds, and the number of runs still
missing. A sequence-to-sequence task's table has its generation metrics (BLEU or ROUGE-1/2/L), I1 and I2 of the
output embedding matrix and the seconds per epoch (isotropy-calibration-evaluation Tables 2, 3 and 5).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections import defaultdict

from isojax.train.config import TrainConfig


def _matches(run: dict, when: dict) -> bool:
    return all(run.get(k) in (v if isinstance(v, list) else [v]) for k, v in when.items())


def expand_runs(config: dict, name: str, out: str = "runs") -> list[TrainConfig]:
    """Every run of ``config`` (see the module docstring)."""
    base = TrainConfig.from_json(config.get("defaults", {})).flat_json()
    grid = config["grid"]
    runs = []
    for values in itertools.product(*grid.values()):
        run = {**base, **dict(zip(grid, values))}
        for override in config.get("overrides", []):
            if _matches(run, override["when"]):
                run.update(override["set"])
        model = str(run["model.name"]).rstrip("/").split("/")[-1]
        if run["logging.output_dir"] == base["logging.output_dir"]:
            run["logging.output_dir"] = os.path.join(
                out, name, f"{run['task.name']}_{model}_{run['method.name']}_seed{run['seed']}"
            )
        runs.append(TrainConfig.from_json({}, {k: v for k, v in run.items() if "." in k or k == "seed"}))
    return runs


def summary(runs: list[TrainConfig], title: str) -> str:
    """Markdown tables of the finished runs (module docstring); a run without ``results.json`` counts as
    missing."""
    from experiments.tooling.report import ISOTROPY_COLUMNS, seeds_table
    from isojax.data.glue import glue_task
    from isojax.data.seq2seq import SEQ2SEQ_TASKS

    groups: defaultdict[tuple[str, str], defaultdict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    missing: defaultdict[tuple[str, str], int] = defaultdict(int)
    for run in runs:
        key = (run.task.name, run.model.name)
        path = os.path.join(run.logging.output_dir, "results.json")
        if not os.path.exists(path):
            missing[key] += 1
            continue
        with open(path) as f:
            results = json.load(f)
        stages = results["stages"]
        for stage, evaluation in stages.items():
            label = run.method.name if len(stages) == 1 else f"{run.method.name}: {stage}"
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
    ap.add_argument(
        "--only", nargs="*", default=[], metavar="SETTING=V1,V2", help="keep the runs with these values (dotted)"
    )
    ap.add_argument("--set", nargs="*", default=[], metavar="SETTING=VALUE", help="override a setting in every run")
    ap.add_argument("--out", default="runs", help="root of the run directories (default runs)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the runs' settings only")
    mode.add_argument("--summary", action="store_true", help="tabulate the finished runs (module docstring)")
    args = ap.parse_args(argv)
    try:
        with open(args.config) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        ap.error(f"config {args.config}: {e}")
    name = os.path.splitext(os.path.basename(args.config))[0]
    config["overrides"] = config.get("overrides", []) + [{"when": {}, "set": _pairs(args.set)}]
    only = {k: [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in _pairs(args.only).items()}
    runs = expand_runs(config, name, args.out)
    unknown = sorted(k for k in only if k not in runs[0].flat_json())
    if unknown:
        raise SystemExit(f"--only: {', '.join(unknown)} is not a setting ({', '.join(runs[0].flat_json())})")
    for key, values in only.items():  # a typo would select nothing, or less than asked, without a word
        present = sorted({str(r.flat_json()[key]) for r in runs})
        if missing := [v for v in values if v not in present]:
            raise SystemExit(f"--only: no run has {key} {', '.join(map(repr, missing))}; the values are {present}")
    runs = [r for r in runs if all(str(r.flat_json()[k]) in v for k, v in only.items())]
    print(f"{name}: {len(runs)} runs ({config.get('paper', '')})")
    if args.summary:
        path = os.path.join(args.out, name, "summary.md")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        text = summary(runs, f"{name}: {config.get('paper', '')}")
        with open(path, "w") as f:
            f.write(text)
        print(text + f"written: {path}")
        return 0
    from isojax.train.loop import fit

    for run in runs:
        print(json.dumps(run.to_json()), flush=True)
        if not args.dry_run:
            fit(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
