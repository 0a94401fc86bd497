"""0-dimensional persistent homology of point clouds: barcodes, persistent entropy, feature selection.

The 0-dim Vietoris–Rips barcode of n points has one never-dying component and n − 1 finite bars
born at 0; their death times are the edge lengths of the Euclidean minimum spanning tree (MST).
:func:`zero_dim_barcode` finds the MST with Prim's algorithm (``lax.fori_loop``, O(n²) work after
one Gram matmul) on stop-gradient distances and then recomputes the chosen edge lengths from ``x``,
so the bars are differentiable in ``x`` almost everywhere (the gradient of a bar moves its two
endpoints apart; coincident endpoints get a zero gradient). This is the differentiability of
persistence barcodes used by shrink-the-longest-persistent-entropy §3 (Leygonie et al.).

Functions follow isojax's conventions (see :mod:`isojax.metrics`): plain functions that the caller
jits, with shape-like arguments (``num_classes``, the ``bars`` mode) static and the float
``in_cluster_weight`` traced (a traced negative value gives NaN); ``x`` is ``[..., n, d]``, ``mask`` is
``[..., n]`` (true = real point), bar arrays are ``[..., n − 1]`` with an optional bar mask; one value
per cloud, leading axes never reduced; everything works under ``jit``, ``vmap`` and ``grad``.

Bad input follows the rule of :mod:`isojax.metrics`: padding points never influence the bars or their
gradients, a NaN or inf in a real point raises ``ValueError`` (concrete) or gives NaN bars and losses (traced).
The barcode is scale-equivariant and the losses with ``in_cluster_weight=0`` scale-invariant at any finite
float32 scale (1e±20 included): the points are divided by a power of two near their largest entry before any
squared distance, and the bars multiplied back (exact).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from isojax._numeric import HIGHEST, promote_float32, safe_div, safe_norm
from isojax._stats import class_masks, masked_mean, select_rows, squared_distances, unit_scale
from isojax._validate import (
    check_choice,
    check_cloud,
    check_float,
    check_hyperparameter,
    check_labels,
    check_mask_values,
    nan_unless,
)

__all__ = [
    "zero_dim_barcode",
    "barcode_edges",
    "barcode_mask",
    "persistent_entropy",
    "select_prominent",
    "persistent_entropy_loss",
    "persistent_entropy_loss_grad",
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
    _, _, _, parent = jax.lax.fori_loop(0, n - 1, _add_nearest, (sq, in_tree, sq[root], parent))
    is_edge = real & (jnp.arange(n) != root)
    return parent, is_edge


def _add_nearest(_, carry):
    """One step of Prim's algorithm (a module-level body, so that eager calls reuse the traced loop)."""
    sq, in_tree, best, parent = carry
    j = jnp.argmin(jnp.where(in_tree, jnp.inf, best))
    in_tree = in_tree.at[j].set(True)
    row = sq[j]
    closer = (row < best) & ~in_tree
    return sq, in_tree, jnp.where(closer, row, best), jnp.where(closer, j, parent)


def _edges(x, real):
    """Unvalidated core of :func:`barcode_edges` for ``x`` ``[..., n, d]`` and ``real`` ``[..., n]``."""
    n = x.shape[-2]
    # Padding points are zeroed (never in any arithmetic) and the cloud divided by a power of two s (exact, no
    # gradient) so that squared distances neither overflow nor underflow; the lengths are multiplied back by s.
    x, scale = unit_scale(select_rows(x, real), real)
    # Distances only choose the edges: translate to the real points' mean (less cancellation in the
    # Gram-matrix formula) and stop gradients; the chosen lengths are recomputed exactly below.
    centered = select_rows(x - masked_mean(x, real)[..., None, :], real)
    sq = jax.lax.stop_gradient(squared_distances(centered))
    parent, is_edge = jnp.vectorize(_mst_parents, signature="(n,n),(n)->(n),(n)")(sq, real)
    partner = jnp.take_along_axis(x, parent[..., None], axis=-2)
    lengths = jnp.where(is_edge, safe_norm(x - partner), 0) * scale[..., None]
    # n − 1 real edges at most; the dropped slot is a zero (the root's or a padding point's).
    child = jnp.argsort(-lengths, axis=-1, stable=True)[..., : n - 1]
    parent = jnp.where(jnp.take_along_axis(is_edge, child, axis=-1), jnp.take_along_axis(parent, child, axis=-1), child)
    return jnp.stack([child, parent], axis=-1), jnp.take_along_axis(lengths, child, axis=-1)


def _real(x, mask):
    return jnp.ones(x.shape[:-1], bool) if mask is None else mask


def zero_dim_barcode(x, *, mask=None):
    """Finite bars of the 0-dim Vietoris–Rips barcode: the Euclidean MST edge lengths.

    Every bar is born at 0 and dies at the length of one MST edge (the scale at which two
    components merge); the never-dying component is left out. Bars are returned sorted in
    descending order. With a mask, a cloud with r real points has r − 1 bars followed by
    n − r zeros (see :func:`barcode_mask`). Differentiable in ``x`` through the chosen edges
    (:func:`barcode_edges` names them).

    Args:
      x: ``[..., n, d]`` float points, n ≥ 2.
      mask: optional ``[..., n]`` bool, true = real point.

    Returns:
      ``[..., n − 1]`` bar lengths (death times), descending, float32 (or ``x``'s dtype if wider).

    Examples:
      Points 0, 1 and 3 on a line: the minimum spanning tree has edges of length 2 and 1.

      >>> import numpy as np
      >>> from isojax import topology
      >>> bars = topology.zero_dim_barcode(np.array([[0.0], [1.0], [3.0]], np.float32))
      >>> np.round(np.asarray(bars), 4).tolist()
      [2.0, 1.0]
    """
    return barcode_edges(x, mask=mask)[1]


def barcode_edges(x, *, mask=None):
    """The MST edges that kill the finite bars of the 0-dim barcode, and the bars.

    Bar k dies when the points ``edges[..., k, 0]`` and ``edges[..., k, 1]`` join (an MST edge), at
    ``bars[..., k] = ‖x_i − x_j‖`` for that pair; bars are in descending order, as in
    :func:`zero_dim_barcode`. The slots beyond a masked cloud's r − 1 real bars hold the self-pair
    (i, i) with length 0. The gradient of a bar is ∂‖x_i − x_j‖/∂x_i = (x_i − x_j)/‖x_i − x_j‖ =
    −∂/∂x_j, and 0 for coincident points (the edge choice is piecewise constant).

    Args:
      x: ``[..., n, d]`` float points, n ≥ 2.
      mask: optional ``[..., n]`` bool, true = real point.

    Returns:
      ``(edges, bars)``: ``[..., n − 1, 2]`` int32 point indices and ``[..., n − 1]`` lengths, descending
      (float32, or ``x``'s dtype if wider).

    Examples:
      >>> import numpy as np
      >>> from isojax import topology
      >>> import jax
      >>> edges, bars = jax.jit(topology.barcode_edges)(np.array([[0.0], [1.0], [3.0]], np.float32))
      >>> [sorted(edge) for edge in edges.tolist()], np.round(np.asarray(bars), 4).tolist()
      ([[1, 2], [0, 1]], [2.0, 1.0])
    """
    x, mask, ok = check_cloud(x, mask, min_n=2, count_real=False)  # fewer real points: an empty barcode
    return nan_unless(ok, _edges(promote_float32(x), _real(x, mask)))


def barcode_mask(mask):
    """Bool ``[..., n − 1]`` mask of the real bars of :func:`zero_dim_barcode` for a point mask.

    A cloud with r real points has r − 1 finite bars, which come first in the descending output.

    Args:
      mask: ``[..., n]`` bool (or 0/1 integer) point mask, n ≥ 2, true = real point.

    Returns:
      ``[..., n − 1]`` bool, true for the first r − 1 slots.

    Examples:
      >>> import numpy as np
      >>> from isojax import topology
      >>> topology.barcode_mask(np.array([True, True, True, False])).tolist()
      [True, True, False]
    """
    mask = jnp.asarray(mask)
    if mask.ndim < 1 or mask.shape[-1] < 2:
        raise ValueError(f"mask must have shape [..., n] with n >= 2, got {mask.shape}")
    count = jnp.sum(check_mask_values(mask), axis=-1, keepdims=True)
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


def persistent_entropy(bars, *, mask=None):
    """Persistent entropy H = −Σ_i p_i log p_i, p_i = l_i / Σ_j l_j, of the bars where ``mask``.

    shrink-the-longest-persistent-entropy §3 (Atienza et al. 2019). H ∈ [0, log m] for m bars,
    maximal when all bars are equal. Zero-length bars contribute 0; an all-zero barcode has H = 0
    (with zero, finite gradient).

    Args:
      bars: ``[..., m]`` non-negative bar lengths (e.g. from :func:`zero_dim_barcode`).
      mask: optional ``[..., m]`` bool, true = the bar counts.

    Returns:
      ``[...]`` entropies (natural log), in ``bars``' dtype.

    Examples:
      Two equal bars: ``H = log 2``; one bar: ``H = 0``.

      >>> import numpy as np
      >>> from isojax import topology
      >>> round(float(topology.persistent_entropy(np.array([1.0, 1.0], np.float32))), 4), round(float(np.log(2)), 4)
      (0.6931, 0.6931)
      >>> bool(np.isclose(topology.persistent_entropy(np.array([1.0, 0.0], np.float32)), 0.0))
      True
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
    lengths = safe_div(lengths, lengths[..., :1])  # the rule is scale-free: l / l_1 keeps the sums out of underflow
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


def select_prominent(bars, *, mask=None):
    """Atienza et al. (2019) selection of the prominent bars (topological features), corrected.

    Sort the bars l_1 ≥ … ≥ l_m. The longest bar is always a feature. For i = 1, 2, … neutralise
    the bars l_2..l_{i+1} — replace them by the common length that maximises the entropy of the
    barcode, which keeps l_1 and l_{i+2}..l_m — and let S_i be the total length of the result
    (S_0 = Σ l). Neutralising a feature shortens the barcode; the first i with S_i > S_{i−1}
    (the authors' C = S_{i−1}/S_i < 1) shows that l_{i+1} is noise, and the features are
    l_1..l_i. If no step lengthens the barcode (e.g. all bars equal) every bar is a feature.
    Lengthenings below 64 ulps of S_{i−1} count as ties (rounding noise), not as rises. The rule does not depend
    on the bars' scale; it runs on l / l_1, so bars as short as float32's smallest normal number decide alike.
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

    Examples:
      One long bar (between two clusters) and three short ones (inside them): neutralising the second bar already
      lengthens the barcode (``S_1 = 10.2 + exp((10 ln 10 + 0.2 ln 0.1) / 10.2) ≈ 19.3 > S_0 = 10.3``), so only the
      long bar is a feature.

      >>> import numpy as np
      >>> from isojax import topology
      >>> topology.select_prominent(np.array([10.0, 0.1, 0.1, 0.1], np.float32)).tolist()
      [True, False, False, False]
    """
    bars, mask = _check_bars(bars, mask)
    return _prominent(bars, mask)


def _loss_inputs(x, labels, mask, num_classes, bars, in_cluster_weight):
    """Validate the arguments of :func:`persistent_entropy_loss`; return ``(clouds [..., (C,) n, d],
    real [..., (C,) n], in_cluster_weight, ok)`` with one cloud per class when ``labels`` is given (``ok``: the
    points are finite and ``in_cluster_weight`` in range, see :func:`isojax._validate.check_cloud`)."""
    x, mask, ok = check_cloud(x, mask, min_n=2, count_real=False)  # fewer real points: an empty barcode
    check_choice(bars, "bars", ("selected", "all"))
    weight, in_range = check_hyperparameter(in_cluster_weight, "in_cluster_weight", low=0.0)
    if bars == "all":
        if not isinstance(weight, jax.core.Tracer) and float(weight) != 0:
            raise ValueError("in_cluster_weight needs bars='selected' (the in-cluster bars are the non-selected ones)")
        in_range = in_range & (weight == 0)
    in_range = ok & in_range
    x = promote_float32(x)
    if labels is None:
        return x, _real(x, mask), weight, in_range
    labels, num_classes = check_labels(labels, x, num_classes)
    real = class_masks(mask, labels, num_classes)  # [..., C, n]
    return jnp.broadcast_to(x[..., None, :, :], real.shape + x.shape[-1:]), real, weight, in_range


def _entropy_and_in_cluster_bars(barcode, valid, bars):
    """Bool masks ``[..., m]`` of the bars whose entropy the loss takes and of the in-cluster bars."""
    if bars == "all":
        return valid, jnp.zeros_like(valid)
    selected = _prominent(barcode, valid)
    return selected, valid & ~selected


def persistent_entropy_loss(
    x, labels=None, *, mask=None, num_classes: int | None = None, bars: str = "selected", in_cluster_weight=0.0
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
    them; here the in-cluster term is minimised. A whole-batch quantity: one value per cloud ``[...]``.
    Its closed-form gradient is :func:`persistent_entropy_loss_grad`.

    Args:
      x: ``[..., n, d]`` float points (e.g. the [CLS] embeddings of a batch), n ≥ 2.
      labels: optional ``[..., n]`` integer class labels in [0, num_classes) (checked when concrete;
        under tracing, labels outside the range belong to no class).
      mask: optional ``[..., n]`` bool, true = real point.
      num_classes: number of classes (static); required under ``jit`` when ``labels`` is given,
        otherwise taken from the largest label.
      bars: ``"selected"`` or ``"all"`` (static).
      in_cluster_weight: w ≥ 0 (traced; a traced negative w gives NaN); only with ``bars="selected"``.

    Returns:
      ``[...]`` loss values, float32 (or ``x``'s dtype if wider).

    Examples:
      Points 0, 1, 2 on a line: two equal bars, so the loss is ``−log 2``.

      >>> import numpy as np
      >>> from isojax import topology
      >>> round(float(topology.persistent_entropy_loss(np.array([[0.0], [1.0], [2.0]], np.float32), bars="all")), 4)
      -0.6931
    """
    clouds, real, weight, in_range = _loss_inputs(x, labels, mask, num_classes, bars, in_cluster_weight)
    loss = _cloud_losses(clouds, real, weight, bars=bars)
    return nan_unless(in_range, loss if labels is None else jnp.sum(loss, axis=-1))


def _cloud_losses(clouds, real, weight, *, bars):
    """R = −H(entropy bars) + w · mean(in-cluster bars) of each cloud, ``[..., (C)]``."""
    barcode = _edges(clouds, real)[1]
    entropy_bars, in_cluster = _entropy_and_in_cluster_bars(barcode, barcode_mask(real), bars)
    mean_in_cluster = safe_div(jnp.sum(jnp.where(in_cluster, barcode, 0), axis=-1), jnp.sum(in_cluster, axis=-1))
    return -_entropy(barcode, entropy_bars) + weight * mean_in_cluster


def persistent_entropy_loss_grad(
    x, labels=None, *, mask=None, num_classes: int | None = None, bars: str = "selected", in_cluster_weight=0.0
):
    """Closed-form gradient ∂L/∂x ``[..., n, d]`` of :func:`persistent_entropy_loss` (same arguments).

    Through the bars: with S the bars whose entropy is taken (the selected ones, or all), L_S = Σ_{e∈S} l_e,
    p_e = l_e / L_S and H = −Σ_{e∈S} p_e log p_e,

        ∂(−H)/∂l_e = (log p_e + H) / L_S   (e ∈ S, l_e > 0),      ∂(w · mean_K l)/∂l_e = w / ``|K|``   (e ∈ K),

    K the in-cluster bars; the selection is piecewise constant and carries no gradient. Through the selected
    MST edges: bar e joins points (i, j) with l_e = ‖x_i − x_j‖, so it adds ∂L/∂l_e · (x_i − x_j)/l_e to
    the gradient of x_i and subtracts it from that of x_j (zero for coincident points). With labels, the
    per-class gradients add up. Equal to ``jax.grad`` of the loss (the edges and the selection are those of
    the loss).

    Args:
      x: ``[..., n, d]`` float points, n ≥ 2.
      labels: optional ``[..., n]`` integer class labels in [0, num_classes), as in :func:`persistent_entropy_loss`.
      mask: optional ``[..., n]`` bool, true = real point.
      num_classes: number of classes (static); required under ``jit`` when ``labels`` is given.
      bars: ``"selected"`` or ``"all"`` (static).
      in_cluster_weight: w ≥ 0 (traced); only with ``bars="selected"``.

    Returns:
      ``[..., n, d]`` gradient, float32 (or ``x``'s dtype if wider); zero on padding points.

    Examples:
      Points 0, 1, 3: bars ``a = 2`` (points 1, 2) and ``b = 1`` (points 0, 1), ``p = (2/3, 1/3)``;
      ``∂(−H)/∂a = (log(2/3) + H) / 3 ≈ 0.077``, ``∂(−H)/∂b = (log(1/3) + H) / 3 ≈ −0.154``, and each
      bar's gradient pushes its two endpoints with opposite signs.

      >>> import numpy as np
      >>> from isojax import topology
      >>> g = topology.persistent_entropy_loss_grad(np.array([[0.0], [1.0], [3.0]], np.float32), bars="all")
      >>> np.round(np.asarray(g, np.float64), 3).tolist()
      [[0.154], [-0.231], [0.077]]
    """
    clouds, real, weight, in_range = _loss_inputs(x, labels, mask, num_classes, bars, in_cluster_weight)
    grad = _cloud_loss_grads(clouds, real, weight, bars=bars)
    return nan_unless(in_range, grad if labels is None else jnp.sum(grad, axis=-3))


def _cloud_loss_grads(clouds, real, weight, *, bars):
    """∂R/∂clouds of each cloud, ``[..., (C), n, d]`` (see :func:`persistent_entropy_loss_grad`)."""
    edges, barcode = _edges(clouds, real)
    clouds = select_rows(clouds, real)
    entropy_bars, in_cluster = _entropy_and_in_cluster_bars(barcode, barcode_mask(real), bars)
    lengths = jnp.where(entropy_bars, barcode, 0)
    total = jnp.sum(lengths, axis=-1, keepdims=True)
    p = safe_div(lengths, total)
    positive = p > 0
    log_p = jnp.log(jnp.where(positive, p, 1))
    entropy = -jnp.sum(p * log_p, axis=-1, keepdims=True)
    d_bars = jnp.where(positive, safe_div(log_p + entropy, total), 0)
    d_bars += jnp.where(in_cluster, safe_div(weight, jnp.sum(in_cluster, axis=-1, keepdims=True)), 0)
    ends = jnp.take_along_axis(clouds[..., None, :, :], edges[..., None], axis=-2)  # [..., m, 2, d]
    step = safe_div(ends[..., 0, :] - ends[..., 1, :], barcode[..., None]) * d_bars[..., None]  # [..., m, d]
    n = clouds.shape[-2]
    incidence = jax.nn.one_hot(edges[..., 0], n, dtype=step.dtype) - jax.nn.one_hot(edges[..., 1], n, dtype=step.dtype)
    return jnp.matmul(jnp.swapaxes(incidence, -1, -2), step, precision=HIGHEST)  # [..., n, d]
