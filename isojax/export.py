"""A fine-tuning run (``isojax finetune``'s output directory) as a Hugging Face folder, and back.

:func:`export_run` writes the newest checkpoint of a GLUE run with :func:`isojax.models.save_pretrained`:
``config.json``, ``model.safetensors`` (the encoder and, where transformers has the class, the classification head
under its names: ``BertForSequenceClassification``, ``AlbertForSequenceClassification``), the tokenizer, and
``isojax_extra.safetensors`` with what only isojax runs (SoftDecay's ``theta``; the Isotropy Layer, the flow, IsoBN's
statistics and a head transformers does not name, each under its path). ``config.json`` describes those parts under
the key ``"isojax"`` (:data:`isojax.models.hub.ISOJAX_KEY`)::

    task, num_labels, pooling      the GLUE task and the representation the head reads (cls, pooler, mean, ...)
    softdecay                      {alpha_init, placement, alpha} or null
    flow                           {levels, depth, hidden} or null
    isobn, isotropy_layer          whether the head input passes through them
    run, checkpoint                the run directory and the checkpoint's step
    transformers                   what transformers' class leaves out (empty: it reproduces the run's logits)

:func:`isojax.from_pretrained` reads the folder as an encoder with its SoftDecay; :func:`load_task_model` rebuilds
the whole task model, which gives the run's predictions for every method.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util

from isojax.models import checkpoint
from isojax.models.encoder import TRANSFORM
from isojax.models.hub import (
    ISOJAX_KEY,
    SEQUENCE_CLASSIFICATION,
    TASK_PARTS,
    from_pretrained,
    load_classification_head,
    save_pretrained,
)
from isojax.softdecay import alpha_from_param


def is_run(path: str) -> bool:
    """Whether ``path`` is a fine-tuning run directory.

    Args:
      path: a path.

    Returns:
      True for a directory with ``checkpoints/`` and no ``config.json`` (an ``isojax finetune`` output directory).

    Examples:
      >>> import os, tempfile
      >>> run = tempfile.mkdtemp()
      >>> is_run(run), os.makedirs(os.path.join(run, "checkpoints")), is_run(run)
      (False, None, True)
    """
    return os.path.isdir(os.path.join(path, "checkpoints")) and not os.path.exists(os.path.join(path, "config.json"))


def read_run(run_dir: str) -> tuple[Any, int, dict]:
    """The newest checkpoint of a fine-tuning run.

    Args:
      run_dir: an ``isojax finetune`` output directory.

    Returns:
      ``(config, step, variables)``: the run's :class:`~isojax.train.config.TrainConfig`, the checkpoint's step, and
      ``{"params", "batch_stats", "constants"}`` as host arrays. ``ValueError`` naming the directory when it holds
      no checkpoint; :class:`~isojax.train.checkpoint.CorruptCheckpoint` naming the file when the newest step's
      contents differ from the sha256 recorded when it was written.
    """
    from isojax.train.checkpoint import verify_step
    from isojax.train.config import TrainConfig

    directory = os.path.abspath(os.path.join(run_dir, "checkpoints"))
    if not os.path.isdir(directory):  # not created by the manager below
        raise ValueError(f"{run_dir} is not a fine-tuning run with a checkpoint (no {directory})")
    with ocp.CheckpointManager(
        directory, item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    ) as manager:
        step = manager.latest_step()
        if step is None:
            raise ValueError(f"{run_dir} is not a fine-tuning run with a checkpoint (no <step>/ in {directory})")
        verify_step(directory, step)
        restored = manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
        )
    state = jax.device_get(restored.state)
    variables = {k: state.get(k) or {} for k in ("params", "batch_stats", "constants")}
    return TrainConfig.from_json(restored.meta["config"]), step, variables


def export_run(run_dir: str, out_dir: str, *, task: bool = True) -> dict:
    """Write the newest checkpoint of the GLUE run in ``run_dir`` as a Hugging Face folder ``out_dir`` (module
    docstring).

    Args:
      run_dir: an ``isojax finetune`` output directory (``checkpoints/``; the model it started from must still be
        loadable, for its tokenizer and architecture).
      out_dir: the folder to write (created when missing).
      task: also write the task model's parts beside the encoder (False: the encoder, with its SoftDecay, alone).

    Returns:
      What ``config.json`` holds under ``"isojax"``: ``checkpoint`` names the step written and ``transformers`` what
      transformers' class leaves out. A sequence-to-sequence run, or a directory without a checkpoint, is a
      ``ValueError``.
    """
    from isojax.train.model import TaskModel
    from isojax.train.tasks import recipe_for

    config, step, variables = read_run(run_dir)
    if config.is_seq2seq:
        raise ValueError(f"{run_dir}: isojax export writes GLUE runs; this is a {config.task.name} run")
    model, _, tokenizer = recipe_for(config).build()
    assert isinstance(model, TaskModel)
    params, encoder = variables["params"], model.encoder
    parts = {k: params[k] for k in TASK_PARTS if k in params}
    parts |= {k: variables[k] for k in ("batch_stats", "constants") if variables[k]}
    spec = config.method_spec
    softdecay = None
    if spec.softdecay:
        theta = params["encoder"][TRANSFORM]["theta"]
        alpha = float(alpha_from_param(np.float32(theta), config.method.softdecay_alpha))
        placement = config.method.softdecay_placement
        softdecay = {"alpha_init": config.method.softdecay_alpha, "placement": placement, "alpha": alpha}
    flow = config.flow if spec.flow else None
    described = {
        "task": config.task.name,
        "num_labels": model.num_labels,
        "pooling": model.pooling,
        "softdecay": softdecay,
        "flow": None if flow is None else {"levels": flow.levels, "depth": flow.depth, "hidden": flow.hidden},
        "isobn": model.use_isobn,
        "isotropy_layer": model.use_isotropy_layer,
        "run": os.path.abspath(run_dir),
        "checkpoint": step,
    }
    described["transformers"] = _left_out(encoder.config.model_type, described)
    save_pretrained(
        encoder, params["encoder"], out_dir, tokenizer=tokenizer, task=parts if task else None, isojax_config=described
    )
    return described


def _left_out(model_type: str, described: dict) -> list[str]:
    """What transformers' ``...ForSequenceClassification`` of an exported model does not run, one sentence each
    (empty: it gives the run's logits)."""
    cls = SEQUENCE_CLASSIFICATION.get(model_type)
    if cls is None:
        return [
            f"transformers' {model_type} classifier is not written: the head is in {checkpoint.EXTRA_WEIGHTS_NAME} "
            "(isojax.export.load_task_model reads it)"
        ]
    notes = []
    if described["pooling"] != "pooler":
        notes.append(f"{cls} reads the pooler output; this run's head reads {described['pooling']!r}")
    if described["softdecay"]:
        sd = described["softdecay"]
        notes.append(
            f"SoftDecay (alpha {sd['alpha']:.6g}, placement {sd['placement']}) is not in transformers' encoder"
        )
    for part in ("flow", "isobn", "isotropy_layer"):
        if described[part]:
            notes.append(f"the {part} before the classifier is not in transformers' model")
    return notes


def load_task_model(path: str):
    """The task model of a folder :func:`export_run` wrote.

    Args:
      path: the exported folder.

    Returns:
      ``(model, variables, tokenizer)``: a :class:`~isojax.train.model.TaskModel` (no dropout) whose
      ``model.apply(variables, input_ids, attention_mask, token_type_ids).logits`` are the run's, for every method.
      ``ValueError`` for a folder whose ``config.json`` has no ``"isojax"`` task description, or whose side file lacks
      a part it names.
    """
    from isojax.calibrate import Flow
    from isojax.train.model import TaskModel, init_variables

    with open(os.path.join(path, "config.json")) as f:
        described = json.load(f).get(ISOJAX_KEY)
    if not described or "num_labels" not in described:
        raise ValueError(f"{path}: config.json describes no isojax task model (no {ISOJAX_KEY!r} key; isojax export)")
    encoder, encoder_params, tokenizer = from_pretrained(path)
    flow = None if described["flow"] is None else Flow(**described["flow"])
    model = TaskModel(
        encoder,
        num_labels=described["num_labels"],
        pooling=described["pooling"],
        dropout_rate=0.0,
        use_isobn=described["isobn"],
        use_isotropy_layer=described["isotropy_layer"],
        flow=flow,
    )
    hidden = encoder.config.hidden_size
    rows = np.random.default_rng(0).normal(size=(2 * hidden, hidden)) if flow else None  # for the shapes only
    template = init_variables(model, encoder_params, jax.random.key(0), rows)
    extra_path = os.path.join(path, checkpoint.EXTRA_WEIGHTS_NAME)
    extra = checkpoint.load_safetensors(extra_path) if os.path.exists(extra_path) else {}
    saved = {tuple(k.split("/")): v for k, v in extra.items() if k.split("/")[0] in TASK_PARTS}
    _, head = load_classification_head(path)
    saved |= {("head", *k): v for k, v in traverse_util.flatten_dict(head).items()}
    variables: dict = {"params": {"encoder": encoder_params}}
    for collection in ("params", "batch_stats", "constants"):
        flat = traverse_util.flatten_dict({k: v for k, v in template[collection].items() if k != "encoder"})
        prefix = () if collection == "params" else (collection,)
        missing = [k for k in flat if (*prefix, *k) not in saved]
        if missing:
            raise ValueError(f"{path}: {checkpoint.EXTRA_WEIGHTS_NAME} lacks {['/'.join(k) for k in missing]}")
        loaded = {k: jnp.asarray(saved[(*prefix, *k)], v.dtype) for k, v in flat.items()}
        variables[collection] = variables.get(collection, {}) | traverse_util.unflatten_dict(loaded)
    return model, variables, tokenizer


@contextmanager
def pretrained_or_run(name_or_path: str) -> Iterator[str]:
    """A model name for :func:`isojax.from_pretrained`, for commands that also read a run directory.

    Args:
      name_or_path: a model name or directory, or an ``isojax finetune`` output directory.

    Returns:
      A context manager giving ``name_or_path`` itself, or for a run directory a temporary export of its newest
      checkpoint (:func:`export_run`; a printed line names the step), removed on exit.

    Examples:
      >>> with pretrained_or_run("default") as name:
      ...     name
      'default'
    """
    if not is_run(name_or_path):
        yield name_or_path
        return
    with tempfile.TemporaryDirectory(prefix="isojax-export-") as out:
        described = export_run(name_or_path, out, task=False)
        print(f"{name_or_path}: the run's newest checkpoint, step {described['checkpoint']}")
        yield out


__all__ = ["export_run", "is_run", "load_task_model", "pretrained_or_run", "read_run"]
