"""Fine-tuning with isotropy methods: one pure train step run under ``jit`` on a device mesh (pmap a placement of it),
Orbax checkpoints, evaluation of task metrics and isotropy, and :func:`fit`, the loop behind ``isojax finetune``.

The layers and where a change goes: ``docs/design/train.md``. Modules: :mod:`~isojax.train.methods` (the methods and
regularisers, defined once), :mod:`~isojax.train.config` (the run, plain data), :mod:`~isojax.train.model` (encoder + isotropy
modules + head), :mod:`~isojax.train.objective` (task loss + regularisers / joint loss),
:mod:`~isojax.train.hyperparams` (weights and other hyperparameters as
numbers or schedules of the step), :mod:`~isojax.train.optim`, :mod:`~isojax.train.state`, :mod:`~isojax.train.step`,
:mod:`~isojax.train.parallel` (the mesh and its placements),
:mod:`~isojax.train.feed` (each process's rows of every batch), :mod:`~isojax.train.checkpoint`,
:mod:`~isojax.train.evaluation`, :mod:`~isojax.train.logs`, :mod:`~isojax.train.loop` (one loop for every task),
:mod:`~isojax.train.preemption` (stopping on ``SIGTERM`` at a checkpoint),
:mod:`~isojax.train.tasks` (what each kind of task does its own way: a recipe behind one protocol),
:mod:`~isojax.train.cli`.
"""

from typing import TYPE_CHECKING

from isojax._lazy import lazy_attributes

if TYPE_CHECKING:
    from isojax.train.config import (
        FlowConfig,
        LoggingConfig,
        MethodConfig,
        ModelConfig,
        OptimConfig,
        PlacementConfig,
        Seq2SeqConfig,
        TaskConfig,
        TrainConfig,
    )
    from isojax.train.hyperparams import StepSchedule
    from isojax.train.loop import FitResult, fit
    from isojax.train.methods import METHODS, REGULARIZERS, REPRESENTATIONS, Method, RegularizerSpec
    from isojax.train.model import TaskModel, init_variables
    from isojax.train.objective import Objective, Regularizer, parse_regularizer
    from isojax.train.optim import make_optimizer
    from isojax.train.parallel import make_mesh, make_runner
    from isojax.train.preemption import TrainingStopped
    from isojax.train.state import TrainState, create_state
    from isojax.train.step import make_predict_step, make_train_step

_DEFINED_IN = {
    "config": (
        "FlowConfig LoggingConfig MethodConfig ModelConfig OptimConfig PlacementConfig Seq2SeqConfig TaskConfig "
        "TrainConfig"
    ),
    "hyperparams": "StepSchedule",
    "loop": "FitResult fit",
    "methods": "METHODS REGULARIZERS REPRESENTATIONS Method RegularizerSpec",
    "model": "TaskModel init_variables",
    "objective": "Objective Regularizer parse_regularizer",
    "optim": "make_optimizer",
    "parallel": "make_mesh make_runner",
    "preemption": "TrainingStopped",
    "state": "TrainState create_state",
    "step": "make_predict_step make_train_step",
}
__getattr__ = lazy_attributes(
    "isojax.train", {name: f"isojax.train.{module}" for module, names in _DEFINED_IN.items() for name in names.split()}
)

__all__ = [
    "METHODS",
    "REGULARIZERS",
    "REPRESENTATIONS",
    "FitResult",
    "FlowConfig",
    "LoggingConfig",
    "Method",
    "MethodConfig",
    "ModelConfig",
    "Objective",
    "OptimConfig",
    "PlacementConfig",
    "Regularizer",
    "RegularizerSpec",
    "Seq2SeqConfig",
    "StepSchedule",
    "TaskConfig",
    "TaskModel",
    "TrainConfig",
    "TrainState",
    "TrainingStopped",
    "create_state",
    "fit",
    "init_variables",
    "make_mesh",
    "make_optimizer",
    "make_predict_step",
    "make_runner",
    "make_train_step",
    "parse_regularizer",
]
