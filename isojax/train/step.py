"""The pure training and prediction steps, which :mod:`isojax.train.parallel` runs under ``jit`` on a mesh. The train
step is given the global batch; its two placement options are FSDP's sharding constraints (``gathered``) and the pmap
placement's per-device view of the objective (``data_axis``, :func:`per_device_view`).

A batch is a dict of the model's ``INPUTS`` and ``labels``: for :class:`~isojax.train.model.TaskModel`,
``input_ids``, ``attention_mask``, ``token_type_ids`` (``[B, L]`` int32) and ``labels`` (``[B]``, int32 class ids or
float32 scores); for :class:`~isojax.train.tasks.seq2seq.Seq2SeqModel`, see :mod:`isojax.train.tasks.seq2seq`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import cast

import jax
import jax.numpy as jnp
import optax

from isojax.train.gradient_stats import gradient_statistics
from isojax.train.model import TaskModel, TaskOutput, method_state
from isojax.train.objective import Objective
from isojax.train.optim import buffer_paths
from isojax.train.state import TrainState


def _stop_frozen(params: dict, frozen: Sequence[str]) -> dict:
    """``params`` with the top-level subtrees named in ``frozen`` and the buffers
    (:func:`~isojax.train.optim.buffer_paths`, BART's ``final_logits_bias``) behind ``stop_gradient``: their gradient
    is zero and XLA drops the backward pass through them (a frozen encoder costs a forward pass only)."""
    params = {k: jax.lax.stop_gradient(v) if k in frozen else v for k, v in params.items()}
    for top, key in buffer_paths(params):
        params[top] = {**params[top], key: jax.lax.stop_gradient(params[top][key])}
    return params


def model_variables(state: TrainState, params=None) -> dict:
    """The variables to apply the model with: ``params`` (default ``state.params``), and ``batch_stats`` and
    ``constants`` where the state has them."""
    variables = {"params": state.params if params is None else params}
    for name in ("batch_stats", "constants"):
        if getattr(state, name):
            variables[name] = getattr(state, name)
    return variables


def make_train_step(
    model: TaskModel,
    objective: Objective,
    optimizer: optax.GradientTransformation,
    *,
    frozen: Sequence[str] = (),
    data_axis: str | None = None,
    gathered=None,
    gradient_every: int = 0,
    stage_start: int = 0,
    stage_steps: int = 0,
) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """``step(state, batch) -> (state, metrics)``: one batch forward and backward, one optimiser update.

    A step whose loss or gradient is not finite (NaN or ±inf anywhere: the global gradient norm is then not finite)
    is skipped, as :func:`optax.apply_if_finite` does (the update under ``jax.lax.cond``, so the donated state is
    updated in place, not copied first): the parameters, optimiser state (moments, schedule count,
    accumulated gradients), IsoBN statistics and balancer stay as they were; ``state.step`` still advances (the
    batch is consumed: the data position and the next step's dropout key follow the step count as on a clean run),
    ``nonfinite_steps`` counts the skip and ``nonfinite_streak`` the skips in a row (reset by an applied step).
    Under the pmap placement the test reads the reduced gradient and the global loss, so every device decides alike.
    A finite step computes exactly what it computes without this test.

    The dropout key of the step is ``fold_in(state.key, state.step)`` (so a resumed run repeats its masks);
    ``metrics`` holds ``loss``, the objective's terms and ``grad_norm`` (of the gradient before clipping), and
    with ``gradient_every = k > 0`` the statistics of :mod:`isojax.train.gradient_stats`, computed on every k-th
    step of the stage that starts at global step ``stage_start`` and on its last step (``stage_steps``): the steps
    whose metrics the loop logs; NaN on the others, which skip their cost. It also holds the method's learnt state
    after the update (:func:`~isojax.train.model.method_state`: SoftDecay's α, ...).
    ``frozen`` names top-level parameter subtrees that get no gradient. The model runs in training mode
    (dropout on, IsoBN updating its statistics, averaged over ``data_axis`` when given).

    Args:
      model: the task model (:class:`~isojax.train.model.TaskModel`, or a recipe's model with ``INPUTS``).
      objective: the loss (:class:`~isojax.train.objective.Objective`).
      optimizer: the optax optimiser whose state is ``state.opt_state``.
      frozen: top-level parameter subtrees (e.g. ``("encoder",)``) that get no gradient.
      data_axis: ``None``: the step is given the global batch. A mesh axis name: the step runs per device inside
        ``shard_map`` over that axis on the device's rows (the pmap placement): the objective is given
        :func:`per_device_view`, the dropout key is ``fold_in(key, device index)``, IsoBN averages its batch
        statistics over the axis, and the gradient is summed over it (``psum``).
      gathered: FSDP: the shardings of ``state.params`` whole over the data axis
        (:func:`~isojax.train.parallel.gathered_shardings`); the parameters and the gradient are constrained to them,
        so XLA all-gathers the parameters before the forward pass and sums the gradient over the data axis.
      gradient_every: ``k > 0``: gradient statistics every k-th step of the stage; 0: none.
      stage_start: the global step at which the stage starts (for ``gradient_every``).
      stage_steps: the stage's number of steps (for ``gradient_every``; 0: no last step of its own).

    Returns:
      ``step(state, batch) -> (state, metrics)``, pure and not jitted: ``state`` a
      :class:`~isojax.train.state.TrainState`, ``batch`` the model's ``INPUTS`` and ``labels`` (module docstring),
      ``metrics`` a dict of scalars.

    Examples:
      One SGD step (learning rate 0.5) of a tiny model without dropout, its encoder frozen: the loss is the
      cross-entropy of the prediction step's logits, the head's bias moves by ``-0.5`` times the mean of
      ``softmax - onehot`` (its gradient in closed form), and the encoder does not move:

      >>> import numpy as np, optax
      >>> from isojax.models import TransformerConfig, build_encoder, init_params
      >>> from isojax.train import Objective, TaskModel, create_state, init_variables
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16,
      ...                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
      >>> model = TaskModel(build_encoder(config), num_labels=2, dropout_rate=0.0)
      >>> variables = init_variables(model, init_params(model.encoder, jax.random.key(0)), jax.random.key(1))
      >>> state = create_state(variables, optax.sgd(0.5), seed=0)
      >>> batch = {"input_ids": np.array([[1, 4, 2], [1, 5, 2]], np.int32), "attention_mask": np.ones((2, 3), np.int32),
      ...          "token_type_ids": np.zeros((2, 3), np.int32), "labels": np.array([0, 1], np.int32)}
      >>> logits = np.asarray(jax.jit(make_predict_step(model))(state, batch)["logits"], np.float64)
      >>> p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
      >>> train_step = make_train_step(model, Objective(2), optax.sgd(0.5), frozen=("encoder",))
      >>> new, metrics = jax.jit(train_step)(state, batch)
      >>> bool(np.isclose(metrics["loss"], -np.log(p[[0, 1], [0, 1]]).mean())), int(new.step)
      (True, 1)
      >>> bias = variables["params"]["head"]["classifier"]["bias"]
      >>> np.allclose(new.params["head"]["classifier"]["bias"], bias - 0.5 * (p - np.eye(2)).mean(0), atol=1e-6)
      True
      >>> jax.tree.all(jax.tree.map(np.array_equal, new.params["encoder"], variables["params"]["encoder"]))
      True
    """
    if hasattr(model, "axis_name"):  # the axis over which IsoBN averages its batch statistics
        model = model.clone(axis_name=data_axis)

    def loss_fn(params, state: TrainState, batch, key):
        variables = model_variables(state, _stop_frozen(params, frozen))
        output, updates = model.apply(
            variables,
            *(batch[k] for k in model.INPUTS),
            deterministic=False,
            rngs={"dropout": key},
            mutable=["batch_stats"],
        )
        params, labels = variables["params"], batch["labels"]
        if data_axis is not None:
            output, params, labels = per_device_view(output, params, labels, data_axis)
        loss, terms, balancer = objective(output, params, labels, state.balancer, step=state.step)
        return loss, (terms, balancer, updates.get("batch_stats", state.batch_stats))

    def step(state: TrainState, batch: dict):
        key = jax.random.fold_in(state.key, state.step)
        if gathered is not None:  # FSDP: whole parameters for the step, module docstring of isojax.train.parallel
            state = dataclasses.replace(state, params=jax.lax.with_sharding_constraint(state.params, gathered))
        if data_axis is not None:  # each device draws the dropout masks of its own rows
            key = jax.random.fold_in(key, jax.lax.axis_index(data_axis))
        (loss, (terms, balancer, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state, batch, key
        )
        if gathered is not None:  # summed over the data axis, as data parallelism does
            grads = jax.lax.with_sharding_constraint(grads, gathered)
        if data_axis is not None:
            grads = jax.lax.psum(grads, data_axis)
        metrics = {"loss": loss, **terms, "grad_norm": optax.tree.norm(grads)}
        if gradient_every:
            stats = jax.eval_shape(gradient_statistics, state.params, grads)
            skipped = lambda: jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), stats)  # noqa: E731
            count = state.step - stage_start + 1  # steps of the stage so far, this one included
            metrics.update(
                jax.lax.cond(
                    (count % gradient_every == 0) | (count == stage_steps),
                    lambda: gradient_statistics(state.params, grads),
                    skipped,
                )
            )
        finite = jnp.isfinite(loss) & jnp.isfinite(metrics["grad_norm"])
        kept = {name: getattr(state, name) for name in ("params", "opt_state", "batch_stats", "balancer")}

        def applied(kept):
            updates, opt_state = optimizer.update(grads, kept["opt_state"], kept["params"])
            params = optax.apply_updates(kept["params"], updates)
            return {"params": params, "opt_state": opt_state, "batch_stats": batch_stats, "balancer": balancer}

        state = dataclasses.replace(
            state,
            step=state.step + 1,
            **jax.lax.cond(finite, applied, lambda kept: kept, kept),
            nonfinite_steps=state.nonfinite_steps + (~finite).astype(jnp.int32),
            nonfinite_streak=jnp.where(finite, 0, state.nonfinite_streak + 1),
        )
        balanced = state.balancer if objective.combine == "balanced" else None
        return state, metrics | method_state(model, state.params, state.batch_stats, balanced)

    return step


def per_device_view(output, params, labels, axis: str):
    """``(output, params, labels)`` as the objective is given them on one device of the pmap placement (inside
    ``shard_map`` over ``axis``, ``D`` devices of ``b = B / D`` rows each), so that the ``psum`` of the devices'
    gradients is the gradient of the global batch's objective:

    * every leaf of the model's ``output`` and the ``labels``, all-gathered (rows first) to the ``B`` rows of the global
      batch, the device's own block differentiable and the other blocks behind ``stop_gradient``: every term (the task
      loss, a whole-batch regulariser) takes its global value, and its gradient reaches this device's rows only;
    * the ``params`` (which a regulariser of the embedding matrix reads directly) with their value and ``1/D`` of their
      gradient: every device computes that term alike, and the ``psum`` counts it once.

    This holds for an objective linear in its terms' gradients (a sum of terms with weights that carry no gradient: the
    task loss, the regularisers, the joint-loss balancer, the flow): a term ``T(x_1, ..., x_D, p)`` of the devices' rows
    and the parameters has ``dT = sum_d dT/dx_d dx_d + dT/dp dp``, and device ``d`` contributes ``dT/dx_d dx_d`` and
    ``dT/dp dp / D``.
    """
    index, size = jax.lax.axis_index(axis), jax.lax.axis_size(axis)

    def gather(x):
        blocks = jax.lax.all_gather(jax.lax.stop_gradient(x), axis)  # [D, b, ...]
        return jax.lax.dynamic_update_index_in_dim(blocks, x, index, 0).reshape((-1, *x.shape[1:]))

    scaled = jax.tree.map(lambda p: jax.lax.stop_gradient(p) + (p - jax.lax.stop_gradient(p)) / size, params)
    return jax.tree.map(gather, output), scaled, gather(labels)


def make_predict_step(model: TaskModel) -> Callable[[TrainState, dict], dict]:
    """``predict(state, batch) -> {"logits": [B, C], "head_input": [B, H]}``, deterministic.

    No dropout; IsoBN on its running statistics.

    Args:
      model: the task model (:class:`~isojax.train.model.TaskModel`).

    Returns:
      ``predict(state, batch)``, pure and not jitted: ``state`` a :class:`~isojax.train.state.TrainState`,
      ``batch`` with the model's ``INPUTS``; ``logits`` ``[B, num_labels]`` float32 and ``head_input`` ``[B, H]``
      (what the head reads).

    Examples:
      The logits are the head's affine map of the head input, ``head_input @ kernel + bias``:

      >>> import numpy as np, optax
      >>> from isojax.models import TransformerConfig, build_encoder, init_params
      >>> from isojax.train import TaskModel, create_state, init_variables
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> model = TaskModel(build_encoder(config), num_labels=2)
      >>> variables = init_variables(model, init_params(model.encoder, jax.random.key(0)), jax.random.key(1))
      >>> state = create_state(variables, optax.sgd(0.1), seed=0)
      >>> batch = {"input_ids": np.array([[1, 4, 2]], np.int32), "attention_mask": np.ones((1, 3), np.int32),
      ...          "token_type_ids": np.zeros((1, 3), np.int32)}
      >>> out = jax.jit(make_predict_step(model))(state, batch)
      >>> out["logits"].shape, out["head_input"].shape
      ((1, 2), (1, 8))
      >>> head = variables["params"]["head"]["classifier"]
      >>> np.allclose(out["logits"], np.asarray(out["head_input"]) @ head["kernel"] + head["bias"], atol=1e-6)
      True
    """

    def predict(state: TrainState, batch: dict):
        # apply without mutable= returns the output alone (flax declares the (output, variables) case too)
        out = cast(
            TaskOutput, model.apply(model_variables(state), *(batch[k] for k in model.INPUTS), deterministic=True)
        )
        return {"logits": out.logits, "head_input": out.head_input}

    return predict
