"""Streaming per-layer statistics of hidden states: one pass over any number of batches, memory independent of n.

An explicit state, as optax keeps its optimiser state: :func:`init` makes an empty :class:`Stats`, :func:`update`
folds a batch of states ``x [..., n, d]`` (with ``mask [..., n]``, true = real token) into it, :func:`merge`
combines two states (other batches, processes or files), :func:`merge_over_axis` combines the per-device states of a
sharded accumulation with collectives, and :func:`save` / :func:`load` keep a state in an ``.npz`` file for resuming
or merging across processes. Finalisers turn a state into the measures that :mod:`isojax.metrics` computes from a
whole cloud in memory: :func:`covariance`, :func:`isoscore`, :func:`isoscore_star`, :func:`anisotropy`,
:func:`explained_variance`, :func:`mean_cosine`, :func:`rogue_dimensions`, :func:`massive_activation` and the fits
:func:`fit_centering` / :func:`fit_whitening` of :mod:`isojax.calibrate`.

What a state holds (``S`` = its shape, ``()`` or ``(layers,)``; every field's size is independent of the number of
tokens):

* ``tokens [*S]`` the number of real tokens (int32, int64 with x64), ``mean [*S, d]``,
  ``m2 [*S, d, d]`` = Σ (x − mean)(x − mean)ᵀ;
* ``max_abs [*S, d]`` the largest ``|x|`` per dimension (−inf before any token), ``max_index [*S, d]`` the token's
  index in the stream of real tokens (0-based, in the order they were folded in; −1 before any token) and
  ``max_position [*S, d]`` its position along the ``n`` axis of its batch;
* ``unit_sum [*S, d]`` = Σ x̂ and ``unit_sq_sum [*S, d]`` = Σ x̂² over the unit rows x̂ = x / ‖x‖ (zero rows stay
  zero), from which the exact mean cosine over all pairs and the rogue-dimension contributions follow
  (Σ_{i≠j} x̂_i,k x̂_j,k = (Σ_i x̂_i,k)² − Σ_i x̂_i,k²).

**Precision.** The state's floating dtype is float64 when x64 is enabled (``jax.enable_x64`` or
``JAX_ENABLE_X64``) and float32 otherwise. Either way every batch is centred on its own mean before its outer
products are summed, and batches are combined by Chan et al.'s parallel formula (n = n_a + n_b, δ = m_b − m_a,
m = m_a + δ n_b / n, M2 = M2_a + M2_b + δδᵀ n_a n_b / n), so no raw second moment Σ x xᵀ is ever accumulated: the
float32 error grows with the spread of the batch means, not with ‖mean‖² (Chan, Golub & LeVeque 1979). Counts are
integers (exact up to 2³¹ − 1 tokens in int32).

Everything here is a plain function (the caller jits; :func:`update` and :func:`merge` are jit-friendly, the state
is a pytree). Bad input follows :mod:`isojax.metrics`: a NaN or inf in a counted row is a ``ValueError`` naming
``x`` for concrete input and makes the state NaN under ``jit``; padding rows never enter it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from isojax._numeric import HIGHEST, finite_matrix, nan_unless, safe_div
from isojax._stats import (
    isoscore_from_moments,
    pair_contributions,
    select_rows,
    shrunk_moments,
    shrunk_to_identity,
    unit_rows,
)
from isojax._validate import check_cloud, check_hyperparameter, check_points, check_positive_int, check_square
from isojax.metrics import MassiveActivation, RogueDimensions, rogue_summary

__all__ = [
    "Stats",
    "init",
    "update",
    "merge",
    "merge_over_axis",
    "save",
    "load",
    "covariance",
    "second_moment",
    "isoscore",
    "isoscore_star",
    "anisotropy",
    "explained_variance",
    "mean_cosine",
    "rogue_dimensions",
    "massive_activation",
    "fit_centering",
    "fit_whitening",
    "streamed_covariance",
]


class Stats(NamedTuple):
    """Streaming statistics of a stream of token states (a pytree; see the module docstring for each field).

    Attributes:
      tokens: ``[*S]`` int, the number of real tokens folded in.
      mean: ``[*S, d]`` float, their mean.
      m2: ``[*S, d, d]`` float, Σ (x − mean)(x − mean)ᵀ.
      max_abs: ``[*S, d]`` float, the largest ``|x|`` per dimension (−inf before any token).
      max_index: ``[*S, d]`` int, the stream index of the token holding it (−1 before any token).
      max_position: ``[*S, d]`` int, that token's position along its batch's ``n`` axis (−1 before any token).
      unit_sum: ``[*S, d]`` float, Σ x / ‖x‖.
      unit_sq_sum: ``[*S, d]`` float, Σ (x / ‖x‖)².
    """

    tokens: jax.Array
    mean: jax.Array
    m2: jax.Array
    max_abs: jax.Array
    max_index: jax.Array
    max_position: jax.Array
    unit_sum: jax.Array
    unit_sq_sum: jax.Array


def _dtypes():
    """(float64, int64) when x64 is enabled, else (float32, int32): JAX's canonical dtypes."""
    return jax.dtypes.canonicalize_dtype(jnp.float64), jax.dtypes.canonicalize_dtype(jnp.int64)


def init(d: int, layers: int | None = None) -> Stats:
    """An empty state for ``d``-dimensional states, one per layer when ``layers`` is given.

    Args:
      d: the feature dimension (a positive int).
      layers: ``None`` (state shape ``()``) or a positive int (state shape ``(layers,)``: one statistic per layer).

    Returns:
      A :class:`Stats` with 0 tokens (float64/int64 when x64 is enabled, float32/int32 otherwise).

    Examples:
      >>> from isojax import stats
      >>> s = stats.init(4, layers=3)
      >>> s.tokens.shape, s.m2.shape
      ((3,), (3, 4, 4))
    """
    d = check_positive_int(d, "d")
    shape = () if layers is None else (check_positive_int(layers, "layers"),)
    fdt, idt = _dtypes()
    vec = jnp.zeros(shape + (d,), fdt)
    return Stats(
        tokens=jnp.zeros(shape, idt),
        mean=vec,
        m2=jnp.zeros(shape + (d, d), fdt),
        max_abs=jnp.full(shape + (d,), -jnp.inf, fdt),
        max_index=jnp.full(shape + (d,), -1, idt),
        max_position=jnp.full(shape + (d,), -1, idt),
        unit_sum=vec,
        unit_sq_sum=vec,
    )


def _check_stats(stats) -> Stats:
    if not isinstance(stats, Stats):
        raise TypeError(f"stats must be an isojax.stats.Stats (from stats.init), got {type(stats).__name__}")
    return stats


def _pool(x, mask, shape: tuple):
    """``x [*lead, *S, n, d]``, ``mask`` None or ``x.shape[:-1]`` -> ``([*S, P, d], [*S, P], positions [P])``:
    the pooled axes (``lead`` and ``n``, row-major) flattened into P."""
    lead = x.ndim - 2 - len(shape)
    n = x.shape[-2]
    mask = jnp.ones(x.shape[:-1], bool) if mask is None else mask
    order = tuple(range(lead, lead + len(shape))) + tuple(range(lead)) + (x.ndim - 2, x.ndim - 1)
    x = jnp.transpose(x, order).reshape(shape + (-1, x.shape[-1]))
    mask = jnp.transpose(mask, order[:-1]).reshape(shape + (-1,))
    return x, mask, jnp.arange(x.shape[-2]) % n


def update(stats: Stats, x, mask=None) -> Stats:
    """Fold a batch of token states into ``stats``.

    The batch's real rows (count n_b, mean m_b, M2_b = Σ (x − m_b)(x − m_b)ᵀ about its own mean) are merged into the
    state by :func:`merge` (Chan et al.); maxima and unit-row sums are updated alongside.

    Args:
      stats: the state (from :func:`init`, shape ``S``).
      x: ``[..., *S, n, d]`` float states; all axes but ``S`` and ``d`` are pooled (e.g. ``[B, L, d]`` for a state
        of shape ``()``, ``[B, layers, L, d]`` for one of shape ``(layers,)``).
      mask: optional bool ``[..., *S, n]`` (``x.shape[:-1]``) or ``[..., n]`` (the same mask for every layer), true
        = real token; None = every row.

    Returns:
      The updated :class:`Stats` (NaN under ``jit`` if a counted row is not finite).

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> x = np.array([[[1.0, 0.0], [3.0, 2.0], [9.0, 9.0]]], np.float32)  # [B=1, n=3, d=2]
      >>> s = stats.update(stats.init(2), x, np.array([[True, True, False]]))
      >>> int(s.tokens), np.asarray(s.mean).tolist()
      (2, [2.0, 1.0])
    """
    stats = _check_stats(stats)
    fdt, idt = stats.mean.dtype, stats.tokens.dtype
    d = stats.mean.shape[-1]
    x = check_points(x, "x")
    shape = stats.tokens.shape
    lead = x.ndim - 2 - len(shape)
    if lead < 0 or x.shape[lead : lead + len(shape)] != shape:
        raise ValueError(f"x must have shape [..., *{shape}, n, d] to match the state's shape {shape}, got {x.shape}")
    x, mask, ok = check_cloud(x, _full_mask(x, mask, shape), count_real=False)
    if x.shape[-1] != d:
        raise ValueError(f"x must have d={d} features (the state's) along axis -1, got shape {x.shape}")
    x, mask, positions = _pool(x.astype(fdt), mask, stats.tokens.shape)
    weights = mask.astype(fdt)
    n_b = jnp.sum(weights, axis=-1)
    m_b = safe_div(jnp.sum(select_rows(x, mask), axis=-2), n_b[..., None])
    xc = select_rows(x - m_b[..., None, :], mask)
    m2_b = jnp.matmul(jnp.swapaxes(xc, -1, -2), xc, precision=HIGHEST)
    absx = jnp.where(mask[..., None], jnp.abs(x), -jnp.inf)
    where = jnp.argmax(absx, axis=-2)  # [*S, d], the first row at the maximum
    rank = jnp.cumsum(mask, axis=-1, dtype=idt) - 1  # the stream index of each real row within this batch
    unit = unit_rows(select_rows(x, mask))
    batch = Stats(
        tokens=jnp.sum(mask, axis=-1, dtype=idt),
        mean=m_b,
        m2=m2_b,
        max_abs=jnp.max(absx, axis=-2),
        max_index=jnp.where(jnp.any(mask, -1, keepdims=True), jnp.take_along_axis(rank, where, -1), -1),
        max_position=jnp.where(jnp.any(mask, -1, keepdims=True), positions[where].astype(idt), -1),
        unit_sum=jnp.sum(unit, axis=-2),
        unit_sq_sum=jnp.sum(unit * unit, axis=-2),
    )
    if ok is not True:
        ok = _all_lead(ok, len(stats.tokens.shape))
    return nan_unless(ok, merge(stats, batch))


def _all_lead(ok, s_ndim: int):
    """``ok [*lead, *S]`` (one flag per cloud) reduced over the pooled leading axes -> ``[*S]``."""
    return jnp.all(ok, axis=tuple(range(ok.ndim - s_ndim)))


def _full_mask(x, mask, shape):
    """The mask broadcast to ``x.shape[:-1]`` (a per-text ``[..., n]`` mask repeated over the state's axes)."""
    if mask is None or not shape:
        return mask
    mask = jnp.asarray(mask)
    lead = x.ndim - 2 - len(shape)
    if lead >= 0 and mask.shape == x.shape[:lead] + (x.shape[-2],):
        return jnp.broadcast_to(jnp.expand_dims(mask, tuple(range(lead, lead + len(shape)))), x.shape[:-1])
    return mask


def merge(a: Stats, b: Stats) -> Stats:
    """The state of the stream ``a`` followed by the stream ``b`` (Chan, Golub & LeVeque 1979).

    n = n_a + n_b, δ = m_b − m_a, m = m_a + δ n_b / n, M2 = M2_a + M2_b + δδᵀ n_a n_b / n; maxima keep the larger
    (``a``'s on a tie) with ``b``'s stream indices shifted by n_a; unit-row sums add.

    Args:
      a: a state.
      b: a state of the same shape and dtype.

    Returns:
      The merged :class:`Stats`.

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> a = stats.update(stats.init(1), np.array([[0.0], [2.0]], np.float32))
      >>> b = stats.update(stats.init(1), np.array([[4.0]], np.float32))
      >>> s = stats.merge(a, b)
      >>> int(s.tokens), float(s.mean[0]), float(stats.covariance(s)[0, 0]), int(s.max_index[0])
      (3, 2.0, 4.0, 2)
    """
    a, b = _check_stats(a), _check_stats(b)
    if a.m2.shape != b.m2.shape:
        raise ValueError(f"a and b must have the same shape, got {a.m2.shape} and {b.m2.shape}")
    fdt = jnp.result_type(a.mean, b.mean)
    na, nb = jnp.asarray(a.tokens).astype(fdt), jnp.asarray(b.tokens).astype(fdt)
    n = na + nb
    delta = jnp.asarray(b.mean, fdt) - jnp.asarray(a.mean, fdt)
    mean = a.mean + delta * safe_div(nb, n)[..., None]
    m2 = a.m2 + b.m2 + delta[..., :, None] * delta[..., None, :] * safe_div(na * nb, n)[..., None, None]
    take_b = jnp.asarray(b.max_abs) > jnp.asarray(a.max_abs)
    return Stats(
        tokens=a.tokens + b.tokens,
        mean=mean,
        m2=m2,
        max_abs=jnp.where(take_b, b.max_abs, a.max_abs),
        max_index=jnp.where(take_b, b.max_index + jnp.asarray(a.tokens)[..., None], a.max_index),
        max_position=jnp.where(take_b, b.max_position, a.max_position),
        unit_sum=a.unit_sum + b.unit_sum,
        unit_sq_sum=a.unit_sq_sum + b.unit_sq_sum,
    )


def merge_over_axis(stats: Stats, axis_name) -> Stats:
    """Merge the per-device states of a sharded accumulation (inside ``jax.shard_map`` or ``pmap``).

    With N = Σ_k n_k over the devices k of ``axis_name``: m = Σ_k n_k m_k / N and
    M2 = Σ_k [M2_k + n_k (m_k − m)(m_k − m)ᵀ] (the parallel formula, by ``psum``), unit-row sums by ``psum``;
    maxima by an ``all_gather`` of the ``[*S, d]`` maxima, the first device holding the largest winning, its
    stream index shifted by the counts of the devices before it. The result is the state of the devices'
    streams concatenated in device order, replicated on every device.

    Args:
      stats: this device's state.
      axis_name: the mesh / pmap axis name to merge over.

    Returns:
      The merged :class:`Stats` (the same on every device).

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> x = np.arange(8.0, dtype=np.float32).reshape(1, 8, 1)  # 1 device here
      >>> s = jax.pmap(lambda x: stats.merge_over_axis(stats.update(stats.init(1), x), "i"), axis_name="i")(x)
      >>> int(s.tokens[0]), float(s.mean[0, 0])
      (8, 3.5)
    """
    stats = _check_stats(stats)
    fdt = stats.mean.dtype
    nk = stats.tokens.astype(fdt)
    n = jax.lax.psum(nk, axis_name)
    mean = safe_div(jax.lax.psum(nk[..., None] * stats.mean, axis_name), n[..., None])
    delta = stats.mean - mean
    m2 = jax.lax.psum(stats.m2 + nk[..., None, None] * delta[..., :, None] * delta[..., None, :], axis_name)
    devices = jax.lax.psum(1, axis_name)
    me = jax.lax.axis_index(axis_name)
    counts = jax.lax.psum(jax.nn.one_hot(me, devices, dtype=stats.tokens.dtype) * stats.tokens[..., None], axis_name)
    before = jnp.take_along_axis(
        jnp.cumsum(counts, axis=-1) - counts, jnp.broadcast_to(me, counts.shape[:-1])[..., None], -1
    )
    largest = jax.lax.pmax(stats.max_abs, axis_name)
    winner = jax.lax.pmin(jnp.where(stats.max_abs == largest, me, devices), axis_name)  # the first device at it
    mine = winner == me
    index = jax.lax.psum(jnp.where(mine, stats.max_index + before, 0), axis_name)
    return Stats(
        tokens=jax.lax.psum(stats.tokens, axis_name),
        mean=mean,
        m2=m2,
        max_abs=largest,
        max_index=jnp.where(jnp.isneginf(largest), -1, index),
        max_position=jnp.where(
            jnp.isneginf(largest), -1, jax.lax.psum(jnp.where(mine, stats.max_position, 0), axis_name)
        ),
        unit_sum=jax.lax.psum(stats.unit_sum, axis_name),
        unit_sq_sum=jax.lax.psum(stats.unit_sq_sum, axis_name),
    )


def save(stats: Stats, path) -> str:
    """Write ``stats`` to ``path`` as ``.npz`` (its arrays, dtypes kept), whole or not at all.

    Args:
      stats: a state.
      path: the file (``.npz`` is not appended).

    Returns:
      ``str(path)``.

    Examples:
      >>> import os, tempfile
      >>> from isojax import stats
      >>> path = stats.save(stats.init(3), os.path.join(tempfile.mkdtemp(), "s.npz"))
      >>> stats.load(path).m2.shape
      (3, 3)
    """
    stats = _check_stats(stats)
    path = str(path)
    part = path + ".part"
    with open(part, "wb") as f:
        arrays: dict[str, Any] = {k: np.asarray(v) for k, v in stats._asdict().items()}
        np.savez(f, **arrays)
    os.replace(part, path)
    return path


def load(path) -> Stats:
    """Read a state written by :func:`save` (numpy arrays, in the saved dtypes).

    Args:
      path: an ``.npz`` file from :func:`save`.

    Returns:
      The :class:`Stats` (``ValueError`` naming ``path`` if a field is missing).

    Examples:
      >>> import os, tempfile
      >>> import numpy as np
      >>> from isojax import stats
      >>> s = stats.update(stats.init(2), np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
      >>> loaded = stats.load(stats.save(s, os.path.join(tempfile.mkdtemp(), "s.npz")))
      >>> int(loaded.tokens), loaded.mean.tolist()
      (2, [2.0, 3.0])
    """
    with np.load(str(path)) as data:
        missing = [k for k in Stats._fields if k not in data]
        if missing:
            raise ValueError(f"path {str(path)!r} is not a saved isojax.stats.Stats: missing {missing}")
        return Stats(**{k: data[k] for k in Stats._fields})


# ----------------------------------------------------------------------------------------------------------
# Finalisers
# ----------------------------------------------------------------------------------------------------------
def _need(stats: Stats, minimum: int, what: str) -> Stats:
    stats = _check_stats(stats)
    if not isinstance(stats.tokens, jax.core.Tracer):
        fewest = int(np.min(np.asarray(stats.tokens)))
        if fewest < minimum:
            raise ValueError(f"stats must hold at least {minimum} token(s) for {what}, got {fewest}")
    return stats


def _finite(matrix):
    """Per matrix of ``[..., d, d]``: all entries finite (a state poisoned by a non-finite token under ``jit``)."""
    return jnp.all(jnp.isfinite(matrix), axis=(-2, -1))


def covariance(stats: Stats, *, ddof: int = 1):
    """Sample covariance ``M2 / (n − ddof)``, ``[*S, d, d]`` (``np.cov`` of all the real tokens folded in).

    Args:
      stats: a state with more than ``ddof`` tokens.
      ddof: 1 (default, as :func:`isojax.metrics.isoscore`) or 0.

    Returns:
      ``[*S, d, d]`` in the state's float dtype.

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> s = stats.update(stats.init(2), np.array([[0.0, 0.0], [2.0, 4.0]], np.float32))
      >>> np.asarray(stats.covariance(s)).tolist()
      [[2.0, 4.0], [4.0, 8.0]]
    """
    stats = _need(stats, ddof + 1, "a covariance")
    return stats.m2 / (stats.tokens - ddof).astype(stats.m2.dtype)[..., None, None]


def second_moment(stats: Stats):
    """Raw (uncentred) second moment ``E[x xᵀ] = (M2 + n m mᵀ) / n``, ``[*S, d, d]``.

    Args:
      stats: a state with at least one token.

    Returns:
      ``[*S, d, d]`` in the state's float dtype.

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> s = stats.update(stats.init(1), np.array([[1.0], [3.0]], np.float32))
      >>> float(stats.second_moment(s)[0, 0])
      5.0
    """
    stats = _need(stats, 1, "a second moment")
    n = stats.tokens.astype(stats.m2.dtype)[..., None, None]
    return stats.m2 / n + stats.mean[..., :, None] * stats.mean[..., None, :]


def isoscore(stats: Stats):
    """IsoScore (Rudman et al. 2022) of all the tokens folded in: ((tr C)² / ‖C‖_F² − 1) / (d − 1), C the
    covariance (ddof 1); equal to :func:`isojax.metrics.isoscore` of the same tokens in memory.

    Args:
      stats: a state with at least 2 tokens and d ≥ 2.

    Returns:
      ``[*S]`` scores in [0, 1].

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> cross = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], np.float32)
      >>> round(float(stats.isoscore(stats.update(stats.init(2), cross))), 4)
      1.0
    """
    cov = covariance(stats)
    trace, sq_norm = jnp.trace(cov, axis1=-2, axis2=-1), jnp.sum(cov * cov, axis=(-2, -1))
    return nan_unless(_finite(cov), isoscore_from_moments(trace, sq_norm, cov.shape[-1]))


def isoscore_star(stats: Stats, *, c0=None, zeta: float = 0.2):
    """IsoScore* of the shrunk covariance (1 − ζ)C + ζC0 (``C0 = I`` by default), as
    :func:`isojax.metrics.isoscore_star` of the same tokens.

    Args:
      stats: a state with at least 2 tokens.
      c0: optional ``[d, d]`` reference covariance.
      zeta: shrinkage weight in [0, 1] (traced).

    Returns:
      ``[*S]`` scores in [0, 1].

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> s = stats.update(stats.init(2), np.array([[-1.0, 0.0], [1.0, 0.0]], np.float32))
      >>> round(float(stats.isoscore_star(s, zeta=0.5)), 4)
      0.6
    """
    cov = covariance(stats)
    d = cov.shape[-1]
    zeta, zeta_ok = check_hyperparameter(zeta, "zeta", low=0.0, high=1.0)
    if c0 is None:
        trace, sq_norm = shrunk_to_identity(jnp.trace(cov, axis1=-2, axis2=-1), jnp.sum(cov * cov, (-2, -1)), d, zeta)
    else:
        trace, sq_norm = shrunk_moments(cov, check_square(c0, "c0", d).astype(cov.dtype), zeta)
    return nan_unless(_finite(cov) & zeta_ok, isoscore_from_moments(trace, sq_norm, d))


def _shares(stats: Stats, centered: bool):
    """Eigenvalue shares λ_i / Σ λ, descending, of M2 (centred) or of Σ x xᵀ (raw)."""
    stats = _need(stats, 2 if centered else 1, "a spectrum")
    matrix, ok = finite_matrix(stats.m2 if centered else second_moment(stats))  # no NaN into the eigensolver
    eigenvalues = jnp.clip(jnp.linalg.eigvalsh(matrix)[..., ::-1], 0)
    return nan_unless(ok, safe_div(eigenvalues, jnp.sum(eigenvalues, axis=-1, keepdims=True)))


def anisotropy(stats: Stats, *, k: int = 1, centered: bool = False):
    """σ_k² / Σ σ_i² of the matrix of all tokens folded in (Razzhigaev et al. 2024): raw (eigenvalues of Σ x xᵀ)
    or centred (eigenvalues of the covariance), as :func:`isojax.metrics.anisotropy` (``center=centered``).

    Args:
      stats: a state (2 tokens or more when centred).
      k: the component, ``1 <= k <= d`` (static).
      centered: the covariance instead of the raw second moment.

    Returns:
      ``[*S]`` values in [0, 1].

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> s = stats.update(stats.init(2), np.array([[3.0, 0.0], [0.0, 4.0]], np.float32))
      >>> round(float(stats.anisotropy(s)), 4), round(float(stats.anisotropy(s, k=2)), 4)
      (0.64, 0.36)
    """
    check_positive_int(k, "k", upper=stats.mean.shape[-1])
    return _shares(stats, centered)[..., k - 1]


def explained_variance(stats: Stats, k: int = 1, *, centered: bool = False):
    """EV_k = Σ_{i≤k} σ_i² / Σ σ_i² of all the tokens folded in, as :func:`isojax.metrics.explained_variance`
    (``center=centered``).

    Args:
      stats: a state.
      k: leading directions, ``1 <= k <= d`` (static).
      centered: the covariance instead of the raw second moment (the PCA explained-variance ratio).

    Returns:
      ``[*S]`` values in [0, 1].

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> s = stats.update(stats.init(2), np.array([[3.0, 0.0], [0.0, 4.0]], np.float32))
      >>> round(float(stats.explained_variance(s, 2)), 4)
      1.0
    """
    check_positive_int(k, "k", upper=stats.mean.shape[-1])
    return jnp.sum(_shares(stats, centered)[..., :k], axis=-1)


def mean_cosine(stats: Stats):
    """Mean cosine over all pairs i ≠ j of the tokens folded in (Ethayarajh 2019; Godey et al. 2024 sample it):
    (‖Σ x̂‖² − Σ ‖x̂‖²) / (N(N − 1)), as :func:`isojax.metrics.token_uniformity` of the same tokens.

    Args:
      stats: a state with at least 2 tokens.

    Returns:
      ``[*S]`` values in [−1, 1].

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> s = stats.update(stats.init(2), np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], np.float32))
      >>> round(float(stats.mean_cosine(s)), 4), round(float((0 + 2 * 2 ** -0.5) / 3), 4)
      (0.4714, 0.4714)
    """
    stats = _need(stats, 2, "a mean cosine over pairs")
    return jnp.sum(pair_contributions(stats.unit_sum, stats.unit_sq_sum, stats.tokens), axis=-1)


def rogue_dimensions(stats: Stats) -> RogueDimensions:
    """Rogue dimensions (Timkey & van Schijndel 2021) over all pairs i ≠ j of the tokens folded in, exactly:
    CC_k = ((Σ x̂_k)² − Σ x̂_k²) / (N(N − 1)), as :func:`isojax.metrics.rogue_dimensions` (whose
    ``standardized_cosine`` needs the tokens; NaN here).

    Args:
      stats: a state with at least 2 tokens.

    Returns:
      :class:`RogueDimensions`.

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> x = np.array([[10.0, 1.0], [10.0, -1.0], [10.0, 0.5]], np.float32)
      >>> r = stats.rogue_dimensions(stats.update(stats.init(2), x))
      >>> r.top1_share > 0.9
      Array(True, dtype=bool)
    """
    stats = _need(stats, 2, "rogue dimensions")
    contributions = pair_contributions(stats.unit_sum, stats.unit_sq_sum, stats.tokens)
    summary = rogue_summary(contributions, jnp.full(stats.tokens.shape, jnp.nan, contributions.dtype))
    return nan_unless(jnp.all(jnp.isfinite(contributions), axis=-1), summary)


def massive_activation(stats: Stats) -> MassiveActivation:
    """The largest ``|x|`` of all the tokens folded in (Sun et al. 2024, "Massive activations"), with its dimension,
    stream index and position; ``ratio`` is NaN (a median needs the tokens: use
    :func:`isojax.metrics.massive_activations` per batch).

    Args:
      stats: a state with at least 1 token.

    Returns:
      :class:`MassiveActivation` of shape ``[*S]``.

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> x = np.array([[[0.5, -1.0], [2.0, -300.0]]], np.float32)  # [B=1, n=2, d=2]
      >>> m = stats.massive_activation(stats.update(stats.init(2), x))
      >>> float(m.value), int(m.dimension), int(m.position)
      (300.0, 1, 1)
    """
    stats = _need(stats, 1, "a largest activation")
    dim = jnp.argmax(stats.max_abs, axis=-1)

    def at(a):
        return jnp.take_along_axis(a, dim[..., None], axis=-1)[..., 0]

    return MassiveActivation(
        value=at(stats.max_abs),
        dimension=dim,
        token=at(stats.max_index),
        position=at(stats.max_position),
        ratio=jnp.full(dim.shape, jnp.nan, stats.mean.dtype),
    )


def fit_centering(stats: Stats):
    """The :class:`isojax.calibrate.CenteringState` (the mean) of all the tokens folded in.

    Args:
      stats: a state with at least 1 token.

    Returns:
      ``CenteringState(mean [*S, d])``, as :func:`isojax.calibrate.fit_centering` of the same tokens.

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> s = stats.update(stats.init(2), np.array([[1.0, 2.0], [3.0, 6.0]], np.float32))
      >>> np.asarray(stats.fit_centering(s).mean).tolist()
      [2.0, 4.0]
    """
    from isojax.calibrate.centering import CenteringState

    return CenteringState(mean=_need(stats, 1, "a mean").mean)


def fit_whitening(stats: Stats, *, k: int | None = None, eps: float | None = None):
    """BERT-whitening fitted on all the tokens folded in: the :class:`isojax.calibrate.WhiteningState` that
    :func:`isojax.calibrate.fit_whitening` gives for the same tokens (same eigendecomposition, signs and ``eps``).

    Args:
      stats: a state with at least 2 tokens.
      k: whitened dimensions kept (default d, static).
      eps: eigenvalue floor relative to the largest (default the float dtype's machine epsilon; traced).

    Returns:
      ``WhiteningState(mean [*S, d], W [*S, d, k])``; ``(x - mean) @ W`` has identity covariance on those tokens.

    Examples:
      >>> import numpy as np
      >>> from isojax import stats
      >>> x = np.array([[2.0, 1.0], [-2.0, 1.0], [2.0, -1.0], [-2.0, -1.0]], np.float32) * np.sqrt(0.75)
      >>> state = stats.fit_whitening(stats.update(stats.init(2), x), eps=0.0)
      >>> np.allclose(state.W, [[0.5, 0.0], [0.0, 1.0]], atol=1e-5)
      True
    """
    from isojax.calibrate.whitening import whitening_from_covariance

    cov = covariance(stats)
    d = cov.shape[-1]
    k = d if k is None else k
    if not isinstance(k, int) or not 1 <= k <= d:
        raise ValueError(f"k must be an int in [1, d={d}], got {k!r}")
    eps, eps_ok = check_hyperparameter(float(jnp.finfo(cov.dtype).eps) if eps is None else eps, "eps", low=0.0)
    return whitening_from_covariance(stats.mean, cov, k=k, eps=eps, eps_ok=eps_ok)


def streamed_covariance(rows: Iterable[np.ndarray], name: str) -> np.ndarray:
    """Covariance (ddof 1) of all the rows of a stream of host arrays, in one pass of :func:`update` in float64
    whatever the x64 setting; chunks are padded to a power of two of rows, so the jitted update compiles once per
    size class.

    Args:
      rows: arrays ``[n_i, d]`` (a model's representations of one batch after another).
      name: what the rows are, for the error message.

    Returns:
      ``[d, d]`` float64 numpy array; ``ValueError`` naming ``name`` when there are fewer than 2 rows.

    Examples:
      >>> x = np.random.default_rng(0).standard_normal((10, 3))
      >>> bool(np.allclose(streamed_covariance([x[:3], x[3:]], "x"), np.cov(x, rowvar=False)))
      True
    """
    jitted = jax.jit(update)
    state: Stats | None = None
    for x in rows:  # pulled outside the x64 context: the producer (a model's forward pass) keeps its own dtypes
        x = np.asarray(x, np.float64)
        size = 1 << max(len(x) - 1, 0).bit_length()
        padded = np.zeros((size, x.shape[-1]))
        padded[: len(x)] = x
        with jax.enable_x64(True):
            state = jitted(init(x.shape[-1]) if state is None else state, padded, np.arange(size) < len(x))
    count = 0 if state is None else int(state.tokens)
    if state is None or count < 2:
        raise ValueError(f"the covariance of {name} needs at least 2 rows, got {count}")
    with jax.enable_x64(True):
        return np.asarray(covariance(state))
