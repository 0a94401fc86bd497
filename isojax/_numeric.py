"""Safe numeric primitives shared by the statistics (:mod:`isojax._stats`), metrics, losses, topology and calibration.

Each is safe where the naive formula is not: finite values *and* finite gradients at zero denominators,
zero norms and empty masks (the double-``where`` trick keeps the untaken branch's gradient finite), and
decompositions that never see a non-finite matrix (:func:`finite_matrix`, whose flag :func:`nan_unless` turns
into NaN afterwards).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Statistics and eigenvector products are computed in full float32 (never TF32/bf16 passes on GPU/TPU).
HIGHEST = jax.lax.Precision.HIGHEST


def promote_float32(x):
    """``x`` cast to at least float32 (bf16/f16 inputs are promoted; float64 is kept)."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def safe_div(num, den):
    """``num / den`` where ``den != 0``, else 0, with finite gradients in both branches."""
    nonzero = den != 0
    return jnp.where(nonzero, num / jnp.where(nonzero, den, 1), 0)


def safe_sqrt(v):
    """``sqrt(v)`` for ``v >= 0`` whose gradient at 0 is 0 instead of inf."""
    positive = v > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, v, 1)), 0)


def safe_norm(v, axis=-1, keepdims: bool = False):
    """Euclidean norm ``sqrt(sum v^2)`` along ``axis``, with a finite (zero) gradient at the zero vector."""
    return safe_sqrt(jnp.sum(v * v, axis=axis, keepdims=keepdims))


def nan_unless(ok, result):
    """``result`` where ``ok`` holds, NaN elsewhere; ``ok=True`` returns ``result`` itself.

    ``ok`` is ``True`` or a bool array whose shape is the leading shape of every floating leaf of the pytree
    ``result`` (``[...]`` against ``[...]``, ``[..., n, d]`` ...): it is broadcast along the leaves' trailing
    axes. Non-floating leaves (indices, bool masks) are returned unchanged.
    """
    if ok is True:
        return result
    ok = jnp.asarray(ok)

    def poison(leaf):
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            return leaf
        leaf = jnp.asarray(leaf)
        return jnp.where(ok.reshape(ok.shape + (1,) * (leaf.ndim - ok.ndim)), leaf, jnp.nan)

    return jax.tree.map(poison, result)


def finite_matrix(m):
    """``(m, ok)``: each matrix of ``m [..., a, b]`` if all its entries are finite, else zeros, and ``ok [...]``.

    Decompositions (SVD, eigh, QR, solve) receive this stand-in instead of a non-finite matrix, which LAPACK's
    iterative solvers may never finish on; the caller poisons the result with :func:`nan_unless` ``(ok, ...)``.
    """
    ok = jnp.all(jnp.isfinite(m), axis=(-2, -1))
    return jnp.where(ok[..., None, None], m, 0), ok
