"""Argument checks shared by every public function.

Each check raises ``ValueError`` or ``TypeError`` naming the argument and what was expected. Shapes and dtypes
are static, so those checks run unchanged under ``jit``. Values are checked only where they are concrete:
:func:`check_hyperparameter` returns a validity flag for traced values, which the caller turns into NaN
(:func:`nan_unless`), and :func:`check_labels` checks label ranges only for concrete labels.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def check_float(x, name: str):
    """Return ``x`` as an array; raise ``TypeError`` unless it has a floating dtype."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    return x


def check_points(x, name: str = "x", *, min_n: int = 1, min_d: int = 1):
    """Check a float point cloud of shape ``[..., n, d]`` with ``n >= min_n`` and ``d >= min_d``; return it as an
    array."""
    x = check_float(x, name)
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape [..., n, d] (at least 2 dims), got shape {x.shape}")
    if x.shape[-2] < min_n:
        raise ValueError(f"{name} needs at least {min_n} points along axis -2, got shape {x.shape}")
    if x.shape[-1] < min_d:
        raise ValueError(f"{name} needs at least {min_d} features (d >= {min_d}) along axis -1, got shape {x.shape}")
    return x


def check_mask(mask, x, name: str = "mask"):
    """Check an optional boolean mask of shape ``x.shape[:-1]`` (true = real row); return it as bool or None."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if mask.shape != x.shape[:-1]:
        raise ValueError(f"{name} must have shape {x.shape[:-1]} (x.shape[:-1]), got {mask.shape}")
    if not (mask.dtype == jnp.bool_ or jnp.issubdtype(mask.dtype, jnp.integer)):
        raise TypeError(f"{name} must be boolean or integer 0/1, got {mask.dtype}")
    return mask.astype(bool)


def check_square(c, name: str, d: int):
    """Check a float matrix of shape ``[..., d, d]``; return it as an array."""
    c = check_float(c, name)
    if c.ndim < 2 or c.shape[-2:] != (d, d):
        raise ValueError(f"{name} must have shape [..., {d}, {d}] to match x's {d} features, got {c.shape}")
    return c


def check_positive_int(value, name: str, upper: int | None = None) -> int:
    """Check a Python int ``1 <= value (<= upper)``: ``TypeError`` for any other type (bool and float
    included), ``ValueError`` out of range; both name the argument."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{name} is shape-like and must be static under jit (static_argnames or a closure), "
                        "got a traced value")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__} {value!r}")
    if value < 1 or (upper is not None and value > upper):
        bound = f" and <= {upper}" if upper is not None else ""
        raise ValueError(f"{name} must be >= 1{bound}, got {value}")
    return value


def check_hyperparameter(value, name: str, *, low: float = -math.inf, high: float = math.inf,
                         low_open: bool = False, high_open: bool = False):
    """Check a float hyperparameter; return it and whether it lies in the interval from ``low`` to ``high``.

    ``value`` is a Python number (bool excluded) or a floating scalar array, concrete or traced. The interval is
    closed unless ``low_open``/``high_open``; NaN is never in it. A concrete value outside raises ``ValueError``
    (naming the argument and the interval) and a concrete value inside gives the flag ``True``. A traced value
    cannot be checked at trace time: the flag is then a traced bool, and the caller makes its result NaN where
    it is false with :func:`nan_unless` -- loud, never a silently clamped value.

    Returns:
      ``(value, in_range)``: a Python number as a float, an array unchanged; ``True`` or a 0-d bool array.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        value = check_float(value, name)
        if value.ndim != 0:
            raise ValueError(f"{name} must be a scalar, got shape {value.shape} (vmap over {name} for several values)")
        if isinstance(value, jax.core.Tracer):
            if low == -math.inf and high == math.inf:
                return value, True  # NaN, the only value outside, propagates by itself
            above = value > low if low_open else value >= low
            return value, above & (value < high if high_open else value <= high)
    concrete = float(value)
    if not ((concrete > low if low_open else concrete >= low) and (concrete < high if high_open else concrete <= high)):
        if low == 0 and high == math.inf:
            expected = "be positive" if low_open else "be non-negative"
        else:
            expected = f"be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must {expected}, got {concrete!r}")
    return (concrete if isinstance(value, (int, float)) else value), True


def nan_unless(in_range, result):
    """``result`` where ``in_range`` holds, NaN elsewhere (for traced hyperparameters, see
    :func:`check_hyperparameter`; ``in_range=True`` returns ``result`` itself)."""
    return result if in_range is True else jnp.where(in_range, result, jnp.nan)


def check_choice(value, name: str, choices: tuple):
    """Check that a static option (a string mode) is one of ``choices``; return it."""
    if not isinstance(value, str) or value not in choices:
        listed = " or ".join(map(repr, choices)) if len(choices) == 2 else f"one of {', '.join(map(repr, choices))}"
        raise ValueError(f"{name} must be {listed}, got {value!r}")
    return value


def check_labels(labels, x, num_classes: int | None):
    """Check integer class ``labels`` of shape ``x.shape[:-1]``; return ``(labels, num_classes)``.

    ``num_classes`` is static: taken from the largest label when the labels are concrete and it is None, and
    required when they are traced. Concrete labels must lie in ``[0, num_classes)``; traced labels outside
    that range belong to no class.
    """
    concrete = None if isinstance(labels, jax.core.Tracer) else np.asarray(labels)
    labels = jnp.asarray(labels)
    if labels.shape != x.shape[:-1]:
        raise ValueError(f"labels must have shape {x.shape[:-1]} (x.shape[:-1]), got {labels.shape}")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"labels must be integer class ids, got {labels.dtype}")
    if num_classes is None:
        if concrete is None:
            raise ValueError("num_classes must be given when labels are traced (under jit/vmap/grad)")
        num_classes = int(concrete.max()) + 1
    check_positive_int(num_classes, "num_classes")
    if concrete is not None and not np.all((concrete >= 0) & (concrete < num_classes)):
        raise ValueError(f"labels must lie in [0, num_classes) = [0, {num_classes})")
    return labels, num_classes
