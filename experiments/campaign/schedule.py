"""In which order, and how many, of the campaign's runs a sitting starts: the cost table's estimates (``glue_cost.json``,
written by :mod:`experiments.benchmarks.glue_cost`), the CPU campaign's selection, the order (cheapest first) and the
time limit.
"""

from __future__ import annotations

import json
import os

from experiments.campaign.spec import Run, base_method, select

STOP_MIN_MINUTES = 5.0  # --stop-at-limit starts no run in less (its start-up and compilation would be all it did)


def read_cost(path: str, *, required: bool = False) -> dict | None:
    """The cost table (``glue_cost.json``, :mod:`experiments.benchmarks.glue_cost`), or None where there is none yet
    (``required``: a table the user named, whose absence is a ``SystemExit``)."""
    if not os.path.exists(path):
        if required:
            raise SystemExit(f"--cost {path}: no such file (python -m experiments.benchmarks.glue_cost writes it)")
        return None
    with open(path) as f:
        return json.load(f)


def run_minutes(cost: dict | None, run: Run) -> float | None:
    """The estimated minutes of a campaign run from a cost table (``glue_cost.json``'s payload); None without a
    table, or if its task or its protocol was not timed (a configuration other than the table's)."""
    if not cost:
        return None
    minutes = cost["tasks"].get(run.task, {}).get("minutes_per_run", {})
    stage2 = f"{run.protocol} + isotropy layer stage 2"
    return (
        minutes[stage2]
        if run.settings.get("method.name") == "isotropy_layer" and stage2 in minutes
        else minutes.get(run.protocol)
    )


def too_long(run: Run, config: dict, cost: dict | None) -> float | None:
    """The run's estimated minutes (:func:`run_minutes`) where they exceed the CPU
    campaign's ``max_run_minutes`` (a run longer than one sitting: its checkpoints live on the machine that ran it),
    else None (also without a cost table, an estimate or a limit)."""
    limit = config.get("cpu_campaign", {}).get("max_run_minutes")
    minutes = run_minutes(cost, run) if limit else None
    return minutes if minutes is not None and minutes > limit else None


def campaign_selection(runs: list[Run], config: dict, cost: dict | None = None) -> list[Run]:
    """The runs of the configuration's ``cpu_campaign``: the union of its ``selections`` (each one ``only``), less
    the runs that the cost table estimates longer than its ``max_run_minutes`` (:func:`too_long`)."""
    chosen = {r.key for only in config["cpu_campaign"]["selections"] for r in select(runs, only)}
    return [r for r in runs if r.key in chosen and too_long(r, config, cost) is None]


def next_run(
    ordered: list[Run], cost: dict | None, minutes_left: float | None, slowdown: float = 1.0, *, stop: bool = False
) -> Run | None:
    """The first run of ``ordered`` whose estimated minutes times ``slowdown`` fit in ``minutes_left`` (the first run
    where there is no time limit); None where none does. Under a limit a run without an estimate is never started.
    ``stop`` (``--stop-at-limit``: the run in progress is stopped at the limit and resumed later): the first run,
    where at least ``STOP_MIN_MINUTES`` are left."""
    if minutes_left is None:
        return ordered[0]
    if stop:
        return ordered[0] if minutes_left >= STOP_MIN_MINUTES else None
    for run in ordered:
        minutes = run_minutes(cost, run)
        if minutes is not None and minutes * slowdown <= minutes_left:
            return run
    return None


def campaign_order(runs: list[Run], config: dict, cost: dict | None, sizes: dict) -> list[Run]:
    """Cheapest run first: by the cost table's estimated minutes (:func:`run_minutes`;
    without a table or for an untimed task, after the timed ones, by training-set size), then the tables' runs
    before the sweeps' other values (``"method [value]"``), then by the method's place in
    ``cpu_campaign.priority`` (then in the configuration), then by seed (so a method's seeds follow each other and
    its line, with its t-tests, is complete early)."""
    ranks: dict[str, int] = {}
    for method in [
        *config.get("cpu_campaign", {}).get("priority", []),
        *(m for p in config["protocols"].values() for m in p["methods"]),
    ]:
        ranks.setdefault(method, len(ranks))

    def key(run):
        minutes = run_minutes(cost, run)
        return (
            minutes is None,
            minutes or 0.0,
            sizes.get(run.task, 0),
            run.method != base_method(run.method),  # a sweep's value that no table has
            ranks.get(base_method(run.method), len(ranks)),
            run.seed,
        )

    return sorted(runs, key=key)
