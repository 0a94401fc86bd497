"""Seconds per training epoch of each fine-tuning method of the GLUE campaign, timed side by side.

    python -m experiments.benchmarks.methods [--task rte] [--protocol appB] [--methods cpu | all | NAME,NAME]
                                             [--repeats 5] [--data-dir ../shared/data]

The campaign's own seconds per epoch (``results.json``'s ``timing``) come from runs made hours apart, so on a
shared machine they measure its load as much as the method (isotropy-calibration-evaluation reports time per
epoch per method). Here every method's real train step is built as ``isojax finetune`` builds it for the campaign
(:mod:`experiments.campaign`' configuration -> the run's ``TrainConfig`` ->
:func:`isojax.train.loop.prepare` and :func:`~isojax.train.loop.stage_runner`: model, regulariser with its data
references, optimiser, runner), fed the same
first training batch, and timed in rounds that run every step once (:func:`common.interleaved_ms`), so that load
reaches all alike. One step = forward, loss and regularisers, backward, update, dropout on, state donated.
Printed per method and stage: median ms per step with its quartiles, seconds per epoch (= ms × the task's batches
per epoch) and the ratio to the protocol's baseline. The Isotropy Layer's first stage is the baseline's step plus
a frozen [B, H] layer, so its ratio shows how far the measurement itself scatters. ``--methods cpu`` (default)
takes the methods of the configuration's ``cpu_campaign``, ``all`` every method of the protocol.
"""

from __future__ import annotations

import argparse
import json
import tempfile

import numpy as np

from experiments.benchmarks.common import interleaved_ms, machine
from experiments.benchmarks.train_step import step_runner
from experiments.campaign.schedule import campaign_selection
from experiments.campaign.spec import DEFAULT_CONFIG, DEFAULT_DATA, expand, select
from isojax.argtypes import int_at_least
from isojax.train import loop
from isojax.train.feed import batch_indices, process_batches
from isojax.train.state import create_state


def stage_steps(run, data_dir: str, out: str) -> tuple[dict, int]:
    """``({stage name: run()}, batches per epoch)`` for one campaign run: ``run()`` is one train step of that
    stage on the first training batch, from the run's initial variables, its state kept between calls."""
    config = run.config(out, data_dir)
    recipe, model, train, _, variables, references = loop.prepare(config)
    batch_size = config.optim.batch_size
    order = batch_indices(len(train), batch_size, shuffle=True, seed=config.seed, epoch=0, drop_last=True)[:1]
    steps, start, per_epoch = {}, 0, len(train) // batch_size
    for stage, total in zip(config.stages(), loop.stage_steps(config, per_epoch), strict=True):
        optimizer, _, runner, _ = loop.stage_runner(
            config, recipe, model, variables, references, stage, start=start, total=total
        )
        batch = next(process_batches(train, order, runner.process_rows(batch_size)))
        state = runner.place(create_state(variables, optimizer, config.seed, step=start))
        steps[stage.name] = step_runner(runner.train, state, batch)
        start += total
    return steps, per_epoch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--data-dir", default=DEFAULT_DATA)
    ap.add_argument("--task", default="rte")
    ap.add_argument("--protocol", default="appB")
    ap.add_argument("--methods", default="cpu", help="cpu (the cpu_campaign's), all, or names joined by commas")
    ap.add_argument("--repeats", type=int_at_least(1), default=5)
    args = ap.parse_args(argv)

    with open(args.config) as f:
        config = json.load(f)
    for flag, value, known in (
        ("--protocol", args.protocol, config["protocols"]),
        ("--task", args.task, config["tasks"]),
    ):
        if value not in known:
            ap.error(f"{flag} {value!r} is not in {args.config}: {sorted(known)}")
    protocol = config["protocols"][args.protocol]
    if args.methods == "cpu":
        chosen = campaign_selection(expand(config), config)
        methods = list(dict.fromkeys(r.method for r in chosen if (r.protocol, r.task) == (args.protocol, args.task)))
    elif args.methods == "all":
        methods = list(protocol["methods"])
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(protocol["methods"]))
    if unknown:
        raise SystemExit(f"--methods: {unknown} not in protocol {args.protocol!r}: {sorted(protocol['methods'])}")
    if protocol["baseline"] not in methods:
        methods = [protocol["baseline"], *methods]
    runs = select(
        expand(config),
        {"protocol": [args.protocol], "task": [args.task], "seed": [config["seeds"][0]], "method": methods},
    )

    fns, per_epoch = {}, None
    with tempfile.TemporaryDirectory() as out:
        for run in runs:
            steps, per_epoch = stage_steps(run, args.data_dir, out)
            for stage, fn in steps.items():
                fns[run.method if stage == "finetune" else f"{run.method} ({stage})"] = fn
        times = interleaved_ms(fns, args.repeats)

    base = np.median(times[protocol["baseline"]])
    print(
        f"{args.task}, protocol {args.protocol}, batch {runs[0].config().optim.batch_size}, {per_epoch} batches per "
        f"epoch; {machine()}; median (and quartiles) of {args.repeats} interleaved rounds"
    )
    print(f"{'method (stage)':<40} {'ms / step':>10} {'quartiles':>15} {'s / epoch':>10} {'/ baseline':>11}")
    for name, t in times.items():
        ms, (q1, q3) = np.median(t), np.percentile(t, [25, 75])
        print(f"{name:<40} {ms:>10.1f} {f'{q1:.0f}-{q3:.0f}':>15} {ms * per_epoch / 1e3:>10.1f} {ms / base:>11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
