"""The fine-tuning loop: :func:`fit` runs a :class:`~isojax.train.config.TrainConfig` from start or from its
latest checkpoint to the end, evaluating, logging and checkpointing on the way.

Order of work: the configuration, devices and model are checked before any data is read or step compiled;
then each stage (fine-tuning; the Isotropy Layer stage for ``isotropy_layer``) runs its batches. Batch ``k``
of a stage is batch ``k mod E`` of epoch ``k // E`` (E = batches per epoch, ``drop_last``), shuffled by
``(seed, epoch)``, so the data position follows from the step and a resumed run sees exactly the batches the
interrupted one had left. Checkpoints record the position too (``meta``), with the configuration: resuming
with a configuration that changes the training itself is refused.

Non-finite steps: a step whose loss or gradient is NaN or infinite is skipped (its update is not applied, the batch
is consumed; :func:`~isojax.train.step.make_train_step`), logged as a warning and counted in the train records
(``nonfinite_steps``, per stage). No checkpoint is written while the latest steps were skipped, so every checkpoint
holds the state after an applied update (and :class:`~isojax.train.checkpoint.Checkpoints` refuses a non-finite
state). After ``max_nonfinite_steps`` skipped steps in a row the run stops with :class:`NonFiniteTrainingError`,
naming the steps and the last good checkpoint; rerunning the same command resumes from that checkpoint. The skip
counters live in the train state and are read where the loop waits for the device anyway (log, evaluation and
checkpoint steps, the stage's end), so the steps are not synchronised one by one; a run stops at the first such
step at or after the streak's limit.

Stopping: on ``SIGTERM`` (a scheduler's time limit, a preempted VM) the run finishes the step in flight, checkpoints
it, logs a ``stop`` record and raises :class:`~isojax.train.preemption.TrainingStopped`; rerunning the same command
resumes there (:mod:`isojax.train.preemption`; in a multi-process run every process stops at the same step). In one
process, a ``SIGTERM`` while the run still loads (the model, the data, the checkpoint to resume from) raises
``TrainingStopped`` at once.

In a multi-process run (:mod:`isojax.train.parallel`) every process runs this loop: each tokenises and feeds
only its rows of every batch (:mod:`isojax.train.feed`), each writes its shards of the checkpoints, and process 0
alone writes the logs, curves and results.

What depends on the kind of task is a *recipe* (:class:`~isojax.train.tasks.base.TaskRecipe`, chosen by
:func:`~isojax.train.tasks.recipe_for`: the model, data, objective and evaluation of a GLUE task or of a
sequence-to-sequence task, :mod:`isojax.train.tasks`); this module knows no task type. Everything else (stages,
devices, checkpoints, resuming, logs, timing) is one loop.

Outputs in ``output_dir``: ``checkpoints/``, ``log.jsonl`` (:mod:`isojax.train.logs`), ``curves.png`` (task
metric and isotropy over training), ``results.json`` (configuration, final evaluation of every stage, timing;
written last and atomically, so it marks a finished run).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, NoReturn

import flax.linen as nn
import jax
import numpy as np
import optax
from tqdm.auto import tqdm

from isojax._files import write_json
from isojax._stats import real_rows
from isojax.train.checkpoint import Checkpoints
from isojax.train.config import RESUMABLE, LoggingConfig, Stage, TrainConfig
from isojax.train.feed import Rows, batch_indices, process_batches
from isojax.train.logs import JsonLog, plot_curves
from isojax.train.optim import make_optimizer, schedule
from isojax.train.parallel import make_runner, select_devices
from isojax.train.preemption import StopRequest, TrainingStopped
from isojax.train.state import TrainState, create_state
from isojax.train.step import make_train_step
from isojax.train.tasks import recipe_for
from isojax.train.tasks.base import D, M, Runner, TaskRecipe

log = logging.getLogger(__name__)


class NonFiniteTrainingError(FloatingPointError):
    """``max_nonfinite_steps`` steps in a row had a non-finite loss or gradient (module docstring)."""


@dataclasses.dataclass
class FitResult:
    """What :func:`fit` returns.

    Attributes:
      output_dir: the run directory (``log.jsonl``, ``curves.png``, ``results.json``, ``checkpoints/``).
      step: the global step count at the end (every stage's steps).
      metrics: the last evaluation: task metrics and isotropy measures by name (floats).
      stages: stage name -> that stage's final evaluation.
      params: the final parameters, host NumPy arrays in the model's tree.
    """

    output_dir: str
    step: int
    metrics: dict[str, float]
    stages: dict[str, dict[str, float]]
    params: dict


def check_setup(config: TrainConfig, model: nn.Module) -> None:
    """What the configuration asks of these devices and of the model's sizes (raises ``ValueError`` before
    training)."""
    enc = model.encoder.config
    sizes = {"attention heads": enc.num_attention_heads, "intermediate size": enc.intermediate_size}
    if enc.decoder_layers:
        sizes.update({"decoder attention heads": enc.decoder_attention_heads, "decoder ffn size": enc.decoder_ffn_dim})
    if config.placement.model_parallel > 1 and any(v % config.placement.model_parallel for v in sizes.values()):
        raise ValueError(
            f"model_parallel={config.placement.model_parallel} must divide the "
            + ", ".join(f"{name} ({v})" for name, v in sizes.items())
        )
    num_devices = len(select_devices(config.placement.devices))
    data_size = num_devices // config.placement.model_parallel if config.placement.parallel == "mesh" else num_devices
    if num_devices % config.placement.model_parallel:
        raise ValueError(f"model_parallel={config.placement.model_parallel} must divide the {num_devices} devices")
    for name in ("batch_size", "eval_batch_size"):
        if getattr(config.optim, name) % data_size:
            raise ValueError(
                f"optim.{name}={getattr(config.optim, name)} does not divide over the {data_size} data-parallel "
                f"devices ({num_devices} devices, parallel={config.placement.parallel!r}, "
                f"model_parallel={config.placement.model_parallel})"
            )


@dataclasses.dataclass
class Plan:
    """A stage ready to run: the ``index``-th ``stage`` of the configuration, its ``optimizer``, its ``total``
    batches from global step ``start``, the ``abstract_state`` (shapes and dtypes: what a checkpoint is restored
    into), the ``runner`` that places the state and compiles the steps, and the ``learning_rate`` schedule of applied
    updates (logged)."""

    index: int
    stage: Stage
    optimizer: optax.GradientTransformation
    total: int
    start: int
    abstract_state: TrainState
    runner: Runner
    learning_rate: optax.Schedule

    def meta(self, step: int, per_epoch: int, config: TrainConfig) -> dict:
        """What a checkpoint at global ``step`` records besides the state: the data position and the configuration."""
        epoch, batch = divmod(step - self.start, per_epoch)
        return {
            "stage": self.index,
            "stage_name": self.stage.name,
            "step": step,
            "epoch": epoch,
            "batch": batch,
            "config": config.to_json(),
        }


def flow_init_rows(model: nn.Module, params: dict, train: Rows, config: TrainConfig) -> np.ndarray:
    """``[N, H]``: the real rows of what the flow transforms (``model.flow_features``), computed by the pretrained
    network ``params`` on the first ``flow_init_batches`` training batches (in the order training sees them); the
    flow's ActNorm starts from them. Every process computes them from the whole batches, so that all start alike."""
    assert config.flow is not None  # TrainConfig fills the section for method flow
    order = batch_indices(len(train), config.optim.batch_size, shuffle=True, seed=config.seed, epoch=0, drop_last=True)[
        : config.flow.init_batches
    ]
    forward = jax.jit(
        lambda p, b: model.apply({"params": {"encoder": p}}, *(b[k] for k in model.INPUTS), method="flow_features")
    )
    rows = []
    for index in order:
        x, mask = forward(params, train.arrays(index.tolist()))
        x = np.asarray(x, np.float32)
        rows.append(real_rows(x, mask))
    return np.concatenate(rows)


def plan_stages(
    config: TrainConfig,
    recipe: TaskRecipe[M, D],
    model: M,
    variables: dict,
    *,
    per_epoch: int,
    references: Mapping[str, jax.Array],
) -> list[Plan]:
    """One :class:`Plan` per stage of ``config``: the stage's objective (``recipe``), optimiser, schedule and runner,
    its steps (``per_epoch`` batches an epoch) and first global step."""
    plans, start = [], 0
    for index, stage in enumerate(config.stages()):
        total = stage.steps or max(1, math.ceil(stage.epochs * per_epoch))
        updates = max(1, total // config.optim.grad_accumulation)
        warmup = round(config.optim.warmup_ratio * updates)
        objective = recipe.objective(stage, variables["params"], references)
        optimizer = make_optimizer(
            variables["params"],
            learning_rate=config.optim.learning_rate,
            transform_learning_rate=config.optim.transform_learning_rate,
            weight_decay=config.optim.weight_decay,
            total_updates=updates,
            warmup_steps=warmup,
            schedule_kind=config.optim.schedule,
            max_grad_norm=config.optim.max_grad_norm,
            accumulation=config.optim.grad_accumulation,
            frozen=stage.frozen,
        )
        abstract = jax.eval_shape(lambda v, o=optimizer: create_state(v, o, config.seed), variables)
        runner = make_runner(
            config.placement.parallel,
            num_devices=config.placement.devices,
            model_parallel=config.placement.model_parallel,
            fsdp=config.placement.fsdp,
            make_step=lambda o=optimizer, obj=objective, f=stage.frozen, s=start, n=total, **c: make_train_step(
                model,  # type: ignore[arg-type]  # step.py annotates TaskModel; it runs any recipe's model
                obj,
                o,
                frozen=f,
                **c,
                stage_start=s,
                stage_steps=n,
                gradient_every=config.logging.log_every if config.logging.log_gradients else 0,
            ),
            predict=recipe.predict_step(model),
            abstract_state=abstract,
            partition_rules=model.partition_rules(),
        )
        # the logged learning rate: the encoder's, or the transform group's when the encoder is frozen
        peak = config.optim.transform_learning_rate if "encoder" in stage.frozen else config.optim.learning_rate
        plans.append(
            Plan(
                index=index,
                stage=stage,
                optimizer=optimizer,
                total=total,
                start=start,
                abstract_state=abstract,
                runner=runner,
                learning_rate=schedule(peak, updates, warmup, config.optim.schedule),
            )
        )
        start += total
    return plans


def _check_resumable(config: TrainConfig, meta: dict, directory: str) -> None:
    """``ValueError`` when a setting that may not change on resume (:data:`~isojax.train.config.RESUMABLE`)
    differs from the checkpoint's (a checkpoint whose configuration is in the flat form written before the sections
    is refused by :meth:`~isojax.train.config.TrainConfig.from_json`)."""
    saved = json.loads(json.dumps(TrainConfig.from_json(meta.get("config", {})).flat_json()))
    now = json.loads(json.dumps(config.flat_json()))
    changed = sorted(k for k in set(saved) | set(now) if k not in RESUMABLE and saved.get(k) != now.get(k))
    if changed:
        diffs = "; ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ValueError(
            f"the checkpoints in {directory} were written by a different configuration ({diffs}); "
            "resume with the same settings or choose a new output_dir"
        )


@dataclasses.dataclass
class Prepared(Generic[M, D]):
    """What :func:`prepare` builds before the first step: the task's ``recipe`` and ``model`` (``M``), the
    ``train`` and ``dev`` splits as read (``D``, tokenised when fed), ``per_epoch`` batches, the initial
    ``variables`` and one :class:`Plan` per stage (whose runners compile their steps on first use)."""

    recipe: TaskRecipe[M, D]
    model: M
    train: D
    dev: D
    per_epoch: int
    variables: dict
    plans: list[Plan]


def prepare(config: TrainConfig) -> Prepared[Any, Any]:
    """Check ``config`` against its model and devices, load and tokenise the data, initialise the variables (the
    flow's ActNorm and the data references of the regularisers included) and plan every stage: all that
    :func:`fit` does before its first step (also what :mod:`experiments.benchmarks.methods` times steps with)."""
    recipe = recipe_for(config)
    model, pretrained, tokenizer = recipe.build()
    recipe.check(model)
    check_setup(config, model)
    train = recipe.load("train", tokenizer, config.task.train_limit)
    dev = recipe.load(recipe.eval_split, tokenizer, config.task.eval_limit)
    per_epoch = len(train) // config.optim.batch_size
    if per_epoch == 0:
        raise ValueError(f"the training set ({len(train)} rows) is smaller than one batch ({config.optim.batch_size})")
    flow_rows = flow_init_rows(model, pretrained, train, config) if config.method_spec.flow else None
    variables = recipe.init_variables(model, pretrained, jax.random.key(config.seed), flow_rows)
    references = recipe.references(model, variables, train)
    return Prepared(
        recipe=recipe,
        model=model,
        train=train,
        dev=dev,
        per_epoch=per_epoch,
        variables=variables,
        plans=plan_stages(config, recipe, model, variables, per_epoch=per_epoch, references=references),
    )


@dataclasses.dataclass
class _Run:
    """What every stage of one :func:`fit` call shares: the configuration, what :func:`prepare` built, the run's
    log and checkpoints, whether this is process 0 (which alone writes the log) and whether a stop was requested."""

    config: TrainConfig
    prepared: Prepared[Any, Any]
    log: JsonLog
    checkpoints: Checkpoints
    main_process: bool
    stop: StopRequest


def fit(config: TrainConfig) -> FitResult:
    """Run (or resume) the fine-tuning described by ``config``; see the module docstring.

    Args:
      config: the run (:class:`~isojax.train.config.TrainConfig`): task, model, method, optimiser, placement,
        logging (``output_dir``: a run left there is resumed from its latest checkpoint) and seed.

    Returns:
      a :class:`FitResult`. A configuration the devices or the model cannot serve is a ``ValueError`` before any data
      is read; ``max_nonfinite_steps`` skipped steps in a row stop the run with :class:`NonFiniteTrainingError`;
      ``SIGTERM`` stops it at the next step with a checkpoint, or at once while it loads:
      :class:`~isojax.train.preemption.TrainingStopped`.
    """
    out = config.logging.output_dir
    if os.path.exists(out) and not os.path.isdir(out):  # checked before the model and data are loaded
        raise ValueError(f"{LoggingConfig.label('output_dir')} {out!r} is a file; expected a run directory")
    with StopRequest(os.path.join(out, "checkpoints")) as stop:
        return _fit(config, stop)


def _fit(config: TrainConfig, stop: StopRequest) -> FitResult:
    """:func:`fit` under its stop request (loading until the checkpoint to resume from is restored, then stepping)."""
    out = config.logging.output_dir
    prepared = prepare(config)
    plans, recipe = prepared.plans, prepared.recipe
    main_process = jax.process_index() == 0
    os.makedirs(out, exist_ok=True)
    run_log = JsonLog(os.path.join(out, "log.jsonl"))
    with Checkpoints(
        os.path.join(out, "checkpoints"),
        save_every=config.logging.save_every,
        keep=config.logging.keep_checkpoints,
    ) as checkpoints:  # closed (pending saves written) on errors too
        run = _Run(config, prepared, run_log, checkpoints, main_process, stop)
        restored = checkpoints.restore_latest(
            lambda meta: plans[meta["stage"]].runner.restore_target(plans[meta["stage"]].abstract_state),
            check=lambda meta: _check_resumable(config, meta, checkpoints.directory),
        )
        stop.stepping()
        if restored is None:
            index, step = 0, 0
            placed = plans[0].runner.place(create_state(prepared.variables, plans[0].optimizer, config.seed))
            _evaluate(run, plans[0], placed, 0, stage_end=False)
        else:
            step, state, meta = restored
            index, placed = meta["stage"], plans[meta["stage"]].runner.from_checkpoint(state)
            if main_process:
                run_log.write(
                    {
                        "kind": "resume",
                        "step": step,
                        "stage": meta["stage"],
                        "epoch": meta["epoch"],
                        "batch": meta["batch"],
                    }
                )

        stage_results: dict[str, dict[str, float]] = {}
        last: dict[str, float] = {}
        for plan in plans[index:]:
            if plan.index > index:  # a new stage starts from the previous stage's parameters and statistics
                previous = plans[plan.index - 1].runner.host(placed)
                placed = plan.runner.place(
                    create_state(
                        {
                            "params": previous.params,
                            "batch_stats": previous.batch_stats,
                            "constants": previous.constants,
                        },
                        plan.optimizer,
                        config.seed,
                        step=step,
                    )
                )
            placed, last = _run_stage(run, plan, placed, step - plan.start)
            step = plan.start + plan.total
            stage_results[plan.stage.name] = last
    params = plans[-1].runner.host(placed.params)
    if main_process:
        records = run_log.read()
        plot_curves(
            records,
            os.path.join(out, "curves.png"),
            metrics=recipe.metrics,
            isotropy=recipe.curves,
            title=f"{config.model.name} on {config.task.name}: {config.method.name}",
        )
        timing = {plan.stage.name: epoch_seconds(records, plan.stage.name, prepared.per_epoch) for plan in plans}
        summary = {"config": config.to_json(), "step": step, "stages": stage_results, "timing": timing}
        # whole or not at all: its presence marks a finished run (a rerun of one killed here resumes and rewrites it)
        write_json(Path(out, "results.json"), summary)
    return FitResult(out, step, last, stage_results, params)


def epoch_seconds(records: list[dict], stage: str, per_epoch: int) -> dict:
    """Training wall time of ``stage`` from the ``train`` records of a run's log: ``seconds_per_epoch`` is the mean
    seconds per step times the steps of an epoch, leaving out the first interval of each session (it holds the
    step's compilation); ``compile_and_first_seconds`` sums those first intervals. None without records."""
    train = [r for r in records if r.get("kind") == "resume" or (r.get("kind") == "train" and r["stage"] == stage)]
    steady, first, steps, last_step = 0.0, 0.0, 0, None
    for record in train:
        if record["kind"] == "resume":
            last_step = None
            continue
        if "seconds" not in record:
            continue
        if last_step is None:  # the first interval after a (re)start holds the compilation
            first += record["seconds"]
        else:
            steady += record["seconds"]
            steps += record["step"] - last_step
        last_step = record["step"]
    if steps == 0:
        return {"seconds_per_epoch": None, "compile_and_first_seconds": round(first, 3) if first else None}
    return {"seconds_per_epoch": round(steady / steps * per_epoch, 3), "compile_and_first_seconds": round(first, 3)}


def _run_stage(run: _Run, plan: Plan, placed: TrainState, done: int) -> tuple[TrainState, dict[str, float]]:
    """Run batches ``done, ..., total - 1`` of one stage; evaluate and checkpoint at its end. Returns the placed
    state and the final evaluation."""
    config, runner, train, per_epoch = run.config, plan.runner, run.prepared.train, run.prepared.per_epoch
    checkpoints = run.checkpoints
    bar = tqdm(
        total=plan.total, initial=done, desc=plan.stage.name, disable=not (config.logging.progress and run.main_process)
    )
    epoch_batches: Iterator[dict] = iter(())
    epoch, streak, skipped, previous = None, 0, 0, 0
    clock = time.perf_counter()  # training time between log records (evaluation and checkpoints excluded)
    for k in range(done, plan.total):
        if divmod(k, per_epoch)[0] != epoch:
            epoch, start = divmod(k, per_epoch)
            order = batch_indices(
                len(train),
                config.optim.batch_size,
                shuffle=True,
                seed=config.seed,
                epoch=epoch,
                start=start,
                drop_last=True,
            )[: plan.total - k]  # the batches this stage runs
            epoch_batches = process_batches(train, order, runner.process_rows(config.optim.batch_size))
        placed, metrics = runner.train(placed, next(epoch_batches))
        step = plan.start + k + 1
        bar.update(1)
        last, every = k + 1 == plan.total, config.logging.log_every
        log_due = last or (every and (k + 1) % every == 0)  # and always the stage's last step
        evaluating = config.logging.eval_every and (k + 1) % config.logging.eval_every == 0 and not last
        saving = checkpoints.due(step)
        stopping = run.stop.reached(step)  # asked after every step (the multi-process protocol needs it)
        if log_due or evaluating or saving or stopping:
            # the skip counters are read where the loop waits for the device anyway, never after every step
            streak, skipped = (int(x) for x in runner.host((placed.nonfinite_streak, placed.nonfinite_steps)))
        if log_due and run.main_process:
            values = {n: float(v) for n, v in runner.host(metrics).items()}
            # the schedule counts applied updates: skipped steps do not advance it
            lr = float(plan.learning_rate((k + 1 - skipped) // config.optim.grad_accumulation))
            now = time.perf_counter()
            run.log.write(
                {
                    "kind": "train",
                    "step": step,
                    "stage": plan.stage.name,
                    "epoch": epoch,
                    "lr": lr,
                    "seconds": round(now - clock, 4),
                    **values,
                    "nonfinite_steps": skipped,
                }
            )
            clock = now
            bar.set_postfix(loss=f"{values['loss']:.4f}")
        if skipped > previous:
            _nonfinite_steps(run, plan, step=step, streak=streak, new=skipped - previous)
            previous = skipped
        if evaluating and not stopping:  # a stop is wanted soon (a preempted VM's notice is short)
            _evaluate(run, plan, placed, step, stage_end=False)
            clock = time.perf_counter()
        if (saving or stopping) and not streak:
            checkpoints.save(step, runner.checkpoint_view(placed), plan.meta(step, per_epoch, config))
            clock = time.perf_counter()
        if stopping:
            _stopped(run, plan, step)
    bar.close()
    step = plan.start + plan.total
    result = _evaluate(run, plan, placed, step, stage_end=True)
    if not streak:
        checkpoints.save(step, runner.checkpoint_view(placed), plan.meta(step, per_epoch, config))
    checkpoints.wait()
    return placed, result


def _stopped(run: _Run, plan: Plan, step: int) -> NoReturn:
    """Wait for the checkpoint of ``step`` (not written where the latest steps were skipped as non-finite), write the
    ``stop`` record and raise :class:`~isojax.train.preemption.TrainingStopped` naming the checkpoint to resume from."""
    checkpoints = run.checkpoints
    checkpoints.wait()
    saved = checkpoints.steps()
    last = saved[-1] if saved else None
    if run.main_process:
        run.log.write({"kind": "stop", "step": step, "stage": plan.stage.name, "checkpoint": last})
    resume = (
        f"rerunning the same command resumes from checkpoint step {last} in {checkpoints.directory}"
        if last is not None
        else f"no checkpoint was written in {checkpoints.directory}: rerunning the same command starts over"
    )
    raise TrainingStopped(f"stopped on SIGTERM after step {step}; {resume}", step=step, checkpoint=last)


def _nonfinite_steps(run: _Run, plan: Plan, *, step: int, streak: int, new: int) -> None:
    """Warn that ``new`` more steps up to ``step`` were skipped (``streak`` in a row at ``step``);
    :class:`NonFiniteTrainingError` once the streak reaches ``config.logging.max_nonfinite_steps``, naming the last good
    checkpoint. The loop reads the counters at its log, evaluation and checkpoint steps and at the stage's end, so
    a run stops at the first of those at or after the streak's limit."""
    log.warning(
        "%d step(s) up to step %d (%s) had a non-finite loss or gradient, updates skipped (%d in a row)",
        new,
        step,
        plan.stage.name,
        streak,
    )
    limit, checkpoints = run.config.logging.max_nonfinite_steps, run.checkpoints
    if streak < limit:
        return
    checkpoints.wait()
    saved = checkpoints.steps()
    resume = (
        f"The last good checkpoint is step {saved[-1]} in {checkpoints.directory}: rerunning the same command "
        "resumes from it"
        if saved
        else f"No checkpoint was written in {checkpoints.directory}: rerunning the same command starts over"
    )
    raise NonFiniteTrainingError(
        f"steps {step - streak + 1} to {step} (stage {plan.stage.name!r}) had a non-finite loss or gradient, "
        f"{streak} in a row (max_nonfinite_steps={limit}); their updates were skipped and the "
        f"run stops. {resume} (if it fails again, lower the learning rate or look at the data of these steps)"
    )


def _evaluate(run: _Run, plan: Plan, placed: TrainState, step: int, *, stage_end: bool) -> dict[str, float]:
    """The recipe's evaluation of ``placed`` on the dev split, logged (``eval`` record) at ``step``."""
    result = run.prepared.recipe.evaluate(plan.runner, placed, run.prepared.dev)
    if run.main_process:
        run.log.write({"kind": "eval", "step": step, "stage": plan.stage.name, "stage_end": stage_end, **result})
    log.info("step %d (%s): %s", step, plan.stage.name, result)
    return result
