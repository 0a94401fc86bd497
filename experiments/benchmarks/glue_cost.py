"""What one run of the GLUE campaign costs on this machine, task by task, measured with the campaign's own code.

    python -m experiments.benchmarks.glue_cost [--config experiments/reproductions/configs/glue_methods.json] [--data-dir ../shared/data]
        [--tasks wnli,cola,...] [--runs-dir runs/glue_cost] [--out experiments/results] [--report-only]

For every task of the configuration, one epoch of the configuration's ``cost`` run (the App. B baseline, seed 0)
is trained by the same ``python -m isojax.cli finetune`` process the campaign starts
(:func:`experiments.campaign.runner.run_one`), with the same options and length buckets, except ``--epochs 1``
(or ``--steps N`` for the tasks whose epoch the configuration's ``cost.steps`` caps: then only those first N
batches of the epoch are timed, and the table says so), ``--log-every 1`` and no intermediate checkpoint.

From each run's ``log.jsonl`` (every step logged, with its training seconds, evaluation excluded):

- seconds per step: the mean over the steps after the first (the first holds the compilation of the first
  width; later widths compile when they first appear, and those steps count, as they do in the campaign);
- seconds per epoch: seconds per step x steps per epoch (``N // batch`` steps: the last partial batch is dropped);
- seconds per evaluation: from the last step's record to the final dev evaluation's record (the whole dev set,
  with the isotropy columns);
- start-up: the process's wall time less the steps after the first and the two evaluations (reading and
  tokenising the data, loading the model, the first step with its compilation, the evaluations' compilation,
  checkpoints).

The bucket widths are those of the epoch's batches under the run's order (``batch_indices`` with the run's seed,
epoch 0), from the token lengths of the training rows: a batch is padded to the smallest bucket that holds its
longest row (:func:`isojax.data.batching.bucket_length`).

Estimated minutes of one run of a protocol = start-up + epochs x seconds per epoch + evaluations x seconds per
evaluation (``evals_per_epoch`` per epoch, and one at step 0). These estimates are not results: the shrink
protocol's batch of 64 is estimated as two batches of 32 (same seconds per epoch), and the Isotropy Layer's
stage 2 (encoder and head frozen) as at most one more epoch at the fine-tuning step's cost. The campaign is
ordered by these estimates (:func:`experiments.campaign.schedule.run_minutes` reads ``glue_cost.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from experiments.campaign.runner import run_one
from experiments.campaign.spec import DEFAULT_CONFIG, DEFAULT_DATA, Run, expand
from experiments.tooling.files import write_json
from experiments.tooling.report import RESULTS, markdown_table, provenance, write_result

COST_FILE = os.path.join(RESULTS, "glue_cost.json")


def cost_run(config: dict, task: str) -> Run:
    """The timing run of ``task``: the configuration's ``cost`` run (protocol, method, seed) for one epoch, or
    for the first ``cost.steps[task]`` batches of it."""
    cost = config["cost"]
    (run,) = [
        r
        for r in expand(config)
        if (r.protocol, r.method, r.task, r.seed) == (cost["protocol"], cost["method"], task, cost["seed"])
    ]
    settings = {**run.settings, "optim.epochs": 1, "logging.log_every": 1, "logging.save_every": 0}
    if task in cost.get("steps", {}):
        settings["optim.steps"] = int(cost["steps"][task])
    return Run("cost", run.method, task, run.seed, settings)


def bucket_widths(run: Run, data_dir: str | None) -> list[int]:
    """The width of every batch of the run's first epoch (its order, its buckets, its ``task.max_length``)."""
    from isojax.data.batching import bucket_length, tokenize
    from isojax.data.glue import load_glue
    from isojax.models.hub import load_tokenizer, resolve
    from isojax.train.feed import batch_indices

    data = load_glue(run.task, "train", data_dir=data_dir)
    config = run.config()
    tokenizer = load_tokenizer(resolve(config.model.name))
    max_length = config.task.max_length
    lengths = tokenize(tokenizer, data.texts_a, data.texts_b, max_length=max_length)["attention_mask"].sum(axis=1)
    order = batch_indices(len(data), config.optim.batch_size, shuffle=True, seed=run.seed, epoch=0, drop_last=True)
    return [bucket_length(lengths[rows], config.task.buckets, max_length=max_length) for rows in order]


def measure(directory: str) -> dict:
    """Seconds per step, per evaluation and of start-up of a finished timing run (module docstring)."""
    with open(os.path.join(directory, "log.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(directory, "campaign.json")) as f:
        campaign = json.load(f)
    wall = campaign["wall_seconds"]
    train = [r for r in records if r["kind"] == "train"]
    if [r["step"] for r in train] != list(range(1, len(train) + 1)):
        raise ValueError(f"{directory}: the timing run must log every step (log-every 1) in one session")
    steady = [r["seconds"] for r in train[1:]]
    final = [r for r in records if r["kind"] == "eval" and r.get("stage_end")][-1]
    evaluation = final["time"] - train[-1]["time"]
    return {
        "steps_timed": len(train),
        "seconds_per_step": float(np.mean(steady)),
        "seconds_per_step_std": float(np.std(steady)),
        "first_step_seconds": train[0]["seconds"],
        "seconds_per_evaluation": evaluation,
        "startup_seconds": wall - sum(steady) - 2 * evaluation,
        "wall_seconds": wall,
        "commit": campaign["commit"],
        "machine": campaign["machine"],
    }


def estimates(config: dict, task: str, row: dict) -> dict:
    """Estimated minutes of one run of each protocol on ``task`` (module docstring), from the measured ``row``."""
    out = {}
    evals = config["evals_per_epoch"]
    for name in config["protocols"]:
        (run,) = [
            r
            for r in expand(config)
            if (r.protocol, r.task, r.seed) == (name, task, config["seeds"][0])
            and r.method == config["protocols"][name]["baseline"]
        ]
        optim = run.config().optim
        epochs = optim.epochs
        out[name] = round(
            (
                row["startup_seconds"]
                + epochs * row["seconds_per_epoch"]
                + (1 + evals * epochs) * row["seconds_per_evaluation"]
            )
            / 60,
            1,
        )
        if name == config["cost"]["protocol"]:
            stage2 = optim.stage2_epochs
            out[f"{name} + isotropy layer stage 2"] = round(
                out[name] + stage2 * (row["seconds_per_epoch"] + evals * row["seconds_per_evaluation"]) / 60, 1
            )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--data-dir", default=DEFAULT_DATA)
    ap.add_argument("--tasks", default=None, help="comma-separated tasks (default: the configuration's cost order)")
    ap.add_argument("--runs-dir", default=os.path.join("runs", "glue_cost"))
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--report-only", action="store_true", help="tabulate the finished timing runs")
    args = ap.parse_args(argv)
    args.runs_dir, args.data_dir = os.path.abspath(args.runs_dir), os.path.abspath(args.data_dir)
    with open(args.config) as f:
        config = json.load(f)
    tasks = args.tasks.split(",") if args.tasks else config["cost"]["order"]
    prov = provenance("glue_cost")
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(args.runs_dir, "jax_cache"))
    rows, payload = [], {}
    for task in tasks:
        run = cost_run(config, task)
        directory = run.directory(args.runs_dir)
        if not os.path.exists(os.path.join(directory, "results.json")):
            if args.report_only:
                rows.append([task, "not timed", *[""] * 8])
                continue
            print(
                f"== timing {task}: python -m isojax.cli finetune --config {run.config_path(args.runs_dir)}", flush=True
            )
            outcome = run_one(run, args.runs_dir, args.data_dir, 0, env)
            if outcome.diverged:
                raise SystemExit(f"the timing run of {task} was stopped by non-finite numbers: {outcome.diverged}")
            record = {"wall_seconds": outcome.seconds, "commit": prov["commit"], "machine": prov["machine"]}
            write_json(Path(directory, "campaign.json"), record)
        row = measure(directory)
        widths = bucket_widths(run, args.data_dir)
        row["steps_per_epoch"] = len(widths)
        row["seconds_per_epoch"] = row["seconds_per_step"] * len(widths)
        row["widths_epoch"] = dict(sorted(Counter(widths).items()))
        row["widths_timed"] = dict(sorted(Counter(widths[: row["steps_timed"]]).items()))
        row["whole_epoch_timed"] = row["steps_timed"] == len(widths)
        row["minutes_per_run"] = estimates(config, task, row)
        payload[task] = row
        timed = "yes" if row["whole_epoch_timed"] else f"no: first {row['steps_timed']} steps"
        rows.append(
            [
                task,
                row["steps_per_epoch"],
                timed,
                f"{row['seconds_per_step']:.2f} ± {row['seconds_per_step_std']:.2f}",
                f"{row['seconds_per_epoch'] / 60:.1f}",
                f"{row['seconds_per_evaluation']:.0f}",
                f"{row['startup_seconds']:.0f}",
                ", ".join(f"{w}: {c}" for w, c in row["widths_epoch"].items()),
                "; ".join(f"{k} {v}" for k, v in row["minutes_per_run"].items()),
            ]
        )
        print(rows[-1], flush=True)
    headers = [
        "task",
        "steps / epoch",
        "whole epoch timed",
        "s / step (mean ± std)",
        "min / epoch",
        "s / dev evaluation",
        "start-up s",
        "batches per bucket width (epoch)",
        "estimated min / run",
    ]
    note = (
        f"The configuration's cost run (protocol {config['cost']['protocol']}, method "
        f"{config['cost']['method']}, seed {config['cost']['seed']}), one epoch per task with the campaign's "
        "own `isojax finetune` process (module docstring of `experiments/benchmarks/glue_cost.py`). "
        + config["cost"]["note"]
    )
    write_result(
        "glue_cost",
        "Cost of one GLUE campaign run per task on this machine (measured, then estimated)",
        [note, markdown_table(headers, rows)],
        {"tasks": payload},
        prov=prov,
        directory=args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
