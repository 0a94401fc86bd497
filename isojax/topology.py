"""0-dimensional persistent homology of point clouds: barcodes, persistent entropy, feature selection.

The 0-dim Vietoris–Rips barcode of n points has one never-dying component and n − 1 finite bars
born at 0; their death times are the edge lengths of the Euclidean minimum spanning tree (MST).
:func:`zero_dim_barcode` finds the MST with Prim's algorithm (``lax.fori_loop``, O(n²) work after
one Gram matmul) on stop-gradient distances and then recomputes the chosen edge lengths from ``x``,
so the bars are differentiable in ``x`` almost everywhere (the gradient of a bar moves its two
endpoints apart; coincident endpoints get a zero gradient). This is the differentiability of
persistence barcodes used by shrink-the-longest-persistent-entropy §3 (Leygonie et al.).

Functions follow isojax's conventions: ``x`` is ``[..., n, d]``, ``mask`` is ``[..., n]``
(true = real point), bar arrays are ``[..., n − 1]`` with an optional bar mask; everything works
under ``jit``, ``vmap`` and ``grad``.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from isojax._numeric import promote_float32, safe_div, safe_norm
from isojax._validate import check_float, check_mask, check_points
from isojax.metrics import _squared_distances

__all__ = [
    "zero_dim_barcode",
    "barcode_mask",
    "persistent_entropy",
    "select_prominent",
    "persistent_entropy_loss",
]


def _mst_parents(sq, real):
    """Prim's algorithm on one cloud: ``sq`` ``[n, n]`` squared distances, ``real`` ``[n]`` bool.

    Returns ``(parent [n] int, is_edge [n] bool)``: every real point except the root (the first
    real point) joins the tree through the edge (j, parent[j]). Padding points are kept at the
    largest finite distance, so they join last and are flagged ``is_edge = False``.
    """
    n = sq.shape[-1]
    far = jnp.finfo(sq.dtype).max
    sq = jnp.where(real[:, None] & real[None, :], sq, far)
    root = jnp.argmax(real)
    in_tree = jnp.zeros(n, bool).at[root].set(True)
    parent = jnp.full(n, root)

    def add_nearest(_, carry):
        in_tree, best, parent = carry
        j = jnp.argmin(jnp.where(in_tree, jnp.inf, best))
        in_tree = in_tree.at[j].set(True)
        row = sq[j]
        closer = (row < best) & ~in_tree
        return in_tree, jnp.where(closer, row, best), jnp.where(closer, j, parent)

    _, _, parent = jax.lax.fori_loop(0, n - 1, add_nearest, (in_tree, sq[root], parent))
    is_edge = real & (jnp.arange(n) != root)
    return parent, is_edge


def _barcode(x, real):
    """Unvalidated core of :func:`zero_dim_barcode` for ``x`` ``[..., n, d]`` and ``real`` ``[..., n]``."""
    n = x.shape[-2]
    # Distances only choose the edges: translate to the real points' mean (less cancellation in the
    # Gram-matrix formula) and stop gradients; the chosen lengths are recomputed exactly below.
    realf = real.astype(x.dtype)[..., None]
    mean = safe_div(jnp.sum(x * realf, axis=-2, keepdims=True), jnp.sum(realf, axis=-2, keepdims=True))
    sq = jax.lax.stop_gradient(_squared_distances((x - mean) * realf))
    parent, is_edge = jnp.vectorize(_mst_parents, signature="(n,n),(n)->(n),(n)")(sq, real)
    partner = jnp.take_along_axis(x, parent[..., None], axis=-2)
    lengths = jnp.where(is_edge, safe_norm(x - partner), 0)
    # n − 1 real edges at most; the dropped slot is a zero (the root's or a padding point's).
    return -jnp.sort(-lengths, axis=-1)[..., : n - 1]


@jax.jit
def zero_dim_barcode(x, *, mask=None):
    """Finite bars of the 0-dim Vietoris–Rips barcode: the Euclidean MST edge lengths.

    Every bar is born at 0 and dies at the length of one MST edge (the scale at which two
    components merge); the never-dying component is left out. Bars are returned sorted in
    descending order. With a mask, a cloud with r real points has r − 1 bars followed by
    n − r zeros (see :func:`barcode_mask`). Differentiable in ``x`` through the chosen edges.

    Args:
      x: ``[..., n, d]`` float points, n ≥ 2.
      mask: optional ``[..., n]`` bool, true = real point.

    Returns:
      ``[..., n − 1]`` bar lengths (death times), descending.
    """
    x = check_points(x, "x", min_n=2)
    mask = check_mask(mask, x)
    x = promote_float32(x)
    real = jnp.ones(x.shape[:-1], bool) if mask is None else mask
    return _barcode(x, real)


def barcode_mask(mask):
    """Bool ``[..., n − 1]`` mask of the real bars of :func:`zero_dim_barcode` for a point mask.

    A cloud with r real points has r − 1 finite bars, which come first in the descending output.
    """
    mask = jnp.asarray(mask)
    if mask.ndim < 1 or mask.shape[-1] < 2:
        raise ValueError(f"mask must have shape [..., n] with n >= 2, got {mask.shape}")
    if not (mask.dtype == jnp.bool_ or jnp.issubdtype(mask.dtype, jnp.integer)):
        raise TypeError(f"mask must be boolean or integer 0/1, got {mask.dtype}")
    count = jnp.sum(mask.astype(bool), axis=-1, keepdims=True)
    return jnp.arange(mask.shape[-1] - 1) < count - 1


def _check_bars(bars, mask):
    bars = check_float(bars, "bars")
    if bars.ndim < 1:
        raise ValueError(f"bars must have shape [..., m], got shape {bars.shape}")
    if mask is None:
        return bars, jnp.ones(bars.shape, bool)
    mask = jnp.asarray(mask)
    if mask.shape != bars.shape:
        raise ValueError(f"mask must have the shape of bars {bars.shape}, got {mask.shape}")
    if mask.dtype != jnp.bool_:
        raise TypeError(f"mask must be boolean, got {mask.dtype}")
    return bars, mask


def _entropy(bars, valid):
    lengths = jnp.where(valid, bars, 0)
    p = safe_div(lengths, jnp.sum(lengths, axis=-1, keepdims=True))
    positive = p > 0
    return -jnp.sum(jnp.where(positive, p * jnp.log(jnp.where(positive, p, 1)), 0), axis=-1)


@jax.jit
def persistent_entropy(bars, *, mask=None):
    """Persistent entropy H = −Σ_i p_i log p_i, p_i = l_i / Σ_j l_j, of the bars where ``mask``.

    shrink-the-longest-persistent-entropy §3 (Atienza et al. 2019). H ∈ [0, log m] for m bars,
    maximal when all bars are equal. Zero-length bars contribute 0; an all-zero barcode has H = 0
    (with zero, finite gradient).

    Args:
      bars: ``[..., m]`` non-negative bar lengths (e.g. from :func:`zero_dim_barcode`).
      mask: optional ``[..., m]`` bool, true = the bar counts.

    Returns:
      ``[...]`` entropies (natural log).
    """
    bars, mask = _check_bars(bars, mask)
    return _entropy(bars, mask)


def _prominent(bars, valid):
    """Unvalidated core of :func:`select_prominent` (no gradient)."""
    m = bars.shape[-1]
    if m == 1:  # a single bar is the longest one
        return valid
    bars = jax.lax.stop_gradient(bars)
    order = jnp.argsort(jnp.where(valid, -bars, jnp.inf), axis=-1, stable=True)
    lengths = jnp.take_along_axis(jnp.where(valid, bars, 0), order, axis=-1)  # descending, padding last
    count = jnp.sum(valid, axis=-1, keepdims=True)
    positive = lengths > 0
    plogp = jnp.where(positive, lengths * jnp.log(jnp.where(positive, lengths, 1)), 0)

    def after(a):  # after(a)[..., i] = Σ_{q > i} a[..., q]
        suffix = jnp.cumsum(a[..., ::-1], axis=-1)[..., ::-1]
        return jnp.concatenate([suffix[..., 1:], jnp.zeros_like(a[..., :1])], axis=-1)

    # Neutralising the i bars l_2..l_{i+1} leaves l_1 and l_{i+2}..l_m (total R_i); the
    # entropy-maximising common length of the neutralised bars is their weighted geometric mean
    # R_i / exp(H_rest) = exp(Σ_rest l log l / R_i), so S_i = R_i + i·exp(Σ_rest l log l / R_i).
    rest_total = lengths[..., :1] + after(lengths)
    rest_plogp = plogp[..., :1] + after(plogp)
    geometric = jnp.where(rest_total > 0, jnp.exp(safe_div(rest_plogp, rest_total)), 0)
    index = jnp.arange(m)
    total = rest_total + index * geometric
    tie = 64 * jnp.finfo(total.dtype).eps * total[..., :-1]  # rounding noise, e.g. for equal bars
    rises = (total[..., 1:] - total[..., :-1] > tie) & (index[1:] < count)
    k = jnp.where(jnp.any(rises, axis=-1, keepdims=True), jnp.argmax(rises, axis=-1, keepdims=True) + 1, count)
    rank = jnp.argsort(order, axis=-1)  # position of each bar in the descending order
    return rank < k


@jax.jit
def select_prominent(bars, *, mask=None):
    """Atienza et al. (2019) selection of the prominent bars (topological features), corrected.

    Sort the bars l_1 ≥ … ≥ l_m. The longest bar is always a feature. For i = 1, 2, … neutralise
    the bars l_2..l_{i+1} — replace them by the common length that maximises the entropy of the
    barcode, which keeps l_1 and l_{i+2}..l_m — and let S_i be the total length of the result
    (S_0 = Σ l). Neutralising a feature shortens the barcode; the first i with S_i > S_{i−1}
    (the authors' C = S_{i−1}/S_i < 1) shows that l_{i+1} is noise, and the features are
    l_1..l_i. If no step lengthens the barcode (e.g. all bars equal) every bar is a feature.
    Lengthenings below 64 ulps of S_{i−1} count as ties (rounding noise), not as rises.
    Like Atienza et al., the rule assumes that the barcode holds noise (at least one bar inside a
    cluster); when every bar joins two single-point clusters it may stop early.

    Differences from the code of shrink-the-longest-persistent-entropy (``prominient_features``):
    (1) that code also marks l_{i+1}, the first noise bar (off by one: on c clean clusters of
    enough points it returns c bars instead of the c − 1 bars joining the clusters); (2) it fails
    with ≤ 3 bars, while this function handles any m ≥ 1 (m = 1: the single bar is selected);
    (3) its truncation loop with the bound Q = ⌈a·m(a − 1 − ln a)/(a − 1)²⌉, a = l_m/l_1, is
    left out: when the smallest bar is tiny, Q is small and the loop cuts true features (on 3-8
    clean clusters of a few points each the authors' code returns 2 bars). The selection is
    piecewise constant, so it carries no gradient.

    Args:
      bars: ``[..., m]`` non-negative bar lengths, in any order.
      mask: optional ``[..., m]`` bool, true = the bar takes part (see :func:`barcode_mask`).

    Returns:
      ``[..., m]`` bool, true = prominent bar (always false where ``mask`` is false).
    """
    bars, mask = _check_bars(bars, mask)
    return _prominent(bars, mask)


def persistent_entropy_loss(
    x,
    labels=None,
    *,
    mask=None,
    num_classes: int | None = None,
    bars: str = "selected",
    in_cluster_weight: float = 0.0,
):
    """Persistent-entropy regulariser of shrink-the-longest-persistent-entropy (§3-4), to minimise.

    For the cloud of each class c (all real points when ``labels`` is None):
    R_c = −H(B_c) + w · mean(in-cluster bars of c), where H is :func:`persistent_entropy` of the
    0-dim barcode restricted to the prominent bars (``bars="selected"``, see
    :func:`select_prominent`) or to all bars (``bars="all"``), and the in-cluster bars are the
    non-selected ones. The loss is Σ_c R_c; a class with fewer than 2 points contributes 0.
    Minimising it maximises the entropy of the distances between clusters (spreading the clusters
    evenly) and, with w > 0, shrinks the clusters. The authors' code adds 0.05·mean(in-cluster) to
    the entropy that it maximises, i.e. it grows the clusters although the text says it shrinks
    them; here the in-cluster term is minimised.

    Args:
      x: ``[..., n, d]`` float points (e.g. the [CLS] embeddings of a batch), n ≥ 2.
      labels: optional ``[..., n]`` integer class labels in [0, num_classes) (checked when concrete;
        under tracing, labels outside the range belong to no class).
      mask: optional ``[..., n]`` bool, true = real point.
      num_classes: number of classes (static); required under ``jit`` when ``labels`` is given,
        otherwise taken from the largest label.
      bars: ``"selected"`` or ``"all"``.
      in_cluster_weight: w ≥ 0; only with ``bars="selected"``.

    Returns:
      ``[...]`` loss values.
    """
    x = check_points(x, "x", min_n=2)
    mask = check_mask(mask, x)
    if bars not in ("selected", "all"):
        raise ValueError(f"bars must be 'selected' or 'all', got {bars!r}")
    if isinstance(in_cluster_weight, bool) or not isinstance(in_cluster_weight, (int, float)) or in_cluster_weight < 0:
        raise ValueError(f"in_cluster_weight must be a non-negative number, got {in_cluster_weight!r}")
    if bars == "all" and in_cluster_weight != 0:
        raise ValueError("in_cluster_weight needs bars='selected' (the in-cluster bars are the non-selected ones)")
    if labels is not None:
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
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        if concrete is not None and not np.all((concrete >= 0) & (concrete < num_classes)):
            raise ValueError(f"labels must lie in [0, num_classes) = [0, {num_classes})")
    return _entropy_loss(x, mask, labels, num_classes=num_classes, bars=bars, in_cluster_weight=float(in_cluster_weight))


@partial(jax.jit, static_argnames=("num_classes", "bars", "in_cluster_weight"))
def _entropy_loss(x, mask, labels, *, num_classes, bars, in_cluster_weight):
    """Unvalidated core of :func:`persistent_entropy_loss`."""
    x = promote_float32(x)
    real = jnp.ones(x.shape[:-1], bool) if mask is None else mask
    if labels is not None:
        real = real[..., None, :] & (labels[..., None, :] == jnp.arange(num_classes)[:, None])  # [..., C, n]
        x = jnp.broadcast_to(x[..., None, :, :], real.shape + x.shape[-1:])
    barcode = _barcode(x, real)
    valid = barcode_mask(real)
    if bars == "all":
        loss = -_entropy(barcode, valid)
    else:
        selected = _prominent(barcode, valid)
        in_cluster = valid & ~selected
        mean_in_cluster = safe_div(jnp.sum(jnp.where(in_cluster, barcode, 0), axis=-1), jnp.sum(in_cluster, axis=-1))
        loss = -_entropy(barcode, selected) + in_cluster_weight * mean_in_cluster
    return loss if labels is None else jnp.sum(loss, axis=-1)
