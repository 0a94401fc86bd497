"""Running the campaign's runs: each one a ``python -m isojax.cli finetune --config`` process, resumed from its last
checkpoint where an earlier sitting left it, stopped by ``SIGTERM`` at a time limit; and the records that say which
runs are done (``results.json``, ``campaign.json``, ``sittings.json``), in the run directories and in the committed
copies.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from experiments.campaign import schedule
from experiments.campaign.spec import Run, changed_settings, evals_every
from experiments.reproductions.glue_pairing import dropout_masks, pairing_record
from experiments.tooling.files import write_json
from experiments.tooling.report import ROOT
from isojax.cli import EXIT_NONFINITE, EXIT_STOPPED

STOP_GRACE_S = 600  # after SIGTERM, the run's step, checkpoint and exit get this long before SIGKILL


@dataclass(frozen=True)
class Outcome:
    """How one run's process ended (:func:`run_one`).

    Attributes:
        seconds: its wall seconds.
        diverged: for a run that non-finite numbers stopped (``isojax finetune``'s exit status 3), the error line it
            printed; else None.
        stopped: for a run that ``SIGTERM`` stopped (it checkpointed its step, or had not started training; the
            next sitting resumes it), by whom: ``"at the time limit"`` (``stop_after``) or ``"by a SIGTERM from
            outside"`` (a scheduler, a ``kill``); else None.
    """

    seconds: float
    diverged: str | None = None
    stopped: str | None = None


def run_one(
    run: Run, runs_dir: str, data_dir: str | None, eval_every: int, env: dict, stop_after: float | None = None
) -> Outcome:
    """Write the run's :class:`TrainConfig` (:meth:`Run.config`) to :meth:`Run.config_path`, then run (or resume)
    it from there in its own process. ``stop_after``: seconds after which the process gets ``SIGTERM`` (it
    checkpoints its step and exits with status 143; one still running ``STOP_GRACE_S`` later is killed). A run that
    diverged or was stopped (at the limit, or by a ``SIGTERM`` someone else sent it) is an :class:`Outcome` that says
    so; any other failure raises ``subprocess.CalledProcessError`` and stops the campaign."""
    path = run.config_path(runs_dir)
    write_json(Path(path), run.config(runs_dir, data_dir, eval_every).to_json())
    started = time.perf_counter()
    argv = [sys.executable, "-m", "isojax.cli", "finetune", "--config", path]
    tail: deque[str] = deque(maxlen=100)  # the run's last stderr lines, for its error
    stopping = threading.Event()  # set when the time limit came
    with subprocess.Popen(argv, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True) as proc:

        def stop():
            stopping.set()
            proc.send_signal(signal.SIGTERM)

        timers = (
            []
            if stop_after is None
            else [
                threading.Timer(stop_after, stop),
                threading.Timer(stop_after + STOP_GRACE_S, proc.kill),
            ]
        )
        for timer in timers:
            timer.daemon = True
            timer.start()
        for line in proc.stderr or ():  # the run's warnings, in the campaign's own log as they come
            sys.stderr.write(line)
            sys.stderr.flush()
            tail.append(line)
    for timer in timers:
        timer.cancel()
    seconds = time.perf_counter() - started
    if proc.returncode == EXIT_NONFINITE:
        return Outcome(seconds, diverged="".join(tail).strip().splitlines()[-1].partition("error: ")[2])
    # SIGTERM before the run installed its handler (while Python imports it) ends it at once, and a run that did not
    # stop in STOP_GRACE_S was killed: either keeps the checkpoints it had
    if stopping.is_set() and proc.returncode in (EXIT_STOPPED, -signal.SIGTERM, -signal.SIGKILL):
        return Outcome(seconds, stopped="at the time limit")
    if proc.returncode in (EXIT_STOPPED, -signal.SIGTERM):
        return Outcome(seconds, stopped="by a SIGTERM from outside")
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv, stderr="".join(tail))
    return Outcome(seconds)


def finished_record(run: Run, runs_dir: str, *records_dirs: str) -> str | None:
    """Directory holding the run's ``results.json`` and ``log.jsonl``: its run directory, else a committed copy
    in one of ``records_dirs`` (so a campaign continues in a fresh checkout); None while the run is not
    finished."""
    for directory in (run.directory(runs_dir), *(run.directory(d) for d in records_dirs)):
        if os.path.exists(os.path.join(directory, "results.json")):
            return directory
    return None


def campaign_record(run: Run, runs_dir: str, *records_dirs: str) -> dict | None:
    """The ``campaign.json`` of a finished run (wall seconds, commit, machine, pairing; :func:`finished_record`'s
    directory), None while the run is not finished or where its record has none."""
    directory = finished_record(run, runs_dir, *records_dirs)
    if directory is None or not os.path.exists(path := os.path.join(directory, "campaign.json")):
        return None
    with open(path) as f:
        return json.load(f)


def diverged_record(run: Run, runs_dir: str, *records_dirs: str) -> str | None:
    """The error of a run that non-finite numbers stopped, as its ``campaign.json`` records it (``"diverged"``; in
    its run directory or a committed copy in ``records_dirs``), else None. The campaign does not run it again;
    deleting that ``campaign.json`` retries it."""
    for directory in (run.directory(runs_dir), *(run.directory(d) for d in records_dirs)):
        path = os.path.join(directory, "campaign.json")
        if os.path.exists(path) and not os.path.exists(os.path.join(directory, "results.json")):
            with open(path) as f:
                diverged = json.load(f).get("diverged")
            if diverged:
                return diverged
    return None


def pending(run: Run, runs_dir: str, *records_dirs: str) -> bool:
    """Whether the campaign still has to run ``run``: neither finished nor stopped by non-finite numbers."""
    return (
        finished_record(run, runs_dir, *records_dirs) is None and diverged_record(run, runs_dir, *records_dirs) is None
    )


def copy_records(runs: list[Run], runs_dir: str, records_dir: str) -> None:
    """Copy the ``results.json``, ``log.jsonl`` and ``campaign.json`` of each run of ``runs_dir`` that finished or
    diverged (:func:`diverged_record`) to ``records_dir`` (same layout), removing there those the run directory
    lacks (a rerun that diverged leaves no earlier ``results.json`` behind)."""
    for run in runs:
        source, target = run.directory(runs_dir), run.directory(records_dir)
        if not any(os.path.exists(os.path.join(source, name)) for name in ("results.json", "campaign.json")):
            continue
        os.makedirs(target, exist_ok=True)
        for name in ("results.json", "log.jsonl", "campaign.json"):
            if os.path.exists(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
            elif os.path.exists(os.path.join(target, name)):
                os.remove(os.path.join(target, name))


def run_sitting(
    todo: list[Run],
    parts: dict[str, list[Run]],
    config: dict,
    *,
    cost_path: str,
    runs_dir: str,
    data_dir: str | None,
    out: str,
    prov: dict,
    env: dict,
    time_limit: float | None = None,
    stop_at_limit: bool = False,
    dry_run: bool = False,
) -> None:
    """Run the runs ``todo`` in the campaign's order (:func:`~experiments.campaign.schedule.campaign_order`, the cost
    table at ``cost_path`` read again before each run: a timing that finishes later reorders the rest), within
    ``time_limit`` minutes (:func:`~experiments.campaign.schedule.next_run`; ``stop_at_limit``: the run in progress
    gets ``SIGTERM`` at the limit), each finished run's ``campaign.json`` written and its records copied to
    ``<out>/<part>_runs`` at once (``parts``: report name -> its runs). ``dry_run``: print the runs' commands, with
    the time limit applied to the estimates of the runs printed before, and run nothing."""
    from isojax.data.glue import load_glue

    sizes = {task: len(load_glue(task, "train", data_dir=data_dir).labels) for task in {r.task for r in todo}}
    masks = None if dry_run else dropout_masks()
    started, listed = time.monotonic(), 0.0  # listed: the estimated minutes of the runs --dry-run printed
    took, estimated = 0.0, 0.0  # this sitting's finished runs: their wall minutes and their estimates' sum
    while todo:
        cost = schedule.read_cost(cost_path)
        spent = listed if dry_run else (time.monotonic() - started) / 60
        left = None if time_limit is None else time_limit - spent
        # a loaded machine: this sitting's runs took longer than their estimates, so the next one will too
        slowdown = max(1.0, took / estimated) if estimated else 1.0
        ordered = schedule.campaign_order(todo, config, cost, sizes)
        run = schedule.next_run(ordered, cost, left, slowdown, stop=stop_at_limit)
        if run is None:
            scaled = f" (estimates x {slowdown:.2f}, as this sitting's runs took)" if slowdown > 1 else ""
            none = f"less than {schedule.STOP_MIN_MINUTES:g} min left" if stop_at_limit else "none estimated to finish"
            print(f"--time-limit: {len(todo)} run(s) left, {none} in the {left:.0f} min left{scaled}")
            break
        todo.remove(run)
        estimate = schedule.run_minutes(cost, run) or 0.0
        listed += estimate
        every = evals_every(run, sizes[run.task], config["evals_per_epoch"])
        changed = changed_settings(run.config(runs_dir, data_dir, every))
        path = run.config_path(runs_dir)
        print(f"== {run.key}: python -m isojax.cli finetune --config {path}\n   {json.dumps(changed)}", flush=True)
        if left is not None and estimate * slowdown > left:  # only with --stop-at-limit
            print(f"   (estimated {estimate * slowdown:.0f} min: stopped at the limit, resumed by the next sitting)")
        if dry_run:
            continue
        stop_after = (
            max(0.0, started + 60 * time_limit - time.monotonic()) if stop_at_limit and time_limit is not None else None
        )
        outcome = run_one(run, runs_dir, data_dir, every, env, stop_after)
        sitting = {"wall_seconds": outcome.seconds, "commit": prov["commit"], "machine": prov["machine"]}
        sittings = Path(run.directory(runs_dir), "sittings.json")  # a stopped run's earlier sittings
        earlier = json.loads(sittings.read_text()) if sittings.exists() else []
        if outcome.stopped:
            write_json(sittings, [*earlier, sitting])
            print(
                f"{run.key} stopped {outcome.stopped} after {outcome.seconds / 60:.0f} min (sitting "
                f"{len(earlier) + 1}); its checkpoint is in {run.directory(runs_dir)}, and running the "
                "campaign again resumes it",
                flush=True,
            )
            break
        if not earlier:  # a run of one sitting: a measure of this sitting's speed
            took, estimated = took + outcome.seconds / 60, estimated + estimate
        record = {
            **sitting,
            "wall_seconds": outcome.seconds + sum(e["wall_seconds"] for e in earlier),
            "pairing": pairing_record(run.config(), prov["commit"], masks),
        }
        if earlier:
            record["earlier_sittings"] = earlier
        if outcome.diverged:
            record["diverged"] = outcome.diverged  # then this file is the run's only record
        write_json(Path(run.directory(runs_dir), "campaign.json"), record)
        for name, part in parts.items():  # kept as soon as it is done
            if run.key in {r.key for r in part}:
                copy_records([run], runs_dir, os.path.join(out, f"{name}_runs"))
