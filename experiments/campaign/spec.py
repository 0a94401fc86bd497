"""What the campaign runs: the runs a configuration expands to (protocol x method x task x seed, and the sweeps),
each one's :class:`~isojax.train.config.TrainConfig`, and the selection ``--only`` makes of them.

The configuration (committed, ``experiments/reproductions/configs/glue_methods.json``) names the model, tasks, seeds
and *protocols*: each protocol is one paper's hyperparameters (``defaults``, and ``overrides`` for the runs whose task
or method match, both as dotted settings of :class:`~isojax.train.config.TrainConfig` such as
``"optim.learning_rate"``) with its own baseline and its methods (a method = the settings that make it:
``"method.name"``, ``"method.regularizers"``, ...).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

from experiments.tooling.report import EXPERIMENTS, SHARED_DATA
from isojax.train.config import TrainConfig

DEFAULT_CONFIG = os.path.join(EXPERIMENTS, "reproductions", "configs", "glue_methods.json")
DEFAULT_DATA = SHARED_DATA
DEFAULTS = TrainConfig().flat_json()  # what a run's printed settings leave out


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


def parse_only(items: list[str]) -> dict:
    """``--only``'s ``KEY=V1,V2`` items as ``{key: [values]}`` (:func:`select`)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--only: expected KEY=V1,V2, got {item!r}")
        out[key] = value.split(",")
    return out


def base_method(label: str) -> str:
    """The method of a table or sweep label ("cosine [cosine=0.1]" -> "cosine")."""
    return label.split(" [")[0]


def evals_every(run: Run, train_rows: int, per_epoch_evals: int) -> int:
    """Steps between evaluations so that an epoch holds ``per_epoch_evals`` of them (curve points)."""
    per_epoch = max(1, train_rows // run.config().optim.batch_size)
    return max(1, per_epoch // max(1, per_epoch_evals))


def changed_settings(config: TrainConfig) -> dict:
    """The dotted settings of ``config`` that differ from ``TrainConfig()``'s (what the campaign prints for a run);
    an optional section that the defaults leave unset (``flow``) counts with all its settings."""
    return {k: v for k, v in config.flat_json().items() if k not in DEFAULTS or v != DEFAULTS[k]}
