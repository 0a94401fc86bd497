"""The optimiser: AdamW with warm-up and decay, gradient clipping, accumulation, and parameter groups.

    clip_by_global_norm(max_grad_norm)
    -> per group:  model      AdamW(schedule(learning_rate), weight_decay) on matrices (ndim >= 2)
                   transform  Adam(schedule(transform_learning_rate))       SoftDecay alpha, Isotropy Layer
                   flow       AdamW(transform_learning_rate, weight_decay)  a trained flow (method flow),
                              then scale_lu_updates()                      its LU factors' steps / sqrt(m)
                   frozen     zero updates                                   parameters the stage does not train,
                                                                             BART's final_logits_bias
    -> MultiSteps(accumulation)   averages ``accumulation`` batches' gradients per update

The flow group follows BERT-flow's fine-tuning code (``optimization_bert_flow.py``): its own optimiser at a
constant learning rate (``transform_learning_rate``, BERT-flow's 1e-3) with weight decay, and its gradient clipped
to ``max_grad_norm`` on its own, while the other groups' gradients are clipped together as without a flow (the
flow's maximum-likelihood gradient never shrinks the model's step). ``final_logits_bias`` is a buffer in
transformers (never trained there), so it is frozen here too.

``schedule``: linear warm-up over ``warmup_steps`` updates to the peak, then linear decay to 0 at
``total_updates`` ("linear", as in BERT), cosine decay, or constant after warm-up. Weight decay skips biases,
LayerNorm and scalar parameters (the usual BERT fine-tuning rule). Steps count optimiser *updates*; with
accumulation a training step is one batch and the optimiser updates every ``accumulation`` steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import optax

from isojax.calibrate.flow import scale_lu_updates
from isojax.models import TRANSFORM, registry
from isojax.train.config import SCHEDULES

TRANSFORM_PREFIXES = (("encoder", TRANSFORM), ("isotropy_layer",))
FLOW_PREFIX = ("flow",)


def buffer_paths(params) -> tuple[tuple[str, str], ...]:
    """Paths in a task model's ``params`` of the pretrained network's buffers (``params["encoder"]``'s keys that
    :func:`isojax.models.registry.buffers` names; BART's ``("encoder", "final_logits_bias")``).

    Args:
      params: a task model's params (the pretrained network under ``"encoder"``).

    Returns:
      A tuple of ``("encoder", key)`` paths; () for a network without buffers.

    Examples:
      >>> import numpy as np
      >>> buffer_paths({"encoder": {"final_logits_bias": np.zeros((1, 5)), "shared": {}}, "head": {}})
      (('encoder', 'final_logits_bias'),)
    """
    return tuple(("encoder", key) for key in registry.buffers(params.get("encoder", {})))


def param_labels(params, frozen: Sequence[str] = ()):
    """Group of every parameter: ``"frozen"`` under a top-level key in ``frozen`` or a buffer (BART's
    ``final_logits_bias``), ``"transform"`` under the last-layer transform (SoftDecay) or the Isotropy Layer,
    ``"flow"`` under the flow, else ``"model"``.

    Args:
      params: a task model's params.
      frozen: top-level keys whose parameters the stage does not train.

    Returns:
      A pytree of ``params``' structure holding each parameter's group name.

    Examples:
      >>> import numpy as np
      >>> params = {"encoder": {"layer_0": {"kernel": np.ones((2, 2))}, "last_layer_transform": {"alpha": np.ones(())}},
      ...           "head": {"bias": np.zeros(2)}}
      >>> param_labels(params, frozen=("head",))
      {'encoder': {'last_layer_transform': {'alpha': 'transform'}, 'layer_0': {'kernel': 'model'}},
       'head': {'bias': 'frozen'}}
    """
    buffers = buffer_paths(params)

    def label(path, _):
        keys = tuple(getattr(k, "key", str(k)) for k in path)
        if keys[0] in frozen or keys[:2] in buffers:
            return "frozen"
        if any(keys[: len(p)] == p for p in TRANSFORM_PREFIXES):
            return "transform"
        if keys[: len(FLOW_PREFIX)] == FLOW_PREFIX:
            return "flow"
        return "model"

    return jax.tree_util.tree_map_with_path(label, params)


def decay_mask(params):
    """True for the parameters weight decay applies to: matrices (kernels, embeddings), not biases/LayerNorm.

    Args:
      params: a pytree of arrays.

    Returns:
      A pytree of bools, ``ndim >= 2`` per leaf.

    Examples:
      >>> import numpy as np
      >>> decay_mask({"kernel": np.ones((2, 3)), "bias": np.zeros(3), "alpha": np.ones(())})
      {'alpha': False, 'bias': False, 'kernel': True}
    """
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def schedule(peak: float, total_updates: int, warmup_steps: int, kind: str = "linear") -> optax.Schedule:
    """Learning rate per update: linear warm-up from 0 to ``peak`` over ``warmup_steps``, then ``kind``.

    Args:
      peak: the learning rate at the end of the warm-up.
      total_updates: the run's optimiser updates; ``"linear"`` reaches 0 there, ``"cosine"`` decays over the
        ``total_updates - warmup_steps`` updates after the warm-up.
      warmup_steps: updates of the warm-up (capped at ``total_updates``).
      kind: ``"linear"``, ``"cosine"`` or ``"constant"`` after the warm-up.

    Returns:
      An optax schedule: update count -> learning rate.

    Examples:
      With 10 updates, 2 of warm-up: ``peak t / 2`` during it, then ``peak (1 - (t - 2) / 8)``:

      >>> lr = schedule(1e-3, total_updates=10, warmup_steps=2)
      >>> [round(float(lr(t)), 6) for t in (0, 1, 2, 6, 10)]
      [0.0, 0.0005, 0.001, 0.0005, 0.0]
      >>> import math
      >>> math.isclose(float(schedule(1.0, 10, 0, "cosine")(4)), (1 + math.cos(math.pi * 4 / 10)) / 2, rel_tol=1e-6)
      True
    """
    if kind not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
    warmup_steps = min(warmup_steps, total_updates)
    decay_steps = max(total_updates - warmup_steps, 1)
    after = {
        "linear": optax.linear_schedule(peak, 0.0, decay_steps),
        "cosine": optax.cosine_decay_schedule(peak, decay_steps),
        "constant": optax.constant_schedule(peak),
    }[kind]
    if warmup_steps == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup_steps), after], [warmup_steps])


def make_optimizer(
    params,
    *,
    learning_rate: float,
    transform_learning_rate: float,
    weight_decay: float,
    total_updates: int,
    warmup_steps: int = 0,
    schedule_kind: str = "linear",
    max_grad_norm: float | None = 1.0,
    accumulation: int = 1,
    frozen: Sequence[str] = (),
) -> optax.GradientTransformation:
    """The optimiser of the module docstring for ``params`` (whose structure fixes the groups).

    Args:
      params: the task model's params (or a pytree of their shapes).
      learning_rate: the peak learning rate of the ``model`` group.
      transform_learning_rate: the peak learning rate of the ``transform`` group and the constant one of ``flow``.
      weight_decay: AdamW's decoupled weight decay, on matrices only (:func:`decay_mask`).
      total_updates: the run's optimiser updates, the length of the learning-rate schedule (:func:`schedule`).
      warmup_steps: updates of the linear warm-up (:func:`schedule`).
      schedule_kind: ``"linear"``, ``"cosine"`` or ``"constant"`` after the warm-up (:func:`schedule`'s ``kind``).
      max_grad_norm: clip the global gradient norm to it (None or 0: no clipping).
      accumulation: average this many batches' gradients per update (``optax.MultiSteps``).
      frozen: top-level keys of ``params`` not trained (zero updates).

    Returns:
      An ``optax.GradientTransformation``.

    Examples:
      Adam's first update is ``-lr g / |g|`` per entry (``eps`` aside), and AdamW adds ``-lr wd p`` on matrices only:

      >>> import jax, jax.numpy as jnp
      >>> params = {"head": {"kernel": jnp.ones((2, 2)), "bias": jnp.zeros(2)}}
      >>> tx = make_optimizer(params, learning_rate=0.1, transform_learning_rate=1.0, weight_decay=0.01,
      ...                     total_updates=10)
      >>> grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
      >>> updates, _ = tx.update(grads, tx.init(params), params)
      >>> round(float(updates["head"]["kernel"][0, 0]), 5), round(float(updates["head"]["bias"][0]), 5)
      (-0.101, -0.1)
    """
    labels = param_labels(params, frozen)
    groups = {
        "model": optax.adamw(
            schedule(learning_rate, total_updates, warmup_steps, schedule_kind),
            weight_decay=weight_decay,
            mask=decay_mask,
        ),
        "transform": optax.adam(schedule(transform_learning_rate, total_updates, warmup_steps, schedule_kind)),
        "frozen": optax.set_to_zero(),
    }
    has_flow = "flow" in jax.tree.leaves(labels)
    if has_flow:  # only then: the optimiser state of a run without a flow keeps its structure
        groups["flow"] = optax.chain(
            optax.adamw(transform_learning_rate, weight_decay=weight_decay, mask=decay_mask), scale_lu_updates()
        )
    tx = optax.multi_transform(groups, labels)
    if max_grad_norm:
        clip = optax.clip_by_global_norm(max_grad_norm)
        if has_flow:  # the flow's gradient is clipped on its own (module docstring)
            clip = optax.multi_transform(
                {"flow": clip, "rest": clip}, jax.tree.map(lambda g: "flow" if g == "flow" else "rest", labels)
            )
        tx = optax.chain(clip, tx)
    return optax.MultiSteps(tx, every_k_schedule=accumulation) if accumulation > 1 else tx
