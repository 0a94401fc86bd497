"""The training state: one pytree that a step maps to the next and a checkpoint stores whole."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from isojax import losses


@flax.struct.dataclass
class TrainState:
    """Everything a resumed run needs besides the data position.

    Attributes:
      step: ``[]`` int32, batches trained so far over all stages (the dropout key of a batch is
        ``fold_in(key, step)``, so a resumed run draws the same masks).
      params: the model parameters.
      opt_state: the optax state.
      batch_stats: IsoBN running statistics (``{}`` without IsoBN).
      balancer: the joint-loss balancer (:class:`isojax.losses.BalancerState`).
      rng: ``[2]`` uint32 raw key data of the run's key.
      constants: model variables that are neither trained nor updated, the ``constants`` collection (the
        permutations, signs and ActNorm centres of a trained flow, :class:`isojax.calibrate.Flow`; ``{}`` without one).
      nonfinite_steps: ``[]`` int32, steps of the current stage whose update was skipped because their loss or
        gradient was not finite (:func:`isojax.train.step.make_train_step`).
      nonfinite_streak: ``[]`` int32, how many of the latest steps in a row were skipped (0 after a step whose update
        was applied).
    """

    step: jax.Array
    params: Any
    opt_state: Any
    batch_stats: Any
    balancer: losses.BalancerState
    rng: jax.Array
    constants: Any = flax.struct.field(default_factory=dict)
    nonfinite_steps: jax.Array = flax.struct.field(default_factory=lambda: jnp.zeros((), jnp.int32))
    nonfinite_streak: jax.Array = flax.struct.field(default_factory=lambda: jnp.zeros((), jnp.int32))

    @property
    def key(self) -> jax.Array:
        """The run's typed PRNG key."""
        return jax.random.wrap_key_data(self.rng)


def create_state(
    variables: dict,
    optimizer: optax.GradientTransformation,
    seed: int,
    *,
    step: int = 0,
    balancer: losses.BalancerState | None = None,
) -> TrainState:
    """A fresh state for ``variables``: optimiser initialised, balancer reset (unless given), key from ``seed``, no
    skipped steps.

    Args:
      variables: ``{"params", "batch_stats", "constants"}``, the last two optional.
      optimizer: the optax optimiser (:func:`isojax.train.optim.make_optimizer`).
      seed: the seed of the run's key.
      step: where the stage starts in the run's step count.
      balancer: the joint-loss balancer to carry over, or None for a fresh one.

    Returns:
      A :class:`TrainState`.

    Examples:
      >>> import jax, jax.numpy as jnp, numpy as np, optax
      >>> state = create_state({"params": {"w": jnp.ones(3)}}, optax.sgd(0.1), seed=4, step=7)
      >>> int(state.step), state.batch_stats, int(state.nonfinite_steps)
      (7, {}, 0)
      >>> np.array_equal(jax.random.key_data(state.key), jax.random.key_data(jax.random.key(4)))
      True
    """
    params = variables["params"]
    return TrainState(
        step=jnp.asarray(step, jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        batch_stats=variables.get("batch_stats", {}),
        balancer=losses.balancer_init(2) if balancer is None else balancer,
        rng=jax.random.key_data(jax.random.key(seed)),
        constants=variables.get("constants", {}),
    )
