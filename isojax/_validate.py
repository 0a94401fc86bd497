"""Argument checks shared by every public function.

Each check raises ``ValueError`` or ``TypeError`` naming the argument and what was expected. Shapes and dtypes
are static, so those checks run unchanged under ``jit``. Values are checked only where they are concrete:
:func:`check_hyperparameter` and :func:`check_cloud` return a validity flag for traced values, which the caller
turns into NaN (:func:`nan_unless`), and :func:`check_labels` checks label ranges only for concrete labels.

**The bad-input rule for point clouds** (:func:`check_cloud`): rows where the mask is false never influence a
result or its gradient, whatever they hold (the statistics select rows with ``jnp.where`` before any
arithmetic); a NaN or inf in a counted row is a ``ValueError`` naming the argument and the row for concrete
input and makes the result NaN when traced (never a finite number); integer masks hold only 0 and 1; a mask
that selects fewer rows than the result is defined for (an empty cloud, or one point where a covariance or a
pair is needed) is a ``ValueError`` for a concrete mask and NaN for a traced one, never a stand-in value.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from isojax._numeric import nan_unless

__all__ = [
    "check_choice",
    "check_cloud",
    "check_finite_rows",
    "check_float",
    "check_hyperparameter",
    "check_labels",
    "check_mask",
    "check_mask_values",
    "check_points",
    "check_positive_int",
    "check_real_rows",
    "check_square",
    "check_texts",
    "nan_unless",
]


def _traced(*values) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in values)


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
    """Check an optional mask of shape ``x.shape[:-1]`` (true = real row); return it as bool or None.

    Boolean, or integer holding only 0 and 1: a concrete integer mask with any other value is a ``ValueError``
    naming the values found. A traced integer mask cannot be checked here; :func:`check_cloud` flags it (the
    result is NaN unless it holds only 0 and 1), functions that call only this check read it as ``mask != 0``.
    """
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if mask.shape != x.shape[:-1]:
        raise ValueError(f"{name} must have shape {x.shape[:-1]} (x.shape[:-1]), got {mask.shape}")
    return check_mask_values(mask, name)


def check_mask_values(mask, name: str = "mask"):
    """A boolean mask, or an integer one holding only 0 and 1 (``ValueError`` naming the values found when it
    is concrete; ``TypeError`` for other dtypes), as bool (a traced integer mask: ``mask != 0``)."""
    mask = jnp.asarray(mask)
    if not (mask.dtype == jnp.bool_ or jnp.issubdtype(mask.dtype, jnp.integer)):
        raise TypeError(f"{name} must be boolean or integer 0/1, got {mask.dtype}")
    if mask.dtype != jnp.bool_ and not _traced(mask):
        values = np.unique(np.asarray(mask))
        if not np.isin(values, (0, 1)).all():
            raise ValueError(f"{name} must be boolean or hold only 0 and 1, found the values {values[:8].tolist()}")
    return mask != 0


def check_finite_rows(x, mask, name: str = "x"):
    """Whether every counted row of ``x [..., n, d]`` is finite (``mask [...,n]`` bool or None = every row).

    Concrete ``x`` and ``mask``: ``ValueError`` naming ``name`` and the first counted row holding NaN or inf
    (its index, with the leading indices for batched clouds), else ``True``. Traced: the flag ``[...]``, which
    the caller passes to :func:`nan_unless` so that the result is NaN, never a finite number.
    """
    if _traced(x, mask):
        finite = jnp.all(jnp.isfinite(x), axis=-1)
        return jnp.all(finite if mask is None else finite | ~mask, axis=-1)
    # Concrete: numpy, so that the check also runs (and raises) on constants inside a jit trace.
    bad = ~np.isfinite(np.asarray(x).astype(np.float64)).all(axis=-1)
    if mask is not None:
        bad &= np.asarray(mask)
    bad_rows = np.argwhere(bad)
    if len(bad_rows):
        index = tuple(int(i) for i in bad_rows[0])
        where = f"row {index[-1]}" + (f" of cloud {index[:-1]}" if len(index) > 1 else "")
        raise ValueError(
            f"{name} has a non-finite value (NaN or inf) in {where}"
            + (", a row the mask counts" if mask is not None else "")
        )
    return True


def check_cloud(
    x,
    mask=None,
    name: str = "x",
    *,
    min_n: int = 1,
    min_d: int = 1,
    mask_name: str = "mask",
    count_real: bool = True,
):
    """Check a point cloud ``x [..., n, d]`` and its optional mask by the bad-input rule (module docstring).

    ``min_n`` is the fewest points the result is defined for: ``x`` needs that many rows along axis -2 and, with
    ``count_real`` (the default), the mask that many real rows per cloud (:func:`check_real_rows`). Transforms
    and barcodes, whose answer for an empty cloud is empty rather than undefined, pass ``count_real=False``.

    Returns ``(x, mask, ok)``: ``x`` as an array (:func:`check_points`), the mask as bool or None
    (:func:`check_mask`) and ``ok`` -- ``True`` for concrete input (which raises instead) or a traced ``[...]``
    flag that is false where a counted row is not finite, a traced integer mask holds a value other than 0/1, or
    a traced mask selects fewer than ``min_n`` rows. The caller returns ``nan_unless(ok, result)`` and selects
    rows with ``jnp.where`` (the :mod:`isojax._stats` helpers do) so that masked rows never reach any arithmetic.
    """
    x = check_points(x, name, min_n=min_n, min_d=min_d)
    raw = mask
    mask = check_mask(mask, x, mask_name)
    ok = check_finite_rows(x, mask, name)
    if mask is not None and _traced(raw) and raw.dtype != jnp.bool_:
        ok = ok & jnp.all((raw == 0) | (raw == 1), axis=-1)
    if count_real:
        ok = ok & check_real_rows(mask, min_n, mask_name)
    return x, mask, ok


def check_real_rows(mask, minimum: int, name: str = "mask"):
    """Whether every cloud of ``mask [..., n]`` (bool, or None = every row) has at least ``minimum`` true rows.

    Concrete: ``ValueError`` naming the first cloud with fewer, else ``True``; traced: the flag ``[...]`` for
    :func:`nan_unless`.
    """
    if mask is None:
        return True
    if _traced(mask):
        return jnp.sum(mask, axis=-1) >= minimum
    counts = np.sum(np.asarray(mask), axis=-1)
    if (counts < minimum).any():
        index = tuple(int(i) for i in np.argwhere(counts < minimum)[0]) if counts.ndim else ()
        where = f" (cloud {index})" if index else ""
        raise ValueError(
            f"{name} must select at least {minimum} row(s) per cloud (the result is not defined for fewer), "
            f"got {int(counts[index])}{where}"
        )
    return True


def check_texts(texts, name: str = "texts"):
    """Check a sequence of strings (a single ``str`` is a ``TypeError``: it would be read as its characters)."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(
            f"{name} must be a sequence of strings, got {type(texts).__name__} (a single text, "
            f"{texts[:40]!r}, would be read as its characters; wrap it in a list: [text])"
        )
    try:
        items = list(texts)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of strings, got {type(texts).__name__}") from None
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] must be a string, got {type(text).__name__}")
    return items


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
        raise TypeError(
            f"{name} is shape-like and must be static under jit (static_argnames or a closure), got a traced value"
        )
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__} {value!r}")
    if value < 1 or (upper is not None and value > upper):
        bound = f" and <= {upper}" if upper is not None else ""
        raise ValueError(f"{name} must be >= 1{bound}, got {value}")
    return value


def check_hyperparameter(
    value, name: str, *, low: float = -math.inf, high: float = math.inf, low_open: bool = False, high_open: bool = False
):
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
