"""Float hyperparameters of fine-tuning methods that may follow the training step: a constant or a schedule::

    value(step) = v              v a Python number or a 0-d float NumPy / JAX scalar (held as a Python float)
                = schedule(step)  an optax schedule (any ``Callable[[step], scalar]``), evaluated in the train step
                                  on the traced ``TrainState.step``: one compilation serves the whole run

``step`` is the number of batches trained so far in the run (:class:`~isojax.train.state.TrainState`'s ``step``,
over all stages): the first batch sees ``schedule(0)``.

Schedules written as text (``isojax finetune --reg``, the configuration's JSON) are :class:`StepSchedule`
values (``A``, ``B``, ``V``, ``F`` numbers; ``N`` > 0 and ``S`` >= 0 integers of steps)::

    constant:V          V at every step                                              (optax.constant_schedule)
    linear:A:B:N[:S]    A until step S (default 0), then linear to B at step S + N, then B  (optax.linear_schedule)
    warmup:V:N[:S]      linear:0:V:N[:S], the term switched on gradually
    cosine:A:N[:F]      A (F + (1 - F) (1 + cos(pi min(t, N) / N)) / 2): A down to F A at step N
                                                                               (optax.cosine_decay_schedule)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from isojax.train.methods import SCHEDULE_KINDS, is_schedule_text, parse_schedule, schedule_args

if TYPE_CHECKING:
    from typing_extensions import TypeIs

Hyperparameter = float | Callable[[Any], Any]

# kind -> the optax schedule of its arguments (the text forms: isojax.train.methods.SCHEDULE_ARGUMENTS)
_OPTAX: dict[str, Callable[..., optax.Schedule]] = {
    "constant": optax.constant_schedule,
    "linear": lambda a, b, n, s=0: optax.linear_schedule(a, b, n, s),
    "warmup": lambda v, n, s=0: optax.linear_schedule(0.0, v, n, s),
    "cosine": lambda a, n, f=0.0: optax.cosine_decay_schedule(a, n, alpha=f),
}


@dataclasses.dataclass(frozen=True)
class StepSchedule:
    """A schedule of the step written as text (module docstring): ``kind`` and its numeric ``args``.

    ``str(s)`` is the text form and :meth:`parse` reads it back; calling ``s(step)`` evaluates the optax schedule.
    Frozen and hashable, so a :class:`~isojax.train.objective.Regularizer` holding one stays hashable.

    Attributes:
      kind: one of :data:`SCHEDULE_KINDS`.
      args: its numbers in the order of the module docstring (``N`` and ``S`` held as ints, the others as floats);
        a wrong count or value is a ``ValueError`` naming the argument.

    Examples:
      ``linear:A:B:N:S`` is A until step S, then linear to B at step S + N:

      >>> s = StepSchedule.parse("linear:0:1:100:50")
      >>> s.args, str(s)
      ((0.0, 1.0, 100, 50), 'linear:0.0:1.0:100:50')
      >>> [float(s(t)) for t in (0, 50, 100, 150, 200)]
      [0.0, 0.0, 0.5, 1.0, 1.0]
    """

    kind: str
    args: tuple[float, ...]

    def __post_init__(self):
        object.__setattr__(self, "args", schedule_args(self.kind, self.args))

    @classmethod
    def parse(cls, text: str) -> StepSchedule:
        """``"linear:0:1:500"`` -> ``StepSchedule("linear", (0.0, 1.0, 500))``; ``ValueError`` naming the text."""
        return cls(*parse_schedule(text))

    def __str__(self) -> str:
        return ":".join([self.kind, *map(repr, self.args)])

    def __call__(self, step):
        return _OPTAX[self.kind](*self.args)(step)


def hyperparameter(value, name: str) -> Hyperparameter:
    """``value`` checked and normalised: a Python number, a 0-d NumPy / JAX float scalar or the text of a number
    becomes a Python float, schedule text (module docstring) a :class:`StepSchedule`, a callable is kept as the
    schedule it is.

    Anything else (a bool, an array with axes, an integer or complex array, a non-finite number, a traced value)
    is a ``TypeError`` / ``ValueError`` naming ``name``.

    Args:
      value: the hyperparameter as given.
      name: its name, for error messages.

    Returns:
      A Python float or a schedule (a callable of the step).

    Examples:
      >>> import numpy as np
      >>> hyperparameter(np.float32(0.5), "weight"), hyperparameter("1e-3", "weight")
      (0.5, 0.001)
      >>> hyperparameter("cosine:2:10", "weight")
      StepSchedule(kind='cosine', args=(2.0, 10))
      >>> hyperparameter(np.ones(2), "weight")
      Traceback (most recent call last):
      ...
      ValueError: weight must be a scalar, got an array of shape (2,)
    """
    if isinstance(value, str):
        if is_schedule_text(value):
            return StepSchedule.parse(value)
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{name} {value!r} is not a number or a schedule ({', '.join(SCHEDULE_KINDS)})") from None
    if callable(value):
        return value
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{name} must be a float or a schedule of the step, got {value!r}")
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{name} must be a concrete value (it is fixed when the step is built), got a traced "
            "value; pass a schedule of the step for a value that changes"
        )
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        if np.shape(value) != ():
            raise ValueError(f"{name} must be a scalar, got an array of shape {np.shape(value)}")
        if not jnp.issubdtype(value.dtype, jnp.floating):
            raise TypeError(f"{name} must be a float, got a scalar of dtype {value.dtype}")
        value = float(value)
    elif not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float or a schedule of the step, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def is_scheduled(value: Hyperparameter) -> TypeIs[Callable[[Any], Any]]:
    """Whether a normalised hyperparameter (:func:`hyperparameter`) changes with the step.

    Args:
      value: a value :func:`hyperparameter` returned.

    Returns:
      True for a schedule (a callable), False for a float.

    Examples:
      >>> is_scheduled(0.1), is_scheduled(hyperparameter("warmup:0.1:500", "weight"))
      (False, True)
    """
    return callable(value)


def value_at(value: Hyperparameter, step):
    """The hyperparameter at ``step`` (traced or concrete): ``value(step)`` for a schedule, else ``value``.

    Args:
      value: a value :func:`hyperparameter` returned.
      step: the number of batches trained so far (an int or a traced int32 scalar).

    Returns:
      A float, or the schedule's scalar at ``step``.

    Examples:
      ``warmup:V:N`` is ``V t / N`` during the warm-up:

      >>> value_at(0.3, 7), round(float(value_at(hyperparameter("warmup:0.1:500", "w"), 250)), 6)
      (0.3, 0.05)
    """
    return value(step) if callable(value) else value


def to_json(value: Hyperparameter):
    """A JSON-ready form: the float, the text of a :class:`StepSchedule` (which :func:`hyperparameter` reads back),
    or, for any other callable, its ``repr`` (which cannot be read back).

    Args:
      value: a value :func:`hyperparameter` returned.

    Returns:
      A float or a string.

    Examples:
      >>> to_json(0.25), to_json(StepSchedule("warmup", (0.1, 500)))
      (0.25, 'warmup:0.1:500')
      >>> hyperparameter(to_json(StepSchedule("warmup", (0.1, 500))), "w") == StepSchedule("warmup", (0.1, 500))
      True
    """
    if isinstance(value, StepSchedule):
        return str(value)
    return repr(value) if callable(value) else value


__all__ = [
    "SCHEDULE_KINDS",
    "StepSchedule",
    "hyperparameter",
    "is_schedule_text",
    "is_scheduled",
    "to_json",
    "value_at",
]
