"""Every isotropy method fine-tuned on offline STS-B with the bundled default model, over several seeds: one table
of task metric and isotropy per method, and curves of the task metric and anisotropy over training.

    python -m experiments.reproductions.finetune_methods [--methods all] [--seeds 0,1,2] [--train-limit 1000] [--epochs 1]
                                           [--eval-limit 500] [--quick]

The table has the shape of the papers' tables: task metric (Spearman / Pearson x100, mean ± std over seeds; the
calibration paper's Table 1 and the SoftDecay paper's Table 2 report one task metric per method), IsoScore of
the evaluated [CLS] embeddings (isotropy-layer Table 2), EV of the top 1/2/3 principal components (isotropy-layer
Table 3; EV1 is also the shrink paper's centered anisotropy), the raw anisotropy (shrink-the-longest Table 3)
and I1/I2 of the word embedding matrix (calibration-evaluation Table 4). ``isotropy_layer`` has two rows: after stage 1 (the
fine-tuned model) and after stage 2 (+ Isotropy Layer), as in isotropy-layer Table 2. The "pretrained" row is
the untrained start (step 0) of the baseline runs.

Runs live in ``--runs-dir`` (checkpoints, logs; a finished run is not repeated); the table (markdown + JSON) and
the curves go to ``--out`` with the command, git commit and machine in their header.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import typing
from collections import defaultdict
from pathlib import Path

import numpy as np

from experiments.tooling.files import write_json
from experiments.tooling.report import ISOTROPY_COLUMNS, RESULTS, provenance, seeds_table, write_result
from isojax.argtypes import int_at_least

COLUMNS = (("spearman", "Spearman", 2), ("pearson", "Pearson", 2), *ISOTROPY_COLUMNS, ("seconds", "run time (s)", 0))


def collect(run_dirs: dict) -> tuple[dict, dict, set]:
    """Per table row, the evaluations of every seed; per method, the eval records of every seed; the commits
    the runs were made at."""
    rows, curves, commits = defaultdict(list), defaultdict(list), set()
    for (method, _seed), path in run_dirs.items():
        with open(os.path.join(path, "results.json")) as f:
            stages = json.load(f)["stages"]
        with open(os.path.join(path, "log.jsonl")) as f:
            evals = {r["step"]: r for r in map(json.loads, f) if r["kind"] == "eval"}
        curves[method].append([evals[s] for s in sorted(evals)])
        timing = os.path.join(path, "seconds.json")
        run = {"seconds": None, "commit": "unknown"}
        if os.path.exists(timing):
            with open(timing) as f:
                run = json.load(f)
        commits.add(run["commit"])
        if method == "baseline":
            rows["pretrained (step 0)"].append(dict(evals[0], seconds=None))
        if method == "isotropy_layer":
            rows["isotropy_layer: stage 1 (fine-tuned)"].append(dict(stages["finetune"], seconds=None))
            rows["isotropy_layer: stage 2 (+ Isotropy Layer)"].append(
                dict(stages["isotropy_layer"], seconds=run["seconds"])
            )
        else:
            rows[method].append(dict(stages["finetune"], seconds=run["seconds"]))
    return rows, curves, commits


def plot(curves: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    colors = plt.get_cmap("tab20")  # 20 listed colours; colors(i) is the i-th
    for i, (method, runs) in enumerate(curves.items()):
        steps = [r["step"] for r in runs[0]]
        style = dict(
            marker="os^Dv"[i % 5],
            markersize=3,
            color=colors((2 * i) % 20 + (2 * i) // 20),
            label=method,
            linestyle="-" if i % 2 == 0 else "--",
        )
        for ax, key in zip(axes, ("spearman", "anisotropy", "isoscore")):
            ax.plot(steps, np.mean([[r[key] for r in run] for run in runs], axis=0), **style)
    for ax, label in zip(axes, ("Spearman ×100 (dev)", "anisotropy σ1²/Σσ² (raw)", "IsoScore")):
        ax.set(xlabel="step", title=label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    from isojax.train import (
        METHODS,
        LoggingConfig,
        MethodConfig,
        ModelConfig,
        OptimConfig,
        PlacementConfig,
        TaskConfig,
        TrainConfig,
        fit,
    )
    from isojax.train.config import MethodName

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="all", help=f"comma-separated, or 'all': {','.join(METHODS)}")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--model", default="default")
    ap.add_argument("--train-limit", type=int, default=1000, help="first N STS-B train pairs (0 = all 5749)")
    ap.add_argument("--eval-limit", type=int, default=500, help="first N STS-B dev pairs (0 = all 1500)")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--stage2-epochs", type=float, default=1.0, help="Isotropy Layer stage")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--pooling", default="cls")
    ap.add_argument("--eval-points", type=int_at_least(1), default=4, help="evaluations per stage (curve points)")
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--runs-dir", default="runs/finetune_methods")
    ap.add_argument("--out", default=RESULTS, help="where the table and curves go")
    ap.add_argument("--quick", action="store_true", help="3 methods, 1 seed, 32 pairs, 4 steps (smoke run)")
    args = ap.parse_args(argv)
    methods = list(METHODS) if args.methods == "all" else args.methods.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    name = "finetune_methods"
    if args.quick:
        methods, seeds, name = ["baseline", "softdecay", "isotropy_layer"], [0], "finetune_methods_quick"
        args.train_limit, args.eval_limit, args.batch_size, args.epochs, args.stage2_epochs = 32, 32, 8, 1.0, 0.5

    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.join(args.runs_dir, "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    prov = provenance("finetune_methods")  # of the code that runs, taken before it runs
    per_epoch = args.train_limit // args.batch_size if args.train_limit else 5749 // args.batch_size
    eval_every = max(1, round(args.epochs * per_epoch / args.eval_points))
    run_dirs = {}
    for method in methods:
        for seed in seeds:
            path = os.path.join(args.runs_dir, f"{method}_seed{seed}")
            run_dirs[method, seed] = path
            if os.path.exists(os.path.join(path, "results.json")):
                continue
            print(f"== {method}, seed {seed}", flush=True)
            started = time.perf_counter()
            fit(
                TrainConfig(
                    task=TaskConfig(
                        name="stsb",
                        max_length=args.max_length,
                        train_limit=args.train_limit,
                        eval_limit=args.eval_limit,
                    ),
                    model=ModelConfig(name=args.model, pooling=args.pooling),
                    method=MethodConfig(name=typing.cast(MethodName, method)),
                    optim=OptimConfig(
                        batch_size=args.batch_size,
                        eval_batch_size=50,
                        learning_rate=args.lr,
                        epochs=args.epochs,
                        stage2_epochs=args.stage2_epochs,
                    ),
                    placement=PlacementConfig(devices=args.devices),
                    logging=LoggingConfig(output_dir=path, eval_every=eval_every, log_every=10, progress=False),
                    seed=seed,
                )
            )
            write_json(Path(path, "seconds.json"), {"seconds": time.perf_counter() - started, "commit": prov["commit"]})
    rows, curves, commits = collect(run_dirs)
    protocol = (
        f"Protocol: STS-B (offline package), model {args.model}, first {args.train_limit or 5749} train "
        f"pairs, {args.epochs:g} epoch(s) (Isotropy Layer stage: {args.stage2_epochs:g}), batch "
        f"{args.batch_size}, max length {args.max_length}, lr {args.lr:g} (AdamW, linear warm-up 10% and "
        f"decay), pooling {args.pooling}; dev = first {args.eval_limit or 1500} pairs; seeds "
        f"{','.join(map(str, seeds))} (paired: a seed fixes the head's initialisation, dropout and batch order "
        f"for every method). Spearman/Pearson ×100; mean ± std over seeds. Runs made at commit(s) "
        f"{', '.join(sorted(commits))}; run time is the wall time of one run (both stages for "
        "isotropy_layer) on the machine above."
    )
    os.makedirs(args.out, exist_ok=True)
    plot(
        curves,
        os.path.join(args.out, f"{name}_curves.png"),
        title=f"STS-B fine-tuning of {args.model}: dev metrics at each evaluation, mean over seeds {args.seeds} "
        f"(isotropy_layer: stage 2 after step {max(1, math.ceil(args.epochs * per_epoch))})",
    )
    path = write_result(
        name,
        "Fine-tuning with isotropy methods on STS-B",
        [protocol, seeds_table(rows, COLUMNS), f"![curves]({name}_curves.png)"],
        {"protocol": protocol, "run_commits": sorted(commits), "rows": rows},
        prov=prov,
        directory=args.out,
    )
    with open(path) as f:
        print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
