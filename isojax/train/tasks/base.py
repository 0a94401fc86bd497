"""What the fine-tuning loop needs of a task: the :class:`TaskRecipe` protocol.

:func:`isojax.train.loop.fit` runs every task the same way (stages, devices, checkpoints, resuming, logs, timing)
and asks the task's recipe for the rest, in this order::

    model, pretrained, tokenizer = recipe.build()             the task model around the pretrained network
    recipe.check(model)                                        settings the model cannot serve (ValueError)
    train = recipe.load("train", tokenizer, limit)             splits as read (D: Rows), tokenised when fed
    dev   = recipe.load(recipe.eval_split, tokenizer, limit)
    variables  = recipe.init_variables(model, pretrained, key, flow_rows)
    references = recipe.references(model, variables, train)    data statistics the regularisers need
    objective  = recipe.objective(stage, params, references)   per stage: the loss of the train step
    predict    = recipe.predict_step(model)                    what the evaluation runs on the devices
    result     = recipe.evaluate(runner, placed, dev)          {name: float}, logged ("eval" records) and
                                                               written per stage into results.json ("stages")

``metrics`` (the task metrics) and ``curves`` (the isotropy measures) name the keys of ``result`` that
``curves.png`` plots. The model (``M``: a Linen module with the loop's model contract: ``encoder``, ``INPUTS``,
``flow_features``, ``partition_rules()``) and the split type (``D``) are the recipe's own: the loop only hands
back what the recipe built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import flax.linen as nn
import jax
import numpy as np

from isojax.data.batching import least_length
from isojax.models.config import TransformerConfig
from isojax.train.config import Section, Stage
from isojax.train.feed import Rows
from isojax.train.objective import Objective
from isojax.train.parallel import MeshRunner
from isojax.train.state import TrainState

Runner: TypeAlias = MeshRunner
"""What :func:`isojax.train.parallel.make_runner` returns: the devices a stage trains and evaluates on."""

PredictStep: TypeAlias = Callable[[TrainState, dict], dict]
"""``predict(state, batch) -> {name: [B, ...]}``: one evaluation batch on the devices."""


def check_length(name: str, length: int, config: TransformerConfig, part: str = "") -> None:
    """``ValueError`` when a configured length (``max_length`` tokens per row) exceeds the positions of ``config``.

    Checked before any data is read: otherwise the first batch wide enough to need the missing positions fails
    only when its bucket is first traced, possibly hours into training.
    """
    if length > config.max_sequence_length:
        raise ValueError(
            f"{name}={length} is longer than the {config.max_sequence_length} positions of this "
            f"{config.model_type} model{part}"
        )


def check_room(section: Section, name: str, tokenizer: Any, *, pair: bool = False) -> None:
    """``ValueError`` naming the setting when a length ``section.<name>`` leaves no room for the special tokens
    ``tokenizer`` adds to a text (``pair``: a pair); :func:`~isojax.data.batching.least_length`.

    Checked when the data are read, before training: the tokenizer would return rows longer than the length.
    """
    least, length = least_length(tokenizer, pair=pair), getattr(section, name)
    if length < least:
        raise ValueError(
            f"{section.label(name)} must be at least {least}: the tokenizer adds "
            f"{tokenizer.num_special_tokens_to_add(pair=pair)} special tokens to a {'pair' if pair else 'text'}, "
            f"got {length}"
        )


M = TypeVar("M", bound=nn.Module)
D = TypeVar("D", bound=Rows)


@runtime_checkable
class TaskRecipe(Protocol[M, D]):
    """Everything :func:`isojax.train.loop.fit` does its own way for a kind of task (module docstring).

    ``M``: the task model that :meth:`build` returns; ``D``: the split type that :meth:`load` returns
    (:class:`~isojax.train.feed.Rows`). :func:`isojax.train.tasks.recipe_for` picks a configuration's recipe. The
    protocol is ``runtime_checkable``: ``isinstance(recipe, TaskRecipe)`` checks that its members exist.

    Attributes:
      metrics: the task metrics among :meth:`evaluate`'s keys (curves.png's task panel).
      curves: the isotropy measures among :meth:`evaluate`'s keys (curves.png's isotropy panel).
      eval_split: the split evaluated during training (``"validation"``, MNLI's ``"validation_matched"``).

    Examples:
      >>> from isojax.train.config import TaskConfig, TrainConfig
      >>> from isojax.train.tasks import ClassificationRecipe
      >>> isinstance(ClassificationRecipe(TrainConfig(task=TaskConfig("rte"))), TaskRecipe)
      True
    """

    metrics: tuple[str, ...]
    """The task metrics among :meth:`evaluate`'s keys (curves.png's task panel)."""
    curves: tuple[str, ...]
    """The isotropy measures among :meth:`evaluate`'s keys (curves.png's isotropy panel)."""
    eval_split: str
    """The split evaluated during training (``dev``)."""

    def build(self) -> tuple[M, dict, Any]:
        """``(model, pretrained params of model.encoder, tokenizer)``."""
        ...

    def check(self, model: M) -> None:
        """``ValueError`` when the configuration asks what ``model`` cannot do (before any data is read)."""
        ...

    def load(self, split: str, tokenizer: Any, limit: int) -> D:
        """The first ``limit`` rows (0 = all) of ``split``, as read."""
        ...

    def init_variables(self, model: M, params: dict, key: jax.Array, flow_rows: np.ndarray | None) -> dict:
        """``{"params", "constants", ...}`` of ``model`` around the pretrained ``params``; ``flow_rows [N, H]``
        start a flow's ActNorm (None without a flow)."""
        ...

    def references(self, model: M, variables: dict, train: D) -> dict[str, jax.Array]:
        """Reference statistics of the training data that the regularisers need, by term label."""
        ...

    def objective(self, stage: Stage, params: dict, references: Mapping[str, jax.Array]) -> Objective:
        """The loss of ``stage``'s train step."""
        ...

    def predict_step(self, model: M) -> PredictStep:
        """The evaluation's step on the devices (its output is what :meth:`evaluate` reads)."""
        ...

    def evaluate(self, runner: Runner, placed: TrainState, dev: D) -> dict[str, float]:
        """Task metrics and isotropy of the model in ``placed`` on every row of ``dev``."""
        ...


__all__ = ["TaskRecipe"]
