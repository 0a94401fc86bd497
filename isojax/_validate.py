"""Argument checks shared by every public function.

Each check raises ``ValueError`` or ``TypeError`` naming the argument and what was expected.
Checks use only static information (shapes and dtypes), so they run unchanged under ``jit``.
"""
from __future__ import annotations

import jax.numpy as jnp


def check_float(x, name: str):
    """Return ``x`` as an array; raise ``TypeError`` unless it has a floating dtype."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    return x


def check_points(x, name: str = "x", *, min_n: int = 1):
    """Check a float point cloud of shape ``[..., n, d]`` with ``n >= min_n``; return it as an array."""
    x = check_float(x, name)
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape [..., n, d] (at least 2 dims), got shape {x.shape}")
    if x.shape[-2] < min_n:
        raise ValueError(f"{name} needs at least {min_n} points along axis -2, got shape {x.shape}")
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


def check_positive_int(value, name: str, upper: int | None = None) -> int:
    """Check a Python int ``1 <= value (<= upper)``: ``TypeError`` for any other type (bool and float
    included), ``ValueError`` out of range; both name the argument."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__} {value!r}")
    if value < 1 or (upper is not None and value > upper):
        bound = f" and <= {upper}" if upper is not None else ""
        raise ValueError(f"{name} must be >= 1{bound}, got {value}")
    return value
