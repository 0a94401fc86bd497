"""The papers' supervised tables on GLUE: every fine-tuning method x task x seed on the full training sets,
evaluated on dev, in the papers' table shapes.

    python -m experiments.reproductions.glue_methods [--config experiments/reproductions/configs/glue_methods.json] [--data-dir ../shared/data]
        [--cpu-campaign | --only task=rte,mrpc method=baseline,cosine protocol=appB seed=0,1]
        [--sweep] [--runs-dir runs/glue_methods] [--out experiments/results]
        [--cost experiments/results/glue_cost.json] [--time-limit MINUTES [--stop-at-limit]] [--report-only] [--dry-run]

The configuration (committed) names the model, tasks, seeds and *protocols*: each protocol is one paper's
hyperparameters (``defaults``, and ``overrides`` for the runs whose task or method match, both as dotted settings of
:class:`~isojax.train.config.TrainConfig` such as ``"optim.learning_rate"``) with its own baseline and its methods
(a method = the settings that make it: ``"method.name"``, ``"method.regularizers"``, ...). A run is one (protocol,
method, task, seed): its :class:`~isojax.train.config.TrainConfig` (:meth:`Run.config`) is written to
``<runs-dir>/<protocol>/<task>/<method>/seed<seed>/config.json`` and run there by ``isojax finetune --config``; the
run is done when its ``results.json`` exists there or in the committed run records (below). Running the command again skips
done runs and resumes an interrupted one from its last checkpoint, so a campaign can be finished in several
sittings, also from a fresh checkout. The cheapest run goes first, by the measured cost table
(:mod:`experiments.benchmarks.glue_cost`, read again before each run), then the configuration's method priority, then the
seed (:func:`campaign_order`). ``--cpu-campaign`` runs the configuration's ``cpu_campaign``: the union of its
``selections`` and, with ``sweep``, the sweeps, in one order, less any run that the cost table estimates longer
than its ``max_run_minutes`` (one sitting: a run's checkpoints live on the machine that ran it; such a run is left to
an accelerator, and the report says so). ``--time-limit MINUTES`` keeps that order but starts a run only where its
estimate fits in what is left of the minutes since the campaign started, and stops where none does (a sitting, or a
batch job's wall-time limit, then ends between runs instead of in the middle of one); where this sitting's runs took
longer than their estimates (a loaded machine), the estimates are scaled by that ratio. With ``--stop-at-limit`` it
instead runs the runs in that order whatever their estimates, and at the limit sends the run in progress ``SIGTERM``:
it checkpoints the step it is at and exits (:mod:`isojax.train.preemption`), its sitting is recorded in its
``sittings.json``, and the next sitting resumes it, so a run longer than any one sitting still gets done (on the
machine that holds its checkpoints); its ``campaign.json`` then counts the wall time of all its sittings. Each run is
a separate ``python -m isojax.cli finetune --config`` process (a killed campaign loses at most the steps since that run's last checkpoint); JAX's persistent
compilation cache is shared by the runs. A run that non-finite numbers stop (``isojax finetune`` exits with status 3
after ``max_nonfinite_steps`` skipped steps in a row) is a result, not a crash: its ``campaign.json`` records the
error (``"diverged"``), the campaign goes on and does not run it again (delete that file to retry it), and the
report lists it; any other failure stops the campaign.

The report (``<out>/glue_methods.md``, ``.json``, ``glue_methods_curves.png``) has, per task and protocol, one line
per method: the task metrics as mean ± std over seeds with the two-sample t-test against the protocol's baseline
(``scipy.stats.ttest_ind``, equal variances, as isotropy-calibration-evaluation Table 1; ``*`` marks p < 0.05) and
the paired t-test over the seeds whose runs are paired (:mod:`experiments.reproductions.glue_pairing`; each run's
``campaign.json`` records its pairing), "not run" and the reason for a method without a finished run, the isotropy
of the evaluated representation (IsoScore, EV1-3 and the raw anisotropy of the [CLS] / head input, I1 and I2 of the
word embedding matrix), each regulariser term at the first and the last logged training step (unweighted, mean
over seeds: did the optimiser move it?) and the training seconds per epoch (isotropy-calibration-evaluation reports
time per epoch). The Isotropy Layer has two lines (stage 1, the fine-tuned model, and stage 2). A summary follows,
paper by paper (the configuration's ``summaries``): the claim, and per task the difference to the baseline, Cohen's
d, both p-values, the dev IsoScore beside the baseline's (with the paired t-test over the same pairs of seeds) and
the regulariser terms' first and last logged values.
Every finished run's ``results.json``, ``log.jsonl`` and ``campaign.json`` (wall time, commit, machine) are copied
to ``<out>/glue_methods_runs/``, so every number of the report can be traced to a run's own record.

``--sweep`` runs the sweeps of the configuration instead (``sweeps``: per method, one or more settings and the values
each is swept over, one setting at a time: the regulariser weights the papers leave open, ``"method.regularizers"``,
and the flow's ``"optim.transform_learning_rate"``; see :func:`expand`); the sweeps are reported in
``<out>/glue_methods_sweep.md`` (records in ``glue_methods_sweep_runs/``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import scipy.stats

from experiments.reproductions.glue_pairing import (
    MODEL_CHANGES,
    dropout_masks,
    dropout_stream,
    pair_key,
    paired_ttest,
    pairing_record,
    without_spread,
)
from experiments.reproductions.glue_power import detectable
from experiments.tooling.report import (
    ISOTROPY_COLUMNS,
    RESULTS,
    ROOT,
    SHARED_DATA,
    markdown_table,
    mean_std,
    provenance,
    write_result,
)
from isojax._files import write_json
from isojax.cli import EXIT_NONFINITE, EXIT_STOPPED
from isojax.train.config import TrainConfig

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "glue_methods.json")
DEFAULT_DATA = SHARED_DATA
DEFAULTS = TrainConfig().flat_json()  # what a run's printed settings leave out
TIME_COLUMN = ("seconds_per_epoch", "s / epoch", 0)
TERMS_COLUMN = "added loss term (unweighted), first → last logged step"
STOP_MIN_MINUTES = 5.0  # --stop-at-limit starts no run in less (its start-up and compilation would be all it did)
STOP_GRACE_S = 600  # after SIGTERM, the run's step, checkpoint and exit get this long before SIGKILL


@dataclass(frozen=True)
class Run:
    """One fine-tuning run of the campaign.

    Attributes:
        protocol, method, task, seed: the run's labels (its place in the tables and its directory).
        settings: the protocol's and the method's dotted :class:`TrainConfig` settings (``{"optim.epochs": 5,
            "method.name": "baseline", ...}``); the task, the seed and the run's directory are added by
            :meth:`config`.
    """

    protocol: str
    method: str
    task: str
    seed: int
    settings: dict = field(hash=False, compare=False)

    @property
    def key(self) -> tuple:
        return self.protocol, self.method, self.task, self.seed

    def directory(self, runs_dir: str) -> str:
        return os.path.join(runs_dir, self.protocol, self.task, slug(self.method), f"seed{self.seed}")

    def config_path(self, runs_dir: str) -> str:
        """Where the run's configuration is written: ``config.json`` in its directory."""
        return os.path.join(self.directory(runs_dir), "config.json")

    def config(self, runs_dir: str = "runs", data_dir: str | None = None, eval_every: int = 0) -> TrainConfig:
        """The run's :class:`TrainConfig`: its settings, its task and seed, its directory under ``runs_dir`` as the
        output directory, no progress bar; ``data_dir`` and ``eval_every`` (steps between evaluations) when given.
        A setting that is not a :class:`TrainConfig` field, or a bad value, raises ``ValueError``."""
        settings = {
            **self.settings,
            "task.name": self.task,
            "seed": self.seed,
            "logging.output_dir": self.directory(runs_dir),
            "logging.progress": False,
        }
        if data_dir:
            settings["task.data_dir"] = data_dir
        if eval_every:
            settings["logging.eval_every"] = eval_every
        return TrainConfig.from_json({}, settings)


def slug(name: str) -> str:
    """A directory name for a method label ("softdecay (authors' placement)" -> "softdecay_authors_placement")."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def _matches(values: dict, when: dict) -> bool:
    return all(values.get(k) in (v if isinstance(v, list) else [v]) for k, v in when.items())


def sweep_label(method: str, setting: str, value) -> str:
    """A sweep cell's label: the method and the value it sweeps, a list (regulariser specs, which name their
    weights) as its items, anything else as ``setting=value`` (``"cosine [cosine=0.1]"``,
    ``"flow [optim.transform_learning_rate=1e-05]"``)."""
    text = ", ".join(map(str, value)) if isinstance(value, list) else f"{setting}={value}"
    return f"{method} [{text}]"


def _merged(config: dict, protocol: dict, method: str, settings: dict, task: str) -> dict:
    """A run's dotted settings: the model, the protocol's defaults, the method's settings and the protocol's
    overrides whose ``when`` matches the task, the method (its table name, for a sweep cell too) or a setting."""
    merged = {"model.name": config["model"], **protocol["defaults"], **settings}
    for override in protocol.get("overrides", []):
        if _matches({"task": task, "method": method, **merged}, override["when"]):
            merged.update(override["set"])
    return merged


def expand(config: dict, *, sweep: bool = False) -> list[Run]:
    """Every run of the campaign, protocol by protocol, task by task; or, with ``sweep``, of its sweeps.

    A protocol's ``sweeps`` name a task, a seed and per method the values of one or more settings, each swept on
    its own with the method's other settings kept (``{"cosine": {"method.regularizers": [["cosine=0.1"], ...]},
    "flow": {"optim.transform_learning_rate": [1e-05, ...]}}``); a cell is labelled by :func:`sweep_label`, except
    the cell whose configuration is the table's run of that method, task and seed, which is that run (same label,
    same directory: run once)."""
    runs = []
    for name, protocol in config["protocols"].items():
        methods = protocol["methods"]
        if sweep:
            sweeps = protocol.get("sweeps")
            if not sweeps:
                continue
            cells = [
                (
                    sweep_label(method, setting, value),
                    method,
                    {**methods[method], setting: value},
                    sweeps["task"],
                    sweeps["seed"],
                )
                for method, grid in sweeps["values"].items()
                for setting, values in grid.items()
                for value in values
            ]
        else:
            cells = [
                (method, method, settings, task, seed)
                for task in config["tasks"]
                for method, settings in methods.items()
                for seed in config["seeds"]
            ]
        for label, method, settings, task, seed in cells:
            run = Run(name, label, task, seed, _merged(config, protocol, method, settings, task))
            try:
                if label != method:  # a sweep cell with the table's own value is the table's run
                    table = Run(name, method, task, seed, _merged(config, protocol, method, methods[method], task))
                    run = table if replace(run, method=method).config() == table.config() else run
                run.config()
            except ValueError as e:
                raise ValueError(f"protocol {name!r}, method {label!r}, task {task!r}: {e}") from None
            runs.append(run)
    return runs


def select(runs: list[Run], only: dict) -> list[Run]:
    """The runs whose protocol/method/task/seed are among ``only``'s values (all runs for an empty ``only``)."""
    unknown = sorted(set(only) - {"protocol", "method", "task", "seed"})
    if unknown:
        raise SystemExit(f"--only: unknown key(s) {unknown}; use protocol, method, task, seed")
    return [r for r in runs if all(str(getattr(r, k)) in [str(v) for v in vals] for k, vals in only.items())]


def check_only(runs: list[Run], only: dict) -> None:
    """``SystemExit`` naming ``--only`` for a value of ``only`` that no run of ``runs`` has (``task=mprc``): a typo
    would otherwise select nothing, or less than asked, without a word."""
    select(runs, only)  # the keys
    for key, values in only.items():
        present = sorted({str(getattr(r, key)) for r in runs}, key=lambda v: (len(v), v))
        if missing := [v for v in values if v not in present]:
            raise SystemExit(f"--only: no run has {key} {', '.join(map(repr, missing))}; the {key}s are {present}")


def too_long(run: Run, config: dict, cost: dict | None) -> float | None:
    """The run's estimated minutes (:func:`experiments.benchmarks.glue_cost.run_minutes`) where they exceed the CPU
    campaign's ``max_run_minutes`` (a run longer than one sitting: its checkpoints live on the machine that ran it),
    else None (also without a cost table, an estimate or a limit)."""
    from experiments.benchmarks.glue_cost import run_minutes

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
    from experiments.benchmarks.glue_cost import run_minutes

    if minutes_left is None:
        return ordered[0]
    if stop:
        return ordered[0] if minutes_left >= STOP_MIN_MINUTES else None
    for run in ordered:
        minutes = run_minutes(cost, run)
        if minutes is not None and minutes * slowdown <= minutes_left:
            return run
    return None


def base_method(label: str) -> str:
    """The method of a table or sweep label ("cosine [cosine=0.1]" -> "cosine")."""
    return label.split(" [")[0]


def campaign_order(runs: list[Run], config: dict, cost: dict | None, sizes: dict) -> list[Run]:
    """Cheapest run first: by the cost table's estimated minutes (:func:`experiments.benchmarks.glue_cost.run_minutes`;
    without a table or for an untimed task, after the timed ones, by training-set size), then the tables' runs
    before the sweeps' other values (``"method [value]"``), then by the method's place in
    ``cpu_campaign.priority`` (then in the configuration), then by seed (so a method's seeds follow each other and
    its line, with its t-tests, is complete early)."""
    from experiments.benchmarks.glue_cost import run_minutes

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


def evals_every(run: Run, train_rows: int, per_epoch_evals: int) -> int:
    """Steps between evaluations so that an epoch holds ``per_epoch_evals`` of them (curve points)."""
    per_epoch = max(1, train_rows // run.config().optim.batch_size)
    return max(1, per_epoch // max(1, per_epoch_evals))


def changed_settings(config: TrainConfig) -> dict:
    """The dotted settings of ``config`` that differ from ``TrainConfig()``'s (what the campaign prints for a run);
    an optional section that the defaults leave unset (``flow``) counts with all its settings."""
    return {k: v for k, v in config.flat_json().items() if k not in DEFAULTS or v != DEFAULTS[k]}


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


def ttest(a, b) -> float | None:
    """Two-sample t-test p-value (equal variances) of two lists of values; None when it is undefined."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 2 or len(b) < 2 or (without_spread(a) and without_spread(b)):
        return None
    return float(scipy.stats.ttest_ind(a, b).pvalue)


def _stage_rows(method: str, results: dict) -> dict[str, tuple[str, dict, dict]]:
    """Table line(s) of one run: ``{line label: (stage, evaluation, timing)}`` (two lines for a two-stage run)."""
    stages = results["stages"]
    timing = results.get("timing", {})
    if len(stages) == 1:
        ((stage, evaluation),) = stages.items()
        return {method: (stage, evaluation, timing.get(stage, {}))}
    return {f"{method}: {stage}": (stage, evaluation, timing.get(stage, {})) for stage, evaluation in stages.items()}


def term_trace(log_path: str) -> dict[str, dict[str, tuple[float, float]]]:
    """``{stage: {term: (first, last)}}`` from a run's ``log.jsonl``: each regulariser term (a ``name@representation``
    key of the training rows, logged unweighted; scheduled values ``label/...`` left out) and the flow's ``flow``
    term at the first and the last logged training step of each stage. Empty where there is no log."""
    if not os.path.exists(log_path):
        return {}
    trace: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    with open(log_path) as f:
        for row in map(json.loads, f):
            if row.get("kind") != "train":
                continue
            terms = trace[row["stage"]]
            for key, value in row.items():
                if (key == "flow" or "@" in key) and "/" not in key:
                    terms[key] = (terms.get(key, (value, value))[0], value)
    return dict(trace)


def collect(runs: list[Run], runs_dir: str, *records_dirs: str) -> dict:
    """``{(task, protocol): {line: [per-seed record]}}`` of the finished runs; a record is the evaluation plus
    ``seconds_per_epoch``, ``seed``, ``pair`` (the run's dropout stream, :func:`pair_key`) and ``terms`` (the
    stage's regulariser terms at its first and last logged step, :func:`term_trace`)."""
    table: defaultdict[tuple, defaultdict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        directory = finished_record(run, runs_dir, *records_dirs)
        if directory is None:
            continue
        with open(os.path.join(directory, "results.json")) as f:
            results = json.load(f)
        campaign = os.path.join(directory, "campaign.json")
        pair = None
        if os.path.exists(campaign):
            with open(campaign) as f:
                pair = pair_key(json.load(f))
        trace = term_trace(os.path.join(directory, "log.jsonl"))
        for line, (stage, evaluation, timing) in _stage_rows(run.method, results).items():
            table[run.task, run.protocol][line].append(
                {
                    **evaluation,
                    "seconds_per_epoch": timing.get("seconds_per_epoch"),
                    "seed": run.seed,
                    "pair": pair,
                    "terms": trace.get(stage, {}),
                }
            )
    return table


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _p_fmt(p: float | None) -> str:
    """A p-value to three decimals, ``"< 0.001"`` below that (never a p of 0.000), ``"–"`` where undefined."""
    return "< 0.001" if p is not None and p < 0.001 else _fmt(p, ".3f")


def _q_fmt(q: float) -> str:
    """A q-value as the report prints it: like a p-value, * where below 0.05."""
    return _p_fmt(float(q)) + ("*" if q < 0.05 else "")


def _p_text(p: float | None, paired: float | None, seeds: list) -> str:
    """`` (p 0.330; paired 0.210, seeds 1,2)``: the unpaired and the paired p-value (``*`` below 0.05)."""

    def fmt(v):
        return _p_fmt(v) + ("*" if v is not None and v < 0.05 else "")

    pairs = f", seeds {','.join(map(str, seeds))}" if seeds else ""
    return f" (p {fmt(p)}; paired {fmt(paired)}{pairs})"


def task_table(
    task: str, lines: dict[str, list[dict]], protocol: dict, not_run: dict[str, str]
) -> tuple[str, list[dict]]:
    """Markdown table (and its JSON rows) of one task and protocol: each finished line with the t-tests against
    the protocol's baseline line, unpaired (:func:`ttest`) and paired over the seeds whose runs share a dropout
    stream (:func:`experiments.reproductions.glue_pairing.paired_ttest`); then a "not run" line, with its reason, for each
    method in ``not_run`` (``{method: why}``). ``†`` marks a method whose model differs from the baseline's."""
    from isojax.data.glue import glue_task

    metrics = glue_task(task).metrics
    baseline = protocol["baseline"]
    base = lines.get(baseline, [])
    headers = [
        "method",
        "seeds",
        *[f"{m} (p; paired p)" for m in metrics],
        *(h for _, h, _ in ISOTROPY_COLUMNS),
        TERMS_COLUMN,
        TIME_COLUMN[1],
    ]
    rows, payload = [], []
    for line, records in lines.items():
        method, _, stage = line.partition(": ")
        changed = (
            protocol["methods"].get(base_method(method), {}).get("method.name") in MODEL_CHANGES and stage != "finetune"
        )  # a two-stage run's first stage is the baseline's model
        cells = [line + (" †" if changed else ""), len(records)]
        entry: dict[str, object] = {"method": line, "seeds": [r["seed"] for r in records], "model_change": changed}
        for metric in metrics:
            values = [r[metric] for r in records]
            p, paired = None, None
            seeds: list[int] = []
            if line != baseline:
                p = ttest(values, [r[metric] for r in base])
                paired, seeds = paired_ttest(
                    {r["seed"]: (r[metric], r["pair"]) for r in records},
                    {r["seed"]: (r[metric], r["pair"]) for r in base},
                )
            cells.append(mean_std(values, 2) + ("" if line == baseline else _p_text(p, paired, seeds)))
            entry[metric] = {
                "values": values,
                "p_vs_baseline": p,
                "paired_p_vs_baseline": paired,
                "paired_seeds": seeds,
            }
        for key, _, digits in ISOTROPY_COLUMNS:
            entry[key] = column = [r.get(key) for r in records]
            cells.append(mean_std(column, digits))
        entry["terms"] = terms = line_terms(records)
        cells.append("; ".join(_terms_text(terms)) or "–")
        entry[TIME_COLUMN[0]] = times = [r.get(TIME_COLUMN[0]) for r in records]
        cells.append(mean_std(times, TIME_COLUMN[2]))
        rows.append(cells)
        payload.append(entry)
    for method, why in not_run.items():
        rows.append([method, 0, f"not run: {why}", *[""] * (len(headers) - 3)])
        payload.append({"method": method, "seeds": [], "not_run": why})
    return markdown_table(headers, rows), payload


def line_terms(records: list[dict]) -> dict[str, dict]:
    """Per regulariser term of a line's seeds (their ``terms``, :func:`term_trace`): its value at the first and the
    last logged training step, per seed and as means over the seeds that logged it."""
    out = {}
    for key in dict.fromkeys(k for r in records for k in r.get("terms", {})):
        first, last = zip(*(r["terms"][key] for r in records if key in r.get("terms", {})))
        out[key] = {
            "first": list(first),
            "last": list(last),
            "first_mean": float(np.mean(first)),
            "last_mean": float(np.mean(last)),
        }
    return out


def _terms_text(terms: dict[str, dict]) -> list[str]:
    """``["istar@cls 0.0977 → 0.00112", ...]``: each term of :func:`line_terms` from its first to its last mean."""
    return [f"{k} {v['first_mean']:.3g} → {v['last_mean']:.3g}" for k, v in terms.items()]


def effect(values: list, base: list) -> tuple[float, float | None]:
    """Difference of the means and Cohen's d (over the pooled sample standard deviation; None when undefined)."""
    a, b = np.asarray(values, np.float64), np.asarray(base, np.float64)
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2 or (without_spread(a) and without_spread(b)):
        return diff, None
    pooled = np.sqrt(((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2))
    return diff, (float(diff / pooled) if pooled > 0 else None)


def _isotropy_text(row: dict, base: dict, pairs: list) -> tuple[str, float | None]:
    """``("; IsoScore 0.0399 vs 0.0849 (paired p 0.012), istar@cls 0.0977 → 0.00112 in training", 0.012)``: the
    mean dev IsoScore of a method's line against the baseline's, with the paired t-test over the seeds ``pairs``
    (those of the task metric's paired test, :func:`experiments.reproductions.glue_pairing.paired_ttest`; shown from
    two pairs on, "–" where the differences are all equal), and its regulariser terms' means at the first and the
    last logged step; and that paired p (None where there is none)."""
    text, p = "", None
    if all(v is not None for v in (*row.get("isoscore", [None]), *base.get("isoscore", [None]))):
        text = f"; IsoScore {np.mean(row['isoscore']):.3g} vs {np.mean(base['isoscore']):.3g}"
        if len(pairs) > 1:
            p, _ = paired_ttest(
                *({s: (v, "") for s, v in zip(line["seeds"], line["isoscore"]) if s in pairs} for line in (row, base))
            )
            text += f" (paired p {_p_fmt(p)})"
    terms = _terms_text(row.get("terms", {}))
    return text + (f", {', '.join(terms)} in training" if terms else ""), p


def _on_seeds(base: dict, seeds: list, metric: str) -> dict:
    """The baseline line ``base`` (a table payload entry) restricted to ``seeds``: its ``metric`` values and dev
    IsoScores of those seeds only, so that a method with fewer finished seeds is compared with the same seeds."""
    keep = [base["seeds"].index(s) for s in seeds]
    return {
        **base,
        "seeds": list(seeds),
        metric: {**base[metric], "values": [base[metric]["values"][i] for i in keep]},
        "isoscore": [base["isoscore"][i] for i in keep] if "isoscore" in base else [None],
    }


def summary(config: dict, tables: list[dict]) -> str:
    """Paper by paper (the configuration's ``summaries``): its claim, then what the finished runs show on each
    task (first metric: difference to the protocol's baseline, Cohen's d, unpaired and paired p; the dev IsoScore
    against the baseline's with its paired p and the regulariser terms' first and last logged values), and the tasks
    where the method was not run; then those p-values corrected for their number (:func:`corrected`) and the
    differences the seeds can detect (:func:`experiments.reproductions.glue_power.detectable`)."""
    from isojax.data.glue import glue_task

    by_cell = {(t["task"], t["protocol"]): {r["method"]: r for r in t["rows"]} for t in tables}
    out, tests = ["## Summary by paper", ""], {}
    for paper in config["summaries"]:
        out.append(f"**{paper['paper']}**. Claim: {paper['claim']}")
        protocol = config["protocols"][paper["protocol"]]
        for method in paper["methods"]:
            shown, missing = [], []
            for task in config["tasks"]:
                rows = by_cell.get((task, paper["protocol"]), {})
                line = method if method in rows else f"{method}: {paper.get('stage', '')}"
                row, base = rows.get(line), rows.get(protocol["baseline"])
                metric = glue_task(task).metrics[0]
                if not row or not row.get("seeds") or not base or not base.get("seeds"):
                    missing.append(task)
                    continue
                seeds_text = f"{len(row['seeds'])} vs {len(base['seeds'])} seeds"
                if set(row["seeds"]) < set(base["seeds"]):  # fewer seeds: compared with the baseline's same seeds
                    base = _on_seeds(base, row["seeds"], metric)
                    seeds_text += (
                        f"; difference, d and IsoScore against the baseline's seeds {','.join(map(str, row['seeds']))}"
                    )
                diff, d = effect(row[metric]["values"], base[metric]["values"])
                p, paired = row[metric]["p_vs_baseline"], row[metric]["paired_p_vs_baseline"]
                pairs = len(row[metric]["paired_seeds"])
                paired_text = _p_fmt(paired)
                if paired is None and pairs > 1:  # every pair differs alike: ttest_rel is undefined
                    by_seed = dict(zip(row["seeds"], row[metric]["values"]))
                    base_by_seed = dict(zip(base["seeds"], base[metric]["values"]))
                    seed = row[metric]["paired_seeds"][0]
                    pair = [by_seed[seed], base_by_seed[seed]]
                    same = without_spread(pair)
                    paired_text += (
                        " (every pair equal)" if same else f" (every pair differs by {pair[0] - pair[1]:+.2f})"
                    )
                isotropy, isotropy_p = _isotropy_text(row, base, row[metric]["paired_seeds"])
                shown.append(
                    f"{task} {metric} {diff:+.2f} (d {_fmt(d, '+.2f')}, p {_p_fmt(p)}, paired p "
                    f"{paired_text} over {pairs} pair{'' if pairs == 1 else 's'}; {seeds_text}{isotropy})"
                )
                tests[f"{method} on {task}"] = {
                    "task metric (unpaired)": p,
                    "task metric (paired)": paired,
                    "dev IsoScore (paired)": isotropy_p,
                }
            text = "; ".join(shown) if shown else "no finished run yet"
            out.append(f"- {method} vs baseline: {text}" + (f". Not run: {', '.join(missing)}." if missing else "."))
        out.append("")
    baselines = {name: protocol["baseline"] for name, protocol in config["protocols"].items()}
    metrics = {task: glue_task(task).metrics[0] for task in config["tasks"]}
    return "\n".join(out + [corrected(tests), detectable(tables, baselines, metrics)])


def corrected(tests: dict[str, dict[str, float | None]]) -> str:
    """The summary's p-values corrected for their number: for each family (``{comparison: {family: p}}``, e.g. the
    task metric's paired p of every method and task), the adjusted p-values (q-values,
    ``scipy.stats.false_discovery_control``) over the comparisons where that p is defined; lists the comparisons
    with p < 0.05 and their q. Benjamini-Hochberg (BH) controls the expected share of false discoveries among those
    with q < 0.05 for independent or positively dependent tests; the comparisons of one task share its baseline's
    runs, so Benjamini-Yekutieli (BY: BH's q times sum_{i<=m} 1/i for m tests, at most 1), which holds under any
    dependence, is given beside it."""
    out = [
        "**Corrected for the number of comparisons**: q-values (scipy.stats.false_discovery_control) over each family "
        "of the summary's p-values, each method and task once: Benjamini-Hochberg (q), and in brackets "
        "Benjamini-Yekutieli (BY), which holds under any dependence between the tests (a task's comparisons share "
        "its baseline); * q < 0.05.",
    ]
    for family in dict.fromkeys(f for ps in tests.values() for f in ps):
        named = {name: p for name, ps in tests.items() if (p := ps.get(family)) is not None}
        if not named:
            continue
        q = {
            method: dict(zip(named, scipy.stats.false_discovery_control(list(named.values()), method=method)))
            for method in ("bh", "by")
        }
        below = sorted((p, name) for name, p in named.items() if p < 0.05)
        listed = ", ".join(
            f"{name} p {_p_fmt(p)} q {_q_fmt(q['bh'][name])} (BY {_q_fmt(q['by'][name])})" for p, name in below
        )
        out.append(f"- {family}: {len(below)} of {len(named)} p < 0.05" + (f": {listed}." if below else "."))
    return "\n".join(out) + "\n"


def curves(runs: list[Run], runs_dir: str, records_dirs: tuple, path: str, title: str) -> str | None:
    """One panel per task (three to a row): the first task metric on dev over training steps, mean over seeds, one
    line per protocol/method (from the runs' ``log.jsonl`` eval records), drawn alike in every panel (a colour per
    method, the baseline black; solid App. B, dashed the shrink protocol) and named in one legend below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from isojax.data.glue import glue_task
    from isojax.train.logs import JsonLog, latest_evaluations

    series: defaultdict[str, defaultdict[str, list[list[dict]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        directory = finished_record(run, runs_dir, *records_dirs)
        if directory is not None:
            evaluations = latest_evaluations(JsonLog(os.path.join(directory, "log.jsonl")).read())
            series[run.task][f"{run.protocol}: {run.method}"].append(evaluations)
    if not series:
        return None
    tasks = sorted(series)
    labels = sorted({label for task in tasks for label in series[task]})
    palette = plt.get_cmap("tab20")  # 20 listed colours; palette(i) is the i-th
    methods = sorted({label.split(": ", 1)[1] for label in labels} - {"baseline"})
    style = {
        label: dict(
            color="black" if method == "baseline" else palette(methods.index(method) % palette.N),
            linewidth=2.2 if method == "baseline" else 1.2,
            zorder=3 if method == "baseline" else 2,
            marker="os^Dv<>p"[labels.index(label) % 8],
            linestyle="-" if protocol == "appB" else "--",
        )
        for label in labels
        for protocol, method in [label.split(": ", 1)]
    }  # one look per protocol/method in every panel: the method's colour (baseline black), the protocol's line
    columns = min(3, len(tasks))
    rows = -(-len(tasks) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.6 * rows + 1.2), squeeze=False)
    for ax in axes.flat[len(tasks) :]:
        ax.set_visible(False)
    handles = {}
    for ax, task in zip(axes.flat, tasks):
        metric = glue_task(task).metrics[0]
        for label, seeds in sorted(series[task].items()):
            steps = sorted(set.intersection(*[{r["step"] for r in s} for s in seeds]))
            values = [np.mean([next(r[metric] for r in s if r["step"] == step) for s in seeds]) for step in steps]
            (handles[label],) = ax.plot(steps, values, markersize=3, label=label, **style[label])
        sizes = {len(s) for s in series[task].values()}
        count = "-".join(map(str, sorted({min(sizes), max(sizes)})))
        ax.set(title=f"{task}: {metric} (dev; mean of {count} seeds)", xlabel="step")
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
    fig.legend(
        [handles[label] for label in labels], labels, loc="lower center", ncol=4, fontsize=7, frameon=False
    )  # one legend for every panel, below them
    fig.suptitle(title, fontsize=9)
    legend_rows = -(-len(labels) // 4)
    fig.tight_layout(rect=(0, 0.035 * legend_rows / rows, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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


def not_run_reason(run: Run, selected: Collection, cost: dict | None, config: dict | None = None) -> str:
    """Why a run has no record: not reached yet by the CPU campaign, or left out of it (by its selections, or as
    longer than its ``max_run_minutes``, :func:`too_long`); with its estimated minutes on this CPU from the cost
    table where the task was timed."""
    from experiments.benchmarks.glue_cost import run_minutes

    minutes = run_minutes(cost, run)
    estimate = "" if minutes is None else f", about {minutes:.0f} min per run on this CPU (glue_cost estimate)"
    if run.key in selected:
        return "in the CPU campaign, not reached yet" + estimate
    if config and too_long(run, config, cost) is not None:
        limit = config["cpu_campaign"]["max_run_minutes"]
        return (
            f"left to an accelerator: about {minutes:.0f} min per run on this CPU (glue_cost estimate), longer than "
            f"the CPU campaign's {limit:g} min (one sitting)"
        )
    return "not in the CPU campaign's selection, left to an accelerator" + estimate


def remaining_cost(runs: list[Run], selected: set, cost: dict | None, runs_dir: str, *records_dirs: str) -> str:
    """What is left of ``runs``: how many of the CPU campaign's runs (keys ``selected``) and of the others have no
    record, each with its estimated CPU-hours on the timed machine (the sum of :func:`glue_cost.run_minutes`;
    runs of an untimed task are counted apart). Runs that non-finite numbers stopped are counted on their own.
    Where finished runs recorded their wall time (``campaign.json``), the ratio of wall time to estimate over them
    (median and middle half) says how far the estimates held on the machine as it was loaded, and the hours left
    are also given at the median ratio."""
    from experiments.benchmarks.glue_cost import run_minutes

    left = [r for r in runs if pending(r, runs_dir, *records_dirs)]
    unfinished = [r for r in runs if finished_record(r, runs_dir, *records_dirs) is None]
    stopped = len(unfinished) - len(left)
    ratios = [
        record["wall_seconds"] / 60 / minutes
        for run in runs
        if (record := campaign_record(run, runs_dir, *records_dirs)) and (minutes := run_minutes(cost, run))
    ]
    median = float(np.median(ratios)) if ratios else None
    parts = []
    for label, group in (
        ("in the CPU campaign", [r for r in left if r.key in selected]),
        ("left to an accelerator", [r for r in left if r.key not in selected]),
    ):
        estimates = [run_minutes(cost, r) for r in group]
        timed = [m for m in estimates if m is not None]
        text = f"{len(group)} {label}"
        if timed:
            text += f" (about {sum(timed) / 60:.0f} CPU-hours on this CPU by the glue_cost estimates"
            text += f", {median * sum(timed) / 60:.0f} at the finished runs' median ratio" if median else ""
            text += f"; {len(estimates) - len(timed)} of an untimed task)" if len(timed) < len(estimates) else ")"
        parts.append(text)
    finished = f"{len(runs) - len(unfinished)} of {len(runs)} runs finished" + (
        f", {stopped} stopped by non-finite numbers" if stopped else ""
    )
    if ratios:
        q1, q3 = np.percentile(ratios, [25, 75])
        finished += (
            f" (their wall time was {median:.1f}x their glue_cost estimate, median of {len(ratios)}; the middle half "
            f"{q1:.1f}x to {q3:.1f}x)"
        )
    return f"{finished}; not yet run: " + " and ".join(parts) + "."


def report(
    config: dict,
    runs: list[Run],
    runs_dir: str,
    out: str,
    name: str,
    prov: dict,
    header: str,
    *,
    selected: Collection = frozenset(),
    cost: dict | None = None,
    records_dirs: tuple = (),
    summarise: bool = True,
) -> str:
    """Write the tables (every method of every task and protocol of ``runs``, "not run" with its reason where no
    seed finished), the summary by paper, the curves and the run records (module docstring); return the
    Markdown path. ``selected``: the keys of the CPU campaign's runs; ``records_dirs``: further places that
    hold committed run records (the sweep's report also finds the table runs it shares); ``summarise``: add the
    summary by paper (not for a sweep, which has no baseline lines)."""
    records_dir = os.path.join(out, f"{name}_runs")
    copy_records(runs, runs_dir, records_dir)
    dirs = (records_dir, *records_dirs)
    table = collect(runs, runs_dir, *dirs)
    sections, payload = [header], []
    for task in config["tasks"]:
        for protocol, spec in config["protocols"].items():
            cell = [r for r in runs if (r.task, r.protocol) == (task, protocol)]
            if not cell:
                continue
            unfinished = [r for r in cell if finished_record(r, runs_dir, *dirs) is None]
            diverged = {r: error for r in unfinished if (error := diverged_record(r, runs_dir, *dirs))}
            lines = table.get((task, protocol), {})
            done = {base_method(line.split(": ")[0]) for line in lines}
            not_run = {}
            for method in dict.fromkeys(r.method for r in unfinished if r.method not in done):
                stopped = [r.seed for r in diverged if r.method == method]
                waiting = [r for r in unfinished if r.method == method and r not in diverged]
                why = (
                    [f"seed{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))} diverged"]
                    if stopped
                    else []
                )
                not_run[method] = "; ".join(
                    why + ([not_run_reason(waiting[0], selected, cost, config)] if waiting else [])
                )
            text, rows = task_table(task, lines, spec, not_run)
            if diverged:
                text += (
                    "\n\nStopped by non-finite numbers (`isojax finetune` exit status 3; not run again): "
                    + "; ".join(
                        f"{r.method} seed {r.seed}: {error.partition('; ')[0]}" for r, error in diverged.items()
                    )
                )
            sections.append(
                f"## {task}, protocol {protocol} ({len(cell) - len(unfinished)} of {len(cell)} runs "
                "finished)\n\n" + text
            )
            payload.append({"task": task, "protocol": protocol, "rows": rows})
    if summarise and config.get("summaries"):
        sections.append(summary(config, payload))
    picture = curves(
        runs,
        runs_dir,
        dirs,
        os.path.join(out, f"{name}_curves.png"),
        title=f"{config['title']}: dev metric over training, mean over seeds",
    )
    if picture:
        sections.append(f"![curves]({os.path.basename(picture)})")
    sections.append(
        f"Run records (results.json, log.jsonl, campaign.json of every finished run): "
        f"`{os.path.basename(records_dir)}/`"
    )
    protocols = {k: v["source"] for k, v in config["protocols"].items()}
    return write_result(
        name, config["title"], sections, {"protocols": protocols, "tables": payload}, prov=prov, directory=out
    )


def _pairs(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--only: expected KEY=V1,V2, got {item!r}")
        out[key] = value.split(",")
    return out


def read_cost(path: str, *, required: bool = False) -> dict | None:
    """The cost table (``glue_cost.json``, :mod:`experiments.benchmarks.glue_cost`), or None where there is none yet
    (``required``: a table the user named, whose absence is a ``SystemExit``)."""
    if not os.path.exists(path):
        if required:
            raise SystemExit(f"--cost {path}: no such file (python -m experiments.benchmarks.glue_cost writes it)")
        return None
    with open(path) as f:
        return json.load(f)


def _commits(runs: list[Run], runs_dir: str, records_dirs: tuple) -> list[str]:
    """The commits the finished runs among ``runs`` were made at (from their ``campaign.json``)."""
    return sorted({record["commit"] for run in runs if (record := campaign_record(run, runs_dir, *records_dirs))})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--data-dir", default=DEFAULT_DATA, help="the offline data (default ../shared/data)")
    ap.add_argument("--only", nargs="*", default=[], metavar="KEY=V1,V2", help="protocol, method, task or seed")
    ap.add_argument(
        "--cpu-campaign", action="store_true", help="the configuration's cpu_campaign selection (and its sweeps)"
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="the sweeps (regulariser weights, the flow's learning rate) instead of the table runs",
    )
    ap.add_argument("--runs-dir", default=os.path.join("runs", "glue_methods"))
    ap.add_argument("--out", default=RESULTS, help="where the report goes (default experiments/results)")
    ap.add_argument(
        "--cost",
        help="the cost table that orders the runs (python -m experiments.benchmarks.glue_cost; default "
        "experiments/results/glue_cost.json, where there is one)",
    )
    ap.add_argument("--name", default="glue_methods", help="name of the table report (default glue_methods)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--report-only", action="store_true", help="tabulate the finished runs, run nothing")
    mode.add_argument("--dry-run", action="store_true", help="print the runs' commands in the campaign's order")
    ap.add_argument(
        "--time-limit",
        type=float,
        metavar="MINUTES",
        help="start a run only where the cost table's estimate fits in what is left of MINUTES since the campaign "
        "started (with --dry-run: what the estimates of the runs listed before it leave), each estimate scaled by how much "
        "longer than theirs this sitting's runs took; stop when none does",
    )
    ap.add_argument(
        "--stop-at-limit",
        action="store_true",
        help="with --time-limit: run the runs in the campaign's order whatever their estimates, stop the one in "
        "progress at the limit (SIGTERM: it checkpoints its step and exits) and leave it to the next sitting, "
        f"which resumes it; no run starts with less than {STOP_MIN_MINUTES:g} min left",
    )
    args = ap.parse_args(argv)
    if args.time_limit is not None and not args.time_limit > 0:
        ap.error(f"--time-limit must be a positive number of minutes, got {args.time_limit}")
    if args.stop_at_limit and args.time_limit is None:
        ap.error("--stop-at-limit needs --time-limit (the limit to stop a run at)")
    # the runs are processes started in the repository root: the paths they are given must not depend on the cwd
    args.runs_dir = os.path.abspath(args.runs_dir)
    args.data_dir = args.data_dir and os.path.abspath(args.data_dir)
    try:
        with open(args.config) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        ap.error(f"--config {args.config}: {e}")
    only = _pairs(args.only)
    cost_required, args.cost = args.cost is not None, args.cost or os.path.join(RESULTS, "glue_cost.json")
    cost = read_cost(args.cost, required=cost_required)
    table_runs, sweep_runs = expand(config), expand(config, sweep=True)
    campaign: dict[str, list[Run]] = {}  # the CPU campaign's table runs and sweep runs
    sweep_name = "glue_methods_sweep"
    if "cpu_campaign" in config:
        campaign = {
            args.name: campaign_selection(table_runs, config, cost),
            sweep_name: [r for r in sweep_runs if too_long(r, config, cost) is None]
            if config["cpu_campaign"].get("sweep")
            else [],
        }
    selected = {r.key for part in campaign.values() for r in part}
    if args.sweep:
        parts = {sweep_name: sweep_runs}
    elif args.cpu_campaign:
        parts = campaign
    else:
        parts = {args.name: table_runs}
    check_only([r for part in parts.values() for r in part], only)
    parts = {name: select(runs, only) for name, runs in parts.items()}
    records_dirs = tuple(os.path.join(args.out, f"{name}_runs") for name in (args.name, sweep_name))
    prov = provenance("glue_methods")  # of the code that runs, taken before it runs
    runs = list({r.key: r for part in parts.values() for r in part}.values())  # a sweep's table value: one run
    todo = [r for r in runs if pending(r, args.runs_dir, *records_dirs)]
    print(f"{len(runs)} runs selected, {len(runs) - len(todo)} done, {len(todo)} to run", flush=True)
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.abspath(os.path.join(args.runs_dir, "jax_cache")))
    if not args.report_only and todo:
        from experiments.benchmarks.glue_cost import run_minutes
        from isojax.data.glue import load_glue

        sizes = {task: len(load_glue(task, "train", data_dir=args.data_dir).labels) for task in {r.task for r in todo}}
        stream, masks = (None, None) if args.dry_run else (dropout_stream(), dropout_masks())
        started, listed = time.monotonic(), 0.0  # listed: the estimated minutes of the runs --dry-run printed
        took, estimated = 0.0, 0.0  # this sitting's finished runs: their wall minutes and their estimates' sum
        while todo:  # the cost table is read again before each run: a timing that finishes later reorders the rest
            cost = read_cost(args.cost)
            spent = listed if args.dry_run else (time.monotonic() - started) / 60
            left = None if args.time_limit is None else args.time_limit - spent
            # a loaded machine: this sitting's runs took longer than their estimates, so the next one will too
            slowdown = max(1.0, took / estimated) if estimated else 1.0
            run = next_run(campaign_order(todo, config, cost, sizes), cost, left, slowdown, stop=args.stop_at_limit)
            if run is None:
                scaled = f" (estimates x {slowdown:.2f}, as this sitting's runs took)" if slowdown > 1 else ""
                none = f"less than {STOP_MIN_MINUTES:g} min left" if args.stop_at_limit else "none estimated to finish"
                print(f"--time-limit: {len(todo)} run(s) left, {none} in the {left:.0f} min left{scaled}")
                break
            todo.remove(run)
            estimate = run_minutes(cost, run) or 0.0
            listed += estimate
            every = evals_every(run, sizes[run.task], config["evals_per_epoch"])
            changed = changed_settings(run.config(args.runs_dir, args.data_dir, every))
            path = run.config_path(args.runs_dir)
            print(f"== {run.key}: python -m isojax.cli finetune --config {path}\n   {json.dumps(changed)}", flush=True)
            if left is not None and estimate * slowdown > left:  # only with --stop-at-limit
                print(
                    f"   (estimated {estimate * slowdown:.0f} min: stopped at the limit, resumed by the next sitting)"
                )
            if args.dry_run:
                continue
            stop_after = max(0.0, started + 60 * args.time_limit - time.monotonic()) if args.stop_at_limit else None
            outcome = run_one(run, args.runs_dir, args.data_dir, every, env, stop_after)
            sitting = {"wall_seconds": outcome.seconds, "commit": prov["commit"], "machine": prov["machine"]}
            sittings = Path(run.directory(args.runs_dir), "sittings.json")  # a stopped run's earlier sittings
            earlier = json.loads(sittings.read_text()) if sittings.exists() else []
            if outcome.stopped:
                write_json(sittings, [*earlier, sitting])
                print(
                    f"{run.key} stopped {outcome.stopped} after {outcome.seconds / 60:.0f} min (sitting "
                    f"{len(earlier) + 1}); its checkpoint is in {run.directory(args.runs_dir)}, and running the "
                    "campaign again resumes it",
                    flush=True,
                )
                break
            if not earlier:  # a run of one sitting: a measure of this sitting's speed
                took, estimated = took + outcome.seconds / 60, estimated + estimate
            record = {
                **sitting,
                "wall_seconds": outcome.seconds + sum(e["wall_seconds"] for e in earlier),
                "pairing": pairing_record(run.config(), prov["commit"], stream, masks),
            }
            if earlier:
                record["earlier_sittings"] = earlier
            if outcome.diverged:
                record["diverged"] = outcome.diverged  # then this file is the run's only record
            write_json(Path(run.directory(args.runs_dir), "campaign.json"), record)
            for name, part in parts.items():  # kept as soon as it is done
                if run.key in {r.key for r in part}:
                    copy_records([run], args.runs_dir, os.path.join(args.out, f"{name}_runs"))
    if args.dry_run:
        return 0
    reports = {sweep_name: select(sweep_runs, only)} if args.sweep else {args.name: select(table_runs, only)}
    if args.cpu_campaign and config["cpu_campaign"].get("sweep"):
        reports[sweep_name] = select(sweep_runs, only)
    for name, runs in reports.items():
        commits = _commits(runs, args.runs_dir, records_dirs)
        header = (
            f"Model `{config['model']}`; dev sets; mean ± std over seeds (population std); in brackets the "
            "p-values against the protocol's baseline: the two-sample t-test (scipy.stats.ttest_ind, equal "
            "variances) and the paired t-test (scipy.stats.ttest_rel) over the seeds whose runs share the "
            "data order and the dropout stream (listed; `experiments/reproductions/glue_pairing.py` says what pairs two "
            "runs); * p < 0.05, per comparison (of 10 independent tests at the 5% level, at least one falls below "
            "it by chance with probability 0.40; the summary ends with the p-values corrected for the number of "
            "methods and tasks compared, and the smallest differences the seeds can detect). † marks a method whose "
            "model differs from the baseline's (SoftDecay, IsoBN, flow, the Isotropy Layer's stage 2): its runs share the data order and the per-site dropout "
            "keys, but the masks act on other activations. The added loss terms (a regulariser, or the flow's "
            "negative log-likelihood per dimension) are the mean over seeds of the unweighted term at the first "
            "and the last logged training step (the stage's last step itself in runs from commit 4e5d195 on): "
            "whether the optimiser moved it. s / epoch is each run's own training time per "
            "epoch (evaluation and checkpoints left out): runs made at different times on a shared machine "
            "differ by its load as well; `experiments/results/glue_cost.md` gives the measured cost per "
            'task. A method with no finished seed says "not run" and why. Protocols:\n\n'
            + "\n".join(f"- **{k}**: {v['source']}" for k, v in config["protocols"].items())
            + f"\n\nCPU campaign: {config.get('cpu_campaign', {}).get('note', '–')} Runs made at commit(s) "
            f"{', '.join(commits) or '–'}. " + remaining_cost(runs, selected, cost, args.runs_dir, *records_dirs)
        )
        path = report(
            config,
            runs,
            args.runs_dir,
            args.out,
            name,
            prov,
            header,
            selected=selected,
            cost=cost,
            records_dirs=records_dirs,
            summarise=name != sweep_name,
        )
        with open(path) as f:
            print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
