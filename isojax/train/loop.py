"""The fine-tuning loop: :func:`fit` runs a :class:`~isojax.train.config.TrainConfig` from the start, or from the
latest checkpoint in its ``output_dir``, to the end::

    prepare: check config, devices, model; load the data; initialise the variables; one runner per stage
    restore the latest checkpoint (a changed training configuration or data is refused), else evaluate at step 0
    for each stage (fine-tuning; then the Isotropy Layer stage for ``isotropy_layer``), k = 0 .. total - 1:
        train on batch k mod E of epoch k // E (E batches an epoch, shuffled by (seed, epoch)): step = start + k + 1
        hooks due after it: log (every log_every, and the last step), evaluate (every eval_every), save (every
        save_every steps of the run; none after a skipped step); SIGTERM, SIGINT: save, TrainingStopped
    at a stage's end: evaluate, save; then curves.png and results.json (written last, atomically)

Steps with a non-finite loss or gradient are skipped (:class:`NonFiniteTrainingError` after
``max_nonfinite_steps`` in a row). Every process runs the loop; process 0 alone writes the logs, and holds the
output directory's lock for the run (:func:`~isojax._files.exclusive_directory`: a second run there is refused
before anything loads). More: ``docs/design/training-loop.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import flax.linen as nn
import jax
import numpy as np
import optax
from tqdm.auto import tqdm

from isojax._files import exclusive_directory, write_json
from isojax._stats import real_rows
from isojax.train.checkpoint import Checkpoints
from isojax.train.config import RESUMABLE, LoggingConfig, Stage, TrainConfig
from isojax.train.feed import Rows, batch_indices, fingerprint, process_batches
from isojax.train.logs import JsonLog, epoch_seconds, method_state, plot_curves
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


@dataclasses.dataclass(frozen=True)
class Hook:
    """``fn(step)``, due after every ``every``-th step (0: never) of a stage, or of the run with ``run_steps``; at a
    stage's last step ``last`` decides instead where given (True: due, False: not)."""

    every: int
    fn: Callable[[int], object]
    last: bool | None = None
    run_steps: bool = False

    def due(self, k: int, step: int, last: bool) -> bool:
        """After the stage's ``k``-th step, the run's ``step``; ``last``: the stage's last step."""
        if last and self.last is not None:
            return self.last
        return bool(self.every) and (step if self.run_steps else k) % self.every == 0


def check_setup(config: TrainConfig, model: nn.Module) -> None:
    """What the configuration asks of these devices and of the model's sizes (raises ``ValueError`` before
    training)."""
    enc, placement, split = model.encoder.config, config.placement, config.placement.model_parallel
    sizes = {"attention heads": enc.num_attention_heads, "intermediate size": enc.intermediate_size}
    if enc.decoder_layers:
        sizes.update({"decoder attention heads": enc.decoder_attention_heads, "decoder ffn size": enc.decoder_ffn_dim})
    if split > 1 and any(v % split for v in sizes.values()):
        raise ValueError(f"model_parallel={split} must divide the " + ", ".join(f"{k} ({v})" for k, v in sizes.items()))
    num_devices = len(select_devices(placement.devices))
    data_size = num_devices // split if placement.parallel == "mesh" else num_devices
    if num_devices % split:
        raise ValueError(f"model_parallel={split} must divide the {num_devices} devices")
    for name in ("batch_size", "eval_batch_size"):
        if getattr(config.optim, name) % data_size:
            raise ValueError(
                f"optim.{name}={getattr(config.optim, name)} does not divide over the {data_size} data-parallel "
                f"devices ({num_devices} devices, parallel={placement.parallel!r}, model_parallel={split})"
            )


def flow_init_rows(model: nn.Module, params: dict, train: Rows, config: TrainConfig) -> np.ndarray:
    """``[N, H]``: the real rows of what the flow transforms (``model.flow_features``), computed by the pretrained
    network ``params`` on the first ``flow_init_batches`` training batches (in the order training sees them); the
    flow's ActNorm starts from them. Every process computes them from the whole batches, so that all start alike."""
    order = batch_indices(len(train), config.optim.batch_size, shuffle=True, seed=config.seed, epoch=0, drop_last=True)
    forward = jax.jit(
        lambda p, b: model.apply({"params": {"encoder": p}}, *(b[k] for k in model.INPUTS), method="flow_features")
    )
    rows = []
    for index in order[: config.flow.init_batches]:
        x, mask = forward(params, train.arrays(index.tolist()))
        rows.append(real_rows(np.asarray(x, np.float32), mask))
    return np.concatenate(rows)


def prepare(config: TrainConfig) -> tuple[TaskRecipe[Any, Any], Any, Any, Any, dict, Mapping[str, jax.Array]]:
    """``(recipe, model, train, dev, variables, references)``: ``config`` checked against its model and devices, the
    splits loaded, the variables initialised (the flow's ActNorm included) and the regularisers' data references:
    what :func:`fit` (and :mod:`experiments.benchmarks.methods`) needs before :func:`stage_runner`."""
    recipe = recipe_for(config)
    model, pretrained, tokenizer = recipe.build()
    recipe.check(model)
    check_setup(config, model)
    train = recipe.load("train", tokenizer, config.task.train_limit)
    dev = recipe.load(recipe.eval_split, tokenizer, config.task.eval_limit)
    if len(train) < config.optim.batch_size:
        raise ValueError(f"the training set ({len(train)} rows) is smaller than one batch ({config.optim.batch_size})")
    flow_rows = flow_init_rows(model, pretrained, train, config) if config.method_spec.flow else None
    variables = recipe.init_variables(model, pretrained, jax.random.key(config.seed), flow_rows)
    return recipe, model, train, dev, variables, recipe.references(model, variables, train)


def stage_steps(config: TrainConfig, per_epoch: int) -> list[int]:
    """Each stage's batches: its ``steps``, else its ``epochs`` of ``per_epoch`` batches (at least one)."""
    return [stage.steps or max(1, math.ceil(stage.epochs * per_epoch)) for stage in config.stages()]


def stage_runner(
    config: TrainConfig,
    recipe: TaskRecipe[M, D],
    model: M,
    variables: dict,
    references: Mapping[str, jax.Array],
    stage: Stage,
    *,
    start: int,
    total: int,
) -> tuple[optax.GradientTransformation, TrainState, Runner, optax.Schedule]:
    """``(optimizer, abstract state, runner, learning rate)`` of ``stage``, ``total`` batches from the run's step
    ``start``. Its checkpoints restore into the abstract state (shapes, dtypes); the runner places the state and
    compiles the steps; the learning rate is the logged one (the encoder's, or the transform group's when the
    encoder is frozen) as a schedule of applied updates."""
    optim = config.optim
    updates = max(1, total // optim.grad_accumulation)
    warmup = round(optim.warmup_ratio * updates)
    objective = recipe.objective(stage, variables["params"], references)
    optimizer = make_optimizer(
        variables["params"],
        learning_rate=optim.learning_rate,
        transform_learning_rate=optim.transform_learning_rate,
        weight_decay=optim.weight_decay,
        total_updates=updates,
        warmup_steps=warmup,
        schedule_kind=optim.schedule,
        max_grad_norm=optim.max_grad_norm,
        accumulation=optim.grad_accumulation,
        frozen=stage.frozen,
    )
    abstract = jax.eval_shape(lambda v: create_state(v, optimizer, config.seed), variables)
    gradient_every = config.logging.log_every if config.logging.log_gradients else 0

    def make_step(**placement):  # the runner's options of the step (gathered=, data_axis=)
        return make_train_step(
            model,  # type: ignore[arg-type]  # step.py annotates TaskModel; it runs any recipe's model
            objective,
            optimizer,
            frozen=stage.frozen,
            **placement,
            stage_start=start,
            stage_steps=total,
            gradient_every=gradient_every,
        )

    where = config.placement
    runner = make_runner(
        where.parallel,
        num_devices=where.devices,
        model_parallel=where.model_parallel,
        fsdp=where.fsdp,
        make_step=make_step,
        predict=recipe.predict_step(model),
        abstract_state=abstract,
        partition_rules=model.partition_rules(),
    )
    peak = optim.transform_learning_rate if "encoder" in stage.frozen else optim.learning_rate
    return optimizer, abstract, runner, schedule(peak, updates, warmup, optim.schedule)


def checkpoint_meta(config: TrainConfig, index: int, step: int, *, start: int, per_epoch: int) -> dict:
    """What a checkpoint at the run's ``step``, of stage ``index`` (from step ``start``), records besides the
    state: the data position and the configuration."""
    epoch, batch = divmod(step - start, per_epoch)
    meta = {"stage": index, "stage_name": config.stages()[index].name, "step": step, "epoch": epoch, "batch": batch}
    return meta | {"config": config.to_json()}


def _check_resumable(config: TrainConfig, meta: dict, directory: str, data: dict | None = None) -> None:
    """``ValueError`` when a setting that may not change on resume (:data:`~isojax.train.config.RESUMABLE`)
    differs from the checkpoint's (a checkpoint whose configuration is in the flat form written before the sections
    is refused by :meth:`~isojax.train.config.TrainConfig.from_json`), or the ``data`` (:func:`_check_data`)."""
    saved = json.loads(json.dumps(TrainConfig.from_json(meta.get("config", {})).flat_json()))
    now = json.loads(json.dumps(config.flat_json()))
    changed = sorted(k for k in set(saved) | set(now) if k not in RESUMABLE and saved.get(k) != now.get(k))
    if changed:
        diffs = "; ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ValueError(
            f"the checkpoints in {directory} were written by a different configuration ({diffs}); "
            "resume with the same settings or choose a new output_dir"
        )
    if data is not None:
        _check_data(config, meta, data, directory)


def _check_data(config: TrainConfig, meta: dict, data: dict, directory: str) -> None:
    """``ValueError`` naming the source when the training rows, or the evaluation rows of the same ``eval_limit``,
    differ from those the checkpoint recorded (:func:`~isojax.train.feed.fingerprint`); a warning with
    ``accept_changed_data``."""
    saved = meta.get("data", {})
    same_eval = TrainConfig.from_json(meta["config"]).task.eval_limit == config.task.eval_limit
    for split in ("train", "eval") if same_eval else ("train",):
        then, now = saved.get(split), data[split]
        if then is None or then["sha256"] == now["sha256"]:
            continue
        message = (
            f"the {split} rows ({now['source'] or config.task.name}: {now['rows']} rows) differ from those the "
            f"checkpoints in {directory} were written with ({then['source'] or config.task.name}: {then['rows']} rows)"
        )
        if not config.logging.accept_changed_data:
            raise ValueError(
                f"{message}; restore the data, choose a new output_dir, or resume on these rows with "
                f"{LoggingConfig.label('accept_changed_data')}"
            )
        log.warning("%s; resuming on them (accept_changed_data)", message)


def fit(config: TrainConfig) -> FitResult:
    """Run (or resume) the fine-tuning described by ``config``; see the module docstring.

    Args:
      config: the run (:class:`~isojax.train.config.TrainConfig`): task, model, method, optimiser, placement,
        logging (``output_dir``: a run left there is resumed from its latest checkpoint) and seed.

    Returns:
      a :class:`FitResult`. A configuration the devices or the model cannot serve is a ``ValueError`` before any data
      is read; ``max_nonfinite_steps`` skipped steps in a row stop the run with :class:`NonFiniteTrainingError`;
      ``SIGTERM`` or ``SIGINT`` stops it at the next step with a checkpoint, or at once while it loads:
      :class:`~isojax.train.preemption.TrainingStopped`.
    """
    out, settings, batch_size = config.logging.output_dir, config.logging, config.optim.batch_size
    if os.path.exists(out) and not os.path.isdir(out):  # checked before the model and data are loaded
        raise ValueError(f"{LoggingConfig.label('output_dir')} {out!r} is a file; expected a run directory")
    one_writer = exclusive_directory(Path(out)) if jax.process_index() == 0 else contextlib.nullcontext()
    with one_writer, StopRequest(os.path.join(out, "checkpoints")) as stop:  # a signal while loading: TrainingStopped
        recipe, model, train, dev, variables, references = prepare(config)
        data = {"train": fingerprint(train), "eval": fingerprint(dev)}
        stages, per_epoch = config.stages(), len(train) // batch_size
        totals = stage_steps(config, per_epoch)
        starts = [sum(totals[:i]) for i in range(len(stages))]
        optimizers, abstracts, runners, learning_rates = zip(
            *(
                stage_runner(config, recipe, model, variables, references, s, start=a, total=n)
                for s, a, n in zip(stages, starts, totals, strict=True)
            ),
            strict=True,
        )
        main_process = jax.process_index() == 0
        os.makedirs(out, exist_ok=True)
        run_log = JsonLog(os.path.join(out, "log.jsonl"))
        write = run_log.write if main_process else (lambda record: None)
        clock = time.perf_counter()  # the start of the training time in the next train record (reset by each stage)

        def evaluate(placed: TrainState, index: int, step: int, stage_end: bool = False) -> dict[str, float]:
            result = recipe.evaluate(runners[index], placed, dev)
            write({"kind": "eval", "step": step, "stage": stages[index].name, "stage_end": stage_end, **result})
            log.info("step %d (%s): %s", step, stages[index].name, result)
            return result

        # the hooks, run in this order after a step, read the step loop's state (below)
        def log_train(step: int) -> None:
            nonlocal clock
            if main_process:
                values = {n: float(v) for n, v in runners[index].host(metrics).items()}
                # the schedule counts applied updates: skipped steps do not advance it
                lr = float(learning_rates[index]((step - starts[index] - skipped) // config.optim.grad_accumulation))
                now = time.perf_counter()  # "seconds": training time, evaluation and checkpoints excluded
                record = {"kind": "train", "step": step, "stage": stages[index].name, "epoch": epoch, "lr": lr}
                write(record | {"seconds": round(now - clock, 4), **values, "nonfinite_steps": skipped})
                clock = now
                bar.set_postfix(loss=f"{values['loss']:.4f}")

        def evaluate_now(step: int) -> None:
            nonlocal clock
            if not (stopping or streak >= settings.max_nonfinite_steps):  # not when the run stops after this step
                evaluate(placed, index, step)
                clock = time.perf_counter()

        def save(step: int) -> None:
            nonlocal clock
            if not streak:  # every checkpoint holds the state after an applied update
                meta = checkpoint_meta(config, index, step, start=starts[index], per_epoch=per_epoch) | {"data": data}
                checkpoints.save(step, runners[index].checkpoint_view(placed), meta)
                clock = time.perf_counter()

        checkpoint = Hook(settings.save_every, save, run_steps=True)
        hooks = [
            Hook(settings.log_every, log_train, last=True),
            Hook(settings.eval_every, evaluate_now, last=False),  # the stage's end evaluates anyway
            checkpoint,
        ]
        with Checkpoints(
            os.path.join(out, "checkpoints"), save_every=settings.save_every, keep=settings.keep_checkpoints
        ) as checkpoints:  # closed (pending saves written) on errors too
            restored = checkpoints.restore_latest(
                lambda meta: runners[meta["stage"]].restore_target(abstracts[meta["stage"]]),
                check=lambda meta: _check_resumable(config, meta, checkpoints.directory, data),
            )
            stop.stepping()
            if restored is None:
                first, step = 0, 0
                placed = runners[0].place(create_state(variables, optimizers[0], config.seed))
                evaluate(placed, 0, 0)
            else:
                step, state, meta = restored
                first, placed = meta["stage"], runners[meta["stage"]].from_checkpoint(state)
                write({"kind": "resume", "step": step, **{k: meta[k] for k in ("stage", "epoch", "batch")}})

            results: dict[str, dict[str, float]] = {}
            for index in range(first, len(stages)):
                stage, start, total, runner = stages[index], starts[index], totals[index], runners[index]
                if index > first:  # a new stage starts from the previous stage's parameters and statistics
                    previous = runners[index - 1].host(placed)
                    kept = {k: getattr(previous, k) for k in ("params", "batch_stats", "constants")}
                    placed = runner.place(create_state(kept, optimizers[index], config.seed, step=step))
                done = step - start
                bar = tqdm(total=total, initial=done, desc=stage.name, disable=not (settings.progress and main_process))
                batches: Iterator[dict] = iter(())
                epoch: int | None = None
                streak, skipped, reported = 0, 0, 0
                clock = time.perf_counter()
                for k in range(done, total):
                    if k // per_epoch != epoch:  # the rest of epoch k // E, as far as the stage goes
                        epoch, batch = divmod(k, per_epoch)
                        order = batch_indices(
                            len(train),
                            batch_size,
                            shuffle=True,
                            seed=config.seed,
                            epoch=epoch,
                            start=batch,
                            drop_last=True,
                        )
                        batches = process_batches(train, order[: total - k], runner.process_rows(batch_size))
                    placed, metrics = runner.train(placed, next(batches))
                    step = start + k + 1
                    bar.update(1)
                    stopping = stop.reached(step)  # asked after every step (the multi-process protocol needs it)
                    due = [hook for hook in hooks if hook.due(k + 1, step, last=k + 1 == total)]
                    if stopping and checkpoint not in due:  # a stop checkpoints the step
                        due.append(checkpoint)
                    if due:  # the skip counters are read where the loop waits for the device anyway
                        streak, skipped = (
                            int(x) for x in runner.host((placed.nonfinite_streak, placed.nonfinite_steps))
                        )
                    for hook in due:
                        hook.fn(step)
                    if skipped > reported:  # a warning; NonFiniteTrainingError after max_nonfinite_steps in a row
                        _nonfinite_steps(
                            config, checkpoints, stage.name, step=step, streak=streak, new=skipped - reported
                        )
                        reported = skipped
                    if stopping:
                        _stopped(checkpoints, write, stage.name, step, stop)
                bar.close()
                step = start + total
                results[stage.name] = evaluate(placed, index, step, stage_end=True)
                save(step)
                checkpoints.wait()
        params = runners[-1].host(placed.params)
        if main_process:
            records, title = run_log.read(), f"{config.model.name} on {config.task.name}: {config.method.name}"
            plot_curves(
                records, os.path.join(out, "curves.png"), metrics=recipe.metrics, isotropy=recipe.curves, title=title
            )
            timing = {stage.name: epoch_seconds(records, stage.name, per_epoch) for stage in stages}
            summary = {"config": config.to_json(), "step": step, "stages": results, "timing": timing}
            summary["method_state"] = method_state(records)  # SoftDecay's alpha, ...: each stage's last train record
            # whole or not at all: its presence marks a finished run (a rerun of one killed here resumes and rewrites it)
            write_json(Path(out, "results.json"), summary)
    return FitResult(out, step, results[stages[-1].name], results, params)


def _last_checkpoint(checkpoints: Checkpoints) -> int | None:
    """The newest finished checkpoint's step (after the pending saves), or None."""
    checkpoints.wait()
    saved = checkpoints.steps()
    return saved[-1] if saved else None


def _stopped(
    checkpoints: Checkpoints, write: Callable[[dict], None], stage: str, step: int, stop: StopRequest
) -> NoReturn:
    """Write the ``stop`` record and raise :class:`~isojax.train.preemption.TrainingStopped` naming the checkpoint to
    resume from (none where the latest steps were skipped)."""
    last = _last_checkpoint(checkpoints)
    write({"kind": "stop", "step": step, "stage": stage, "checkpoint": last, "signal": stop.name})
    resume = (
        f"rerunning the same command resumes from checkpoint step {last} in {checkpoints.directory}"
        if last is not None
        else f"no checkpoint was written in {checkpoints.directory}: rerunning the same command starts over"
    )
    message = f"stopped on {stop.name} after step {step}; {resume}"
    raise TrainingStopped(message, step=step, checkpoint=last, signum=stop.signum or signal.SIGTERM)


def _nonfinite_steps(
    config: TrainConfig, checkpoints: Checkpoints, stage: str, *, step: int, streak: int, new: int
) -> None:
    """Warn that ``new`` more steps up to ``step`` were skipped, ``streak`` in a row; :class:`NonFiniteTrainingError`
    naming the last good checkpoint once that reaches ``max_nonfinite_steps`` (the counters are read at the hooks'
    steps, so the run stops at the first of those at or after the limit)."""
    message = "%d step(s) up to step %d (%s) had a non-finite loss or gradient, updates skipped (%d in a row)"
    log.warning(message, new, step, stage, streak)
    if streak < (limit := config.logging.max_nonfinite_steps):
        return
    last = _last_checkpoint(checkpoints)
    resume = (
        f"The last good checkpoint is step {last} in {checkpoints.directory}: rerunning the same command resumes from it"
        if last is not None
        else f"No checkpoint was written in {checkpoints.directory}: rerunning the same command starts over"
    )
    raise NonFiniteTrainingError(
        f"steps {step - streak + 1} to {step} (stage {stage!r}) had a non-finite loss or gradient, {streak} in a row "
        f"(max_nonfinite_steps={limit}); their updates were skipped and the run stops. {resume} (if it fails again, "
        "lower the learning rate or look at the data of these steps)"
    )
