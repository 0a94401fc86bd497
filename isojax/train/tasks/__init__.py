"""Tasks as recipes: what fine-tuning does its own way for each kind of task, behind one protocol
(:class:`~isojax.train.tasks.base.TaskRecipe`), so that :func:`isojax.train.fit` knows no task type.

Recipes: :class:`~isojax.train.tasks.classification.ClassificationRecipe` (a GLUE task: encoder + head, task
metrics and the isotropy of the head input) and :class:`~isojax.train.tasks.seq2seq.Seq2SeqRecipe` (an
encoder-decoder: teacher-forced token loss, decoded dev outputs scored by BLEU / ROUGE). :func:`recipe_for` picks a
configuration's.
"""

from __future__ import annotations

from typing import Any

from isojax.train.config import TrainConfig
from isojax.train.feed import Split
from isojax.train.model import TaskModel
from isojax.train.tasks.base import TaskRecipe
from isojax.train.tasks.classification import ClassificationRecipe
from isojax.train.tasks.seq2seq import Seq2SeqModel, Seq2SeqRecipe, Seq2SeqSplit


def recipe_for(config: TrainConfig) -> TaskRecipe[Any, Any]:
    """The recipe of ``config``'s task.

    The model and split types differ by task, hence ``Any`` for the caller; each recipe is checked against the
    protocol with its own types here.

    Args:
      config: the run (:class:`~isojax.train.config.TrainConfig`).

    Returns:
      a :class:`Seq2SeqRecipe` for a sequence-to-sequence task (:attr:`TrainConfig.is_seq2seq`), else a
      :class:`ClassificationRecipe`.

    Examples:
      >>> from isojax.train.config import TaskConfig
      >>> type(recipe_for(TrainConfig(task=TaskConfig("rte")))).__name__
      'ClassificationRecipe'
      >>> type(recipe_for(TrainConfig(task=TaskConfig("cnn_dailymail")))).__name__
      'Seq2SeqRecipe'
    """
    if config.is_seq2seq:
        seq2seq: TaskRecipe[Seq2SeqModel, Seq2SeqSplit] = Seq2SeqRecipe(config)
        return seq2seq
    classification: TaskRecipe[TaskModel, Split] = ClassificationRecipe(config)
    return classification


__all__ = ["ClassificationRecipe", "Seq2SeqRecipe", "TaskRecipe", "recipe_for"]
