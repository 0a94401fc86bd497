"""GLUE classification and regression as a :class:`~isojax.train.tasks.base.TaskRecipe`: a
:class:`~isojax.train.model.TaskModel` (encoder + optional isotropy modules + head), GLUE splits
(:class:`~isojax.train.feed.Split`), the task loss and regularisers of :class:`~isojax.train.objective.Objective`,
and the task metrics and isotropy of the head input (:mod:`isojax.train.evaluation`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from isojax._stats import real_rows
from isojax.data.batching import batches
from isojax.data.glue import glue_task, load_glue
from isojax.models import build_encoder, from_pretrained, model_kind, require_kind, require_tokenizer
from isojax.softdecay import SoftDecay
from isojax.stats import streamed_covariance
from isojax.train import evaluation
from isojax.train.config import Stage, TrainConfig
from isojax.train.feed import Split
from isojax.train.hyperparams import hyperparameter
from isojax.train.model import TaskModel, init_variables, make_flow
from isojax.train.objective import Objective, data_references, resolve_auto_options
from isojax.train.state import TrainState
from isojax.train.step import make_predict_step
from isojax.train.tasks.base import PredictStep, Runner, check_length, check_room


def build_task_model(config: TrainConfig) -> tuple[TaskModel, dict, Any]:
    """The task model, the pretrained encoder's params and the tokenizer for the configuration.

    The encoder is loaded by :func:`isojax.from_pretrained` (``config.model.name``) with the configuration's SoftDecay,
    dtype, dropout, scanned layers and remat; the :class:`~isojax.train.model.TaskModel` adds the method's isotropy
    modules and a head of the task's ``num_labels`` outputs.

    Args:
      config: the run (:class:`~isojax.train.config.TrainConfig`) of a GLUE task.

    Returns:
      ``(TaskModel, pretrained encoder params, tokenizer)``. A model that is neither an encoder nor a causal LM (whose
      head reads the last real token, as transformers' ``...ForSequenceClassification``), or one without tokenizer
      files, is a ``ValueError``.
    """
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
    require_kind(encoder.config, ("encoder", "causal_lm"), "fine-tuning a classifier (isojax finetune)")
    require_tokenizer(tokenizer, config.model.name, "fine-tuning (isojax finetune)")
    dropout = encoder.config.hidden_dropout_prob if config.model.dropout else 0.0
    if not config.model.dropout:
        quiet = dataclasses.replace(encoder.config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        if model_kind(quiet) == "causal_lm":
            encoder = encoder.clone(config=quiet)
        else:
            encoder = build_encoder(
                quiet,
                dtype=dtype,
                last_layer_transform=transform,
                add_pooling_layer=encoder.add_pooling_layer,
                **layout,
            )
    model = TaskModel(
        encoder,
        num_labels=glue_task(config.task.name).num_labels,
        pooling=config.model.pooling,
        dropout_rate=dropout,
        use_isobn=spec.isobn,
        use_isotropy_layer=spec.isotropy_layer,
        flow=make_flow(config),
    )
    return model, params, tokenizer


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
    """The labelled dev split of a GLUE task (MNLI: the matched one).

    Args:
      task: a GLUE task name in any spelling :func:`~isojax.data.glue.glue_task` accepts (``"RTE"``, ``"mnli"``).

    Returns:
      the split's name: ``"validation"``, or ``"validation_matched"`` for MNLI. An unknown task is a ``ValueError``.

    Examples:
      >>> eval_split("RTE"), eval_split("MNLI")
      ('validation', 'validation_matched')
    """
    return "validation_matched" if glue_task(task).name == "mnli" else "validation"


def load_split(config: TrainConfig, split: str, tokenizer, limit: int) -> Split:
    """The first ``limit`` rows (0 = all) of a GLUE split, as read; not tokenised yet.

    Each process tokenises only the rows it feeds (:mod:`isojax.train.feed`).

    Args:
      config: the run; its ``task`` section names the task, ``data_source`` / ``data_dir``, ``max_length`` and
        ``buckets``.
      split: ``"train"``, ``"validation"`` (``"dev"``), ``"test"``, ... as :func:`~isojax.data.glue.load_glue` reads it.
      tokenizer: the tokenizer that will tokenise the rows (stored, not called here).
      limit: how many rows to keep from the start; 0: all.

    Returns:
      a :class:`~isojax.train.feed.Split` of ``min(limit, n)`` rows.

    Examples:
      >>> import tempfile, pathlib
      >>> from isojax.train.config import TaskConfig
      >>> root = pathlib.Path(tempfile.mkdtemp())
      >>> (root / "glue" / "SST-2").mkdir(parents=True)
      >>> _ = (root / "glue" / "SST-2" / "dev.tsv").write_text("sentence\\tlabel\\na gem .\\t1\\ndull .\\t0\\nfine .\\t1\\n")
      >>> split = load_split(TrainConfig(task=TaskConfig("sst2", data_dir=str(root))), "validation", None, limit=2)
      >>> len(split), split.data.texts_a, split.labels.tolist(), split.max_length
      (2, ['a gem .', 'dull .'], [1, 0], 128)
    """
    data = load_glue(config.task.name, split, source=config.task.data_source, data_dir=config.task.data_dir)
    n = min(limit, len(data)) if limit else len(data)
    texts_b = data.texts_b[:n] if data.texts_b is not None else None
    data = dataclasses.replace(data, texts_a=data.texts_a[:n], texts_b=texts_b, labels=data.labels[:n])
    return Split(data, tokenizer, config.task.max_length, config.task.buckets)


def representation_covariance(
    model: TaskModel, variables: dict, data: Split, batch_size: int
) -> Callable[[str], np.ndarray]:
    """The covariance of a representation computed by ``model`` over every row of ``data``.

    ``covariance(name)`` runs ``model`` (deterministic, jitted) over ``data`` tokenised in batches of ``batch_size``
    (in a multi-process run, every process does) and returns the covariance (ddof 1, float64 sums over the real rows:
    every token of ``tokens``) of the representation ``name`` of :data:`~isojax.train.methods.REPRESENTATIONS`
    (``embedding`` excepted). I-STAR's ``c0="data"`` reads it (:func:`~isojax.train.objective.data_references`).
    The sums do not depend on the order of the rows, so the batches take them shortest first, each cut to the
    split's bucket width of its longest row (``data.buckets``): a batch pads to rows of about its own length rather
    than to the longest of 64 rows in file order (on SST-2's training set, 7 words at the median and 26 at the 95th
    percentile, that padding was most of the work).

    Args:
      model: the task model.
      variables: its variables (``{"params", ...}``), e.g. the pretrained ones at the start of training.
      data: the rows (a :class:`~isojax.train.feed.Split`, tokenised here).
      batch_size: rows per forward pass.

    Returns:
      ``covariance(name) -> [d, d]`` float64 (a function: nothing runs until it is called).
    """
    forward = jax.jit(lambda v, b: model.apply(v, b["input_ids"], b["attention_mask"], b["token_type_ids"]))

    def rows(name: str) -> Iterator[np.ndarray]:
        tokens = data.tokens()
        shortest_first = np.argsort(tokens["attention_mask"].sum(1), kind="stable")
        tokens = {key: value[shortest_first] for key, value in tokens.items()}
        for batch in batches(tokens, batch_size, buckets=data.buckets):
            out = forward(variables, batch)
            x = np.asarray(out.tokens if name == "tokens" else getattr(out, name), np.float64)
            yield real_rows(x, out.mask if name == "tokens" else None)

    def covariance(name: str) -> np.ndarray:
        return streamed_covariance(rows(name), repr(name))

    return covariance


class ClassificationRecipe:
    """The :class:`~isojax.train.tasks.base.TaskRecipe` of a GLUE task (module docstring).

    Args:
      config: the run (:class:`~isojax.train.config.TrainConfig`) of a GLUE task.

    Attributes:
      config: as given.
      task: the :class:`~isojax.data.glue.GlueTask`.
      metrics: the task's metrics (``accuracy``, ``f1``, ``matthews``, ``pearson``, ``spearman``, ...).
      curves: the isotropy measures plotted: anisotropy, raw and centered, and IsoScore of the head input.
      eval_split: the dev split (:func:`eval_split`).

    Examples:
      >>> from isojax.train.config import TaskConfig
      >>> recipe = ClassificationRecipe(TrainConfig(task=TaskConfig("mrpc")))
      >>> recipe.metrics, recipe.eval_split
      (('accuracy', 'f1'), 'validation')
    """

    curves: tuple[str, ...] = ("anisotropy", "anisotropy_centered", "isoscore")

    def __init__(self, config: TrainConfig):
        self.config, self.task = config, glue_task(config.task.name)
        self.metrics: tuple[str, ...] = self.task.metrics
        self.eval_split = eval_split(config.task.name)

    def build(self) -> tuple[TaskModel, dict, Any]:
        return build_task_model(self.config)

    def check(self, model: TaskModel) -> None:
        check_pooler(self.config, model)
        check_length("max_length", self.config.task.max_length, model.encoder.config)

    def load(self, split: str, tokenizer: Any, limit: int) -> Split:
        rows = load_split(self.config, split, tokenizer, limit)
        check_room(self.config.task, "max_length", tokenizer, pair=rows.data.texts_b is not None)
        return rows

    def init_variables(self, model: TaskModel, params: dict, key: jax.Array, flow_rows: np.ndarray | None) -> dict:
        return init_variables(model, params, key, flow_rows)

    def references(self, model: TaskModel, variables: dict, train: Split) -> dict[str, jax.Array]:
        regularizers = [reg for stage in self.config.stages() for reg in stage.regularizers]
        return data_references(
            regularizers, representation_covariance(model, variables, train, self.config.optim.eval_batch_size)
        )

    def objective(self, stage: Stage, params: dict, references: Mapping[str, jax.Array]) -> Objective:
        c = self.config
        return Objective(
            num_labels=self.task.num_labels,
            regularizers=resolve_auto_options(stage.regularizers, params),
            combine=stage.combine,
            alpha=hyperparameter(c.method.joint_alpha, "method.joint_alpha"),
            smoothing=hyperparameter(c.method.balancer_smoothing, "method.balancer_smoothing"),
            references=references,
        )

    def predict_step(self, model: TaskModel) -> PredictStep:
        return make_predict_step(model)

    def evaluate(self, runner: Runner, placed: TrainState, dev: Split) -> dict[str, float]:
        return evaluation.evaluate(runner, placed, dev, self.task, self.config.optim.eval_batch_size)


__all__ = [
    "ClassificationRecipe",
    "build_task_model",
    "eval_split",
    "load_split",
    "representation_covariance",
]
