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

In a multi-process run (:mod:`isojax.train.parallel`) every process runs this loop: each tokenises and feeds
only its rows of every batch (:mod:`isojax.train.feed`), each writes its shards of the checkpoints, and process 0
alone writes the logs, curves and results.

What depends on the kind of task is a *recipe*: :class:`ClassificationRecipe` (a GLUE task: encoder + head,
task metrics and the isotropy of the head input) or :class:`isojax.train.seq2seq.Seq2SeqRecipe` (an
encoder-decoder: teacher-forced token loss, decoded dev outputs scored by BLEU / ROUGE). Everything else (stages,
devices, checkpoints, resuming, logs, timing) is one loop.

Outputs in ``output_dir``: ``checkpoints/``, ``log.jsonl`` (:mod:`isojax.train.logs`), ``curves.png`` (task
metric and isotropy over training), ``results.json`` (configuration, final evaluation of every stage, timing).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from isojax._stats import real_rows, streamed_covariance
from isojax.data.batching import batches
from isojax.data.glue import glue_task, load_glue
from isojax.models import build_encoder, from_pretrained, require_kind
from isojax.softdecay import SoftDecay
from isojax.train import evaluation
from isojax.train.checkpoint import Checkpoints
from isojax.train.config import RESUMABLE, Stage, TrainConfig
from isojax.train.feed import Split, batch_indices, process_batches
from isojax.train.logs import JsonLog, plot_curves
from isojax.train.model import TaskModel, init_variables, word_embeddings
from isojax.train.objective import Objective, data_references, resolve_auto_options
from isojax.train.optim import make_optimizer, schedule
from isojax.train.parallel import make_runner, select_devices
from isojax.train.seq2seq import Seq2SeqRecipe
from isojax.train.state import create_state
from isojax.train.step import make_predict_step, make_train_step

log = logging.getLogger(__name__)


class NonFiniteTrainingError(FloatingPointError):
    """``max_nonfinite_steps`` steps in a row had a non-finite loss or gradient (module docstring)."""


@dataclasses.dataclass
class FitResult:
    """What :func:`fit` returns: ``metrics`` of the last evaluation, ``stages`` (stage name -> its final
    evaluation), the final ``params`` (host numpy), the global ``step`` and the ``output_dir``."""

    output_dir: str
    step: int
    metrics: dict
    stages: dict
    params: Any


def build_model(config: TrainConfig):
    """``(TaskModel, pretrained encoder params, tokenizer)`` for the configuration (SoftDecay, dtype, dropout,
    scanned layers and remat)."""
    spec = config.method_spec
    transform = SoftDecay(alpha_init=config.method.softdecay_alpha) if spec.softdecay else None
    dtype = jnp.bfloat16 if config.model.dtype == "bfloat16" else jnp.float32
    layout: dict[str, Any] = dict(
        transform_placement=config.method.softdecay_placement,
        scan_layers=config.model.scan_layers,
        remat=config.model.remat,
    )
    encoder, params, tokenizer = from_pretrained(
        config.model.name, dtype=dtype, last_layer_transform=transform, **layout
    )
    require_kind(encoder.config, ("encoder",), "fine-tuning a classifier (isojax finetune)")
    if tokenizer is None:
        raise ValueError(f"model {config.model.name!r} has no tokenizer files; fine-tuning needs one")
    dropout = encoder.config.hidden_dropout_prob if config.model.dropout else 0.0
    if not config.model.dropout:
        encoder = build_encoder(
            dataclasses.replace(encoder.config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
            dtype=dtype,
            last_layer_transform=transform,
            add_pooling_layer=encoder.add_pooling_layer,
            **layout,
        )
    model = TaskModel(
        encoder,
        num_labels=config.num_labels,
        pooling=config.model.pooling,
        dropout_rate=dropout,
        use_isobn=spec.isobn,
        use_isotropy_layer=spec.isotropy_layer,
        flow=config.make_flow(),
    )
    return model, params, tokenizer


def check_setup(config: TrainConfig, model) -> None:
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


def check_pooler(config: TrainConfig, model: TaskModel) -> None:
    """``ValueError`` when the configuration reads a pooler the model does not have."""
    wants_pooler = config.model.pooling == "pooler" or any(
        r.representation == "pooler" for s in config.stages() for r in s.regularizers
    )
    if wants_pooler and not model.has_pooler:
        raise ValueError(
            f"model {config.model.name!r} ({model.encoder.config.model_type}) has no pooler: the "
            "'pooler' pooling/representation is not available (use 'cls')"
        )


def eval_split(task: str) -> str:
    """The labelled dev split of a GLUE task (MNLI: the matched one)."""
    return "validation_matched" if glue_task(task).name == "mnli" else "validation"


def load_split(config: TrainConfig, split: str, tokenizer, limit: int) -> Split:
    """The first ``limit`` rows (0 = all) of a GLUE split, as read; each process tokenises only the rows it feeds
    (:mod:`isojax.train.feed`)."""
    data = load_glue(config.task.name, split, source=config.task.data_source, data_dir=config.task.data_dir)
    n = min(limit, len(data)) if limit else len(data)
    texts_b = data.texts_b[:n] if data.texts_b is not None else None
    data = dataclasses.replace(data, texts_a=data.texts_a[:n], texts_b=texts_b, labels=data.labels[:n])
    return Split(data, tokenizer, config.task.max_length)


@dataclasses.dataclass
class Plan:
    """A stage ready to run: optimiser, length, first global step, abstract state, runner, logged schedule."""

    index: int
    stage: Stage
    optimizer: Any
    total: int
    start: int
    abstract_state: Any
    runner: Any
    learning_rate: Any

    def meta(self, step: int, per_epoch: int, config: TrainConfig) -> dict:
        epoch, batch = divmod(step - self.start, per_epoch)
        return {
            "stage": self.index,
            "stage_name": self.stage.name,
            "step": step,
            "epoch": epoch,
            "batch": batch,
            "config": config.to_json(),
        }


def representation_covariance(model: TaskModel, variables: dict, data: Split, batch_size: int):
    """``covariance(name) -> [d, d]``: covariance (ddof 1, float64 sums over real rows) of a representation of
    :data:`~isojax.train.model.REPRESENTATIONS` computed by ``model`` (deterministic) over every row of ``data``
    (tokenised here; in a multi-process run, by every process)."""
    forward = jax.jit(lambda v, b: model.apply(v, b["input_ids"], b["attention_mask"], b["token_type_ids"]))

    def rows(name: str):
        for batch in batches(data.tokens(), batch_size):
            out = forward(variables, batch)
            x = np.asarray(out.tokens if name == "tokens" else getattr(out, name), np.float64)
            yield real_rows(x, out.mask if name == "tokens" else None)

    def covariance(name: str):
        return streamed_covariance(rows(name), repr(name))

    return covariance


class ClassificationRecipe:
    """What :func:`fit` does its own way for a GLUE task: a :class:`TaskModel`, GLUE splits, the task loss of
    :class:`Objective`, and the task metrics and isotropy of the head input (:mod:`isojax.train.evaluation`)."""

    curves = ("anisotropy", "anisotropy_centered", "isoscore")

    def __init__(self, config: TrainConfig):
        self.config, self.task = config, glue_task(config.task.name)
        self.metrics, self.eval_split = self.task.metrics, eval_split(config.task.name)

    def build(self):
        return build_model(self.config)

    def check(self, model: TaskModel) -> None:
        check_pooler(self.config, model)

    def load(self, split: str, tokenizer, limit: int) -> Split:
        return load_split(self.config, split, tokenizer, limit)

    def init_variables(self, model: TaskModel, params, key, flow_rows) -> dict:
        return init_variables(model, params, key, flow_rows)

    def references(self, model: TaskModel, variables: dict, train: Split) -> dict:
        regularizers = [reg for stage in self.config.stages() for reg in stage.regularizers]
        return data_references(
            regularizers, representation_covariance(model, variables, train, self.config.optim.eval_batch_size)
        )

    def objective(self, stage: Stage, params, references: dict) -> Objective:
        c = self.config
        return Objective(
            c.num_labels,
            resolve_auto_options(stage.regularizers, params),
            stage.combine,
            c.method.joint_alpha,
            c.method.balancer_smoothing,
            references,
        )

    def predict_step(self, model: TaskModel):
        return make_predict_step(model)

    def evaluate(self, runner, placed, dev: Split) -> dict:
        w = runner.host(word_embeddings(placed.params))
        return evaluation.evaluate(runner, placed, dev, self.task, w, self.config.optim.eval_batch_size)


def recipe(config: TrainConfig):
    """The recipe of the configuration's task: :class:`ClassificationRecipe` or :class:`Seq2SeqRecipe`."""
    return Seq2SeqRecipe(config) if config.is_seq2seq else ClassificationRecipe(config)


def flow_init_rows(model, params, train, config: TrainConfig) -> np.ndarray:
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


def _plans(config: TrainConfig, recipe, model, variables: dict, per_epoch: int, references: dict) -> list[Plan]:
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
            make_step=lambda c, o=optimizer, obj=objective, f=stage.frozen, s=start: make_train_step(
                model,
                obj,
                o,
                frozen=f,
                collectives=c,
                stage_start=s,
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
                index,
                stage,
                optimizer,
                total,
                start,
                abstract,
                runner,
                schedule(peak, updates, warmup, config.optim.schedule),
            )
        )
        start += total
    return plans


def _check_resumable(config: TrainConfig, meta: dict, directory: str) -> None:
    """``ValueError`` when a setting that may not change on resume (:data:`~isojax.train.config.RESUMABLE`)
    differs from the checkpoint's (whose configuration may be in the flat form written before the sections)."""
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
class Prepared:
    """What :func:`prepare` builds before the first step: the task's ``recipe`` and ``model``, the tokenised
    ``train`` and ``dev`` splits, ``per_epoch`` batches, the initial ``variables`` and one :class:`Plan` per
    stage (whose runners compile their steps on first use)."""

    recipe: Any
    model: Any
    train: Split
    dev: Split
    per_epoch: int
    variables: dict
    plans: list[Plan]


def prepare(config: TrainConfig) -> Prepared:
    """Check ``config`` against its model and devices, load and tokenise the data, initialise the variables (the
    flow's ActNorm and the data references of the regularisers included) and plan every stage: all that
    :func:`fit` does before its first step (also what :mod:`experiments.benchmarks.methods` times steps with)."""
    kind = recipe(config)
    model, pretrained, tokenizer = kind.build()
    kind.check(model)
    check_setup(config, model)
    train = kind.load("train", tokenizer, config.task.train_limit)
    dev = kind.load(kind.eval_split, tokenizer, config.task.eval_limit)
    per_epoch = len(train) // config.optim.batch_size
    if per_epoch == 0:
        raise ValueError(f"the training set ({len(train)} rows) is smaller than one batch ({config.optim.batch_size})")
    flow_rows = flow_init_rows(model, pretrained, train, config) if config.method_spec.flow else None
    variables = kind.init_variables(model, pretrained, jax.random.key(config.seed), flow_rows)
    references = kind.references(model, variables, train)
    plans = _plans(config, kind, model, variables, per_epoch, references)
    return Prepared(kind, model, train, dev, per_epoch, variables, plans)


def fit(config: TrainConfig) -> FitResult:
    """Run (or resume) the fine-tuning described by ``config``; see the module docstring."""
    prepared = prepare(config)
    kind, train, dev, per_epoch, plans = (
        prepared.recipe,
        prepared.train,
        prepared.dev,
        prepared.per_epoch,
        prepared.plans,
    )

    main_process = jax.process_index() == 0
    os.makedirs(config.logging.output_dir, exist_ok=True)
    run_log = JsonLog(os.path.join(config.logging.output_dir, "log.jsonl"))
    with Checkpoints(
        os.path.join(config.logging.output_dir, "checkpoints"),
        save_every=config.logging.save_every,
        keep=config.logging.keep_checkpoints,
    ) as checkpoints:  # closed (pending saves written) on errors too
        restored = checkpoints.restore_latest(
            lambda meta: plans[meta["stage"]].runner.restore_target(plans[meta["stage"]].abstract_state),
            check=lambda meta: _check_resumable(config, meta, checkpoints.directory),
        )
        if restored is None:
            index, step = 0, 0
            placed = plans[0].runner.place(create_state(prepared.variables, plans[0].optimizer, config.seed))
            _evaluate(kind, plans[0], placed, dev, 0, run_log, main_process, stage_end=False)
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

        stage_results, last = {}, {}
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
            placed, last = _run_stage(
                config, kind, plan, placed, step - plan.start, train, dev, per_epoch, run_log, checkpoints, main_process
            )
            step = plan.start + plan.total
            stage_results[plan.stage.name] = last
    params = plans[-1].runner.host(placed.params)
    if main_process:
        records = run_log.read()
        plot_curves(
            records,
            os.path.join(config.logging.output_dir, "curves.png"),
            metrics=kind.metrics,
            isotropy=kind.curves,
            title=f"{config.model.name} on {config.task.name}: {config.method.name}",
        )
        timing = {plan.stage.name: epoch_seconds(records, plan.stage.name, per_epoch) for plan in plans}
        with open(os.path.join(config.logging.output_dir, "results.json"), "w") as f:
            json.dump(
                {"config": config.to_json(), "step": step, "stages": stage_results, "timing": timing}, f, indent=1
            )
    return FitResult(config.logging.output_dir, step, last, stage_results, params)


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


def _run_stage(config, kind, plan: Plan, placed, done: int, train, dev, per_epoch, run_log, checkpoints, main_process):
    """Run batches ``done, ..., total - 1`` of one stage; evaluate and checkpoint at its end. Returns the placed
    state and the final evaluation."""
    runner = plan.runner
    bar = tqdm(
        total=plan.total, initial=done, desc=plan.stage.name, disable=not (config.logging.progress and main_process)
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
        log_due = config.logging.log_every and (k + 1) % config.logging.log_every == 0
        evaluating = config.logging.eval_every and (k + 1) % config.logging.eval_every == 0 and k + 1 < plan.total
        saving = checkpoints.due(step)
        if log_due or evaluating or saving or k + 1 == plan.total:
            # the skip counters are read where the loop waits for the device anyway, never after every step
            streak, skipped = (int(x) for x in runner.host((placed.nonfinite_streak, placed.nonfinite_steps)))
        if log_due and main_process:
            values = {n: float(v) for n, v in runner.host(metrics).items()}
            # the schedule counts applied updates: skipped steps do not advance it
            lr = float(plan.learning_rate((k + 1 - skipped) // config.optim.grad_accumulation))
            now = time.perf_counter()
            run_log.write(
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
            _nonfinite_steps(step, streak, skipped - previous, plan, config, checkpoints)
            previous = skipped
        if evaluating:
            _evaluate(kind, plan, placed, dev, step, run_log, main_process, stage_end=False)
            clock = time.perf_counter()
        if saving and not streak:
            checkpoints.save(step, runner.checkpoint_view(placed), plan.meta(step, per_epoch, config))
            clock = time.perf_counter()
    bar.close()
    step = plan.start + plan.total
    result = _evaluate(kind, plan, placed, dev, step, run_log, main_process, stage_end=True)
    if not streak:
        checkpoints.save(step, runner.checkpoint_view(placed), plan.meta(step, per_epoch, config))
    checkpoints.wait()
    return placed, result


def _nonfinite_steps(
    step: int, streak: int, new: int, plan: Plan, config: TrainConfig, checkpoints: Checkpoints
) -> None:
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
    if streak < config.logging.max_nonfinite_steps:
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
        f"{streak} in a row (max_nonfinite_steps={config.logging.max_nonfinite_steps}); their updates were skipped and the "
        f"run stops. {resume} (if it fails again, lower the learning rate or look at the data of these steps)"
    )


def _evaluate(kind, plan: Plan, placed, dev, step, run_log, main_process, *, stage_end: bool) -> dict:
    result = kind.evaluate(plan.runner, placed, dev)
    if main_process:
        run_log.write({"kind": "eval", "step": step, "stage": plan.stage.name, "stage_end": stage_end, **result})
    log.info("step %d (%s): %s", step, plan.stage.name, result)
    return result
