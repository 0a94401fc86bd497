"""Tests of isojax.topology against independent references.

References: scipy's minimum spanning tree and ripser's H0 diagram (bars), the closed-form gradient of
an edge length (barcode gradients), scipy.stats.entropy (persistent entropy), a numpy port of the
shrink-the-longest authors' ``prominient_features`` (feature selection and its off-by-one), and
synthetic clusters whose joining bars are known by construction.
"""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from conftest import require
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial.distance import pdist, squareform

from isojax import topology


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def scipy_mst(x):
    """(edges [(i, j)], lengths) of the Euclidean MST of the rows of x (distinct points)."""
    tree = minimum_spanning_tree(squareform(pdist(x))).tocoo()
    return list(zip(tree.row, tree.col)), tree.data


def ripser_h0_deaths(x):
    with warnings.catch_warnings():  # fewer points than dimensions is intended here (n = 2, 3 in 8-d)
        warnings.filterwarnings("ignore", "The input point cloud has more columns than rows")
        diagram = require("ripser").ripser(x, maxdim=0)["dgms"][0]
    return np.sort(diagram[np.isfinite(diagram[:, 1]), 1])[::-1]


def clusters(rng, sizes, d, spread=0.05, separation=10.0):
    """Gaussian clusters with the given sizes around random centers (pairwise center distances
    ≈ separation·√2 in high dimension); returns (points, labels)."""
    centers = separation * rng.normal(size=(len(sizes), d)) / np.sqrt(d)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return centers[labels] + spread * rng.normal(size=(len(labels), d)), labels


# ---------------------------------------------------------------------------------------------- barcode
@pytest.mark.parametrize("n", [2, 3, 10, 64, 256, 1024])
def test_barcode_matches_scipy_mst_and_ripser(n, x64):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, 8))
    bars = np.asarray(topology.zero_dim_barcode(jnp.asarray(x)))
    assert bars.shape == (n - 1,)
    assert np.all(np.diff(bars) <= 0)  # descending
    np.testing.assert_allclose(bars, np.sort(scipy_mst(x)[1])[::-1], atol=1e-6, rtol=0)
    np.testing.assert_allclose(bars, ripser_h0_deaths(x), rtol=1e-6)  # ripser works in float32


def test_barcode_float32_matches_scipy():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(300, 16)) + 5.0).astype(np.float32)  # off-centre: Gram cancellation
    bars = topology.zero_dim_barcode(x)
    assert bars.dtype == jnp.float32
    np.testing.assert_allclose(bars, np.sort(scipy_mst(x.astype(np.float64))[1])[::-1], rtol=1e-5)


def test_barcode_batched_masked_jit_vmap():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 20, 5)).astype(np.float32)
    counts = np.array([20, 13, 2])
    mask = np.arange(20) < counts[:, None]
    x = np.where(mask[..., None], x, 1e3)  # garbage in padding rows
    bars = topology.zero_dim_barcode(x, mask=mask)
    assert bars.shape == (3, 19)
    np.testing.assert_array_equal(topology.barcode_mask(mask), np.arange(19) < counts[:, None] - 1)
    for b in range(3):
        expected = np.sort(scipy_mst(x[b, : counts[b]].astype(np.float64))[1])[::-1]
        np.testing.assert_allclose(bars[b, : counts[b] - 1], expected, rtol=1e-5)
        np.testing.assert_array_equal(bars[b, counts[b] - 1 :], 0)
    np.testing.assert_allclose(jax.jit(lambda x, m: topology.zero_dim_barcode(x, mask=m))(x, mask), bars)
    np.testing.assert_allclose(jax.vmap(lambda x, m: topology.zero_dim_barcode(x, mask=m))(x, mask), bars)


def test_barcode_gradient_is_the_edge_direction(x64):
    """d/dx Σ_e c_e ‖x_a − x_b‖ = Σ_e c_e (x_a − x_b)/‖x_a − x_b‖ at a, minus that at b."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(15, 3))
    edges, lengths = scipy_mst(x)
    coefficients = rng.normal(size=len(lengths))
    weight_of_rank = coefficients[np.argsort(-lengths)]  # coefficient of the edge at each descending rank
    expected = np.zeros_like(x)
    for (a, b), c in zip(edges, coefficients):
        direction = (x[a] - x[b]) / np.linalg.norm(x[a] - x[b])
        expected[a] += c * direction
        expected[b] -= c * direction
    grad = jax.grad(lambda x: jnp.sum(jnp.asarray(weight_of_rank) * topology.zero_dim_barcode(x)))(jnp.asarray(x))
    np.testing.assert_allclose(grad, expected, atol=1e-10)


def test_barcode_degenerate_input_has_finite_gradients():
    identical = np.tile(np.array([[1.0, -2.0, 0.5]], np.float32), (6, 1))
    two = np.array([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]], np.float32)
    zeros = np.zeros((4, 3), np.float32)
    for x in (identical, two, zeros):
        bars, grad = jax.value_and_grad(lambda x: jnp.sum(topology.zero_dim_barcode(x)))(x)
        assert np.isfinite(float(bars)) and np.all(np.isfinite(grad))
    np.testing.assert_allclose(topology.zero_dim_barcode(two), [5.0])
    np.testing.assert_array_equal(topology.zero_dim_barcode(identical), 0)


# ---------------------------------------------------------------------------------------------- entropy
def test_persistent_entropy_matches_scipy():
    rng = np.random.default_rng(3)
    bars = rng.uniform(0.1, 2.0, size=(4, 9)).astype(np.float32)
    mask = rng.uniform(size=(4, 9)) < 0.7
    mask[:, 0] = True
    entropy = topology.persistent_entropy(bars, mask=mask)
    for row in range(4):
        np.testing.assert_allclose(entropy[row], scipy.stats.entropy(bars[row][mask[row]]), rtol=1e-5)
    np.testing.assert_allclose(topology.persistent_entropy(np.ones(7, np.float32)), np.log(7), rtol=1e-6)
    zero, grad = jax.value_and_grad(topology.persistent_entropy)(jnp.zeros(5))
    assert float(zero) == 0 and np.all(np.isfinite(grad))


# ---------------------------------------------------------------------------------------------- selection
def authors_prominent_count(bars):
    """Number of bars marked prominent by the shrink-the-longest authors' ``prominient_features``
    (numpy port of topoentropy/loss_utils.py: longest bar + ``new_lens[:i]``)."""

    def entropy(lengths):
        p = lengths / lengths.sum()
        return -np.sum(p * np.log(p))

    ordered = np.sort(bars)[::-1]
    new_lens = np.concatenate([ordered[1:], ordered[:1]])
    alpha = new_lens[-2] / new_lens[-1]

    def recursive(new_lens, n_bar):
        total = new_lens.sum()
        if n_bar - 2 <= 1:
            raise RuntimeError("the authors' loop is empty here (UnboundLocalError in their code)")
        for i in range(1, n_bar - 2):
            q = math.ceil(alpha * n_bar * (alpha - 1 - np.log(alpha)) / (alpha - 1) ** 2)
            rest = new_lens[i:]
            total, previous = rest.sum() + i * rest.sum() / np.exp(entropy(rest)), total
            if previous / total < 1:
                break
        if q < i:
            return recursive(np.concatenate([new_lens[:i], new_lens[-2:]]), i + 2)
        return i

    return 1 + recursive(new_lens, len(new_lens))


FLOAT32_TIE = 64 * np.finfo(np.float32).eps


def reference_selection(bars, tie=FLOAT32_TIE):
    """The corrected rule written out directly, in float64: S_i = Σ rest + i·Σ rest / exp(H(rest))
    over the rolled barcode [l_2..l_m, l_1]; features = l_1..l_k for the first k with
    S_k > S_{k−1}(1 + tie). Returns (k, smallest distance of a relative step to the tie threshold)."""
    ordered = np.sort(bars)[::-1]
    rolled = np.concatenate([ordered[1:], ordered[:1]])
    totals = []
    for i in range(len(rolled)):
        rest = rolled[i:]
        p = rest / rest.sum()
        entropy = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0))
        totals.append(rest.sum() + i * rest.sum() / np.exp(entropy))
    steps = np.diff(totals) / np.asarray(totals[:-1]) if len(totals) > 1 else np.zeros(0)
    rises = np.nonzero(steps > tie)[0]
    k = rises[0] + 1 if len(rises) else len(rolled)
    return k, np.min(np.abs(steps[:k] - tie), initial=np.inf)


def test_selection_marks_exactly_the_bars_joining_clean_clusters():
    """c = 2..8 clusters of n = 2c, 64 or 256 points in d = 32 or 16, as one padded batch."""
    rng = np.random.default_rng(7)
    cases = [(c, n, d) for c in range(2, 9) for n, d in [(2 * c, 32), (64, 32), (256, 16)]]
    x = np.zeros((len(cases), 256, 32), np.float32)  # zero feature columns do not change distances
    mask = np.zeros((len(cases), 256), bool)
    for b, (c, n, d) in enumerate(cases):
        sizes = np.full(c, n // c) + (np.arange(c) < n % c)
        x[b, :n, :d], labels = clusters(rng, sizes, d)
        mask[b, :n] = True
        edges, _ = scipy_mst(x[b, :n].astype(np.float64))
        assert sum(labels[i] != labels[j] for i, j in edges) == c - 1  # c − 1 MST edges join clusters
    bars = np.asarray(topology.zero_dim_barcode(x, mask=mask))
    selected = np.asarray(topology.select_prominent(bars, mask=topology.barcode_mask(mask)))
    for b, (c, n, _d) in enumerate(cases):
        # The c − 1 longest bars join the clusters and are far longer than any intra-cluster bar.
        assert bars[b, c - 2] > 10 * bars[b, c - 1]
        np.testing.assert_array_equal(selected[b], np.arange(255) < c - 1)
        if n == 256:  # the authors' code: one noise bar too many (for small n its Q loop cuts to 2 bars)
            assert authors_prominent_count(bars[b, : n - 1].astype(np.float64)) == c


@settings(max_examples=30, deadline=None)
@given(
    c=st.integers(2, 6),
    per_cluster=st.lists(st.integers(1, 10), min_size=6, max_size=6),
    seed=st.integers(0, 2**31 - 1),
)
def test_selection_on_random_clean_clusters_any_size(c, per_cluster, seed):
    """Clusters of 1-10 points (n from 3 up), padded to 64 rows; centers at equal distances.

    At least one cluster has two points: the rule, like Atienza et al.'s, needs one noise bar."""
    rng = np.random.default_rng(seed)
    sizes = [max(per_cluster[0], 2)] + per_cluster[1:c]
    centers = 10.0 * np.eye(8)[:c]  # pairwise distance 10·√2
    labels = np.repeat(np.arange(c), sizes)
    points = centers[labels] + 0.01 * rng.normal(size=(len(labels), 8))
    x = np.zeros((64, 8), np.float32)
    x[: len(labels)] = points
    mask = np.arange(64) < len(labels)
    bars = topology.zero_dim_barcode(x, mask=mask)
    selected = np.asarray(topology.select_prominent(bars, mask=topology.barcode_mask(mask)))
    np.testing.assert_array_equal(selected, np.arange(63) < c - 1)


def test_selection_small_barcodes():
    for bars, expected in [
        ([2.0], [True]),
        ([0.1, 3.0], [False, True]),
        ([1.0, 1.0], [True, True]),
        ([5.0, 0.1, 0.2], [True, False, False]),
        ([5.0, 4.8, 0.1, 0.2], [True, True, False, False]),
        ([0.0, 0.0, 0.0], [True, True, True]),
    ]:
        np.testing.assert_array_equal(topology.select_prominent(np.asarray(bars, np.float32)), expected)


def test_selection_does_not_depend_on_the_bars_scale():
    """Bars scaled by a power of two (exact in float32) down to float32's smallest normal numbers select the same
    bars: equal bars (ties), one long bar, random bars, and [smallest normal, 0], where the reference selects one."""
    rng = np.random.default_rng(5)
    bars = rng.uniform(0.1, 10.0, (32, 12)).astype(np.float32)
    bars[:4] = 1.0
    bars[4:8, 0] = 100.0
    base = np.asarray(topology.select_prominent(bars))
    assert base[:4].all() and base[4:8].sum() == 4  # every equal bar; the long bar alone
    for scale in (2.0**-100, 2.0**-119, 2.0**60):
        np.testing.assert_array_equal(topology.select_prominent(bars * np.float32(scale)), base, err_msg=f"{scale}")
    tiny = np.array([np.finfo(np.float32).tiny, 0.0], np.float32)
    assert reference_selection(tiny.astype(np.float64))[0] == 1
    np.testing.assert_array_equal(topology.select_prominent(tiny), [True, False])


@settings(max_examples=40, deadline=None)
@given(  # no subnormal bars: XLA on CPU flushes them to zero, which the float64 reference does not
    bars=st.lists(st.floats(0.0, 100.0, allow_nan=False, allow_subnormal=False, width=32), min_size=12, max_size=12),
    valid=st.lists(st.booleans(), min_size=12, max_size=12),
    seed=st.integers(0, 2**31 - 1),
)
def test_selection_properties(bars, valid, seed):
    bars, valid = np.asarray(bars, np.float32), np.asarray(valid)
    selected = np.asarray(topology.select_prominent(bars, mask=valid))
    count = selected.sum()
    assert not np.any(selected & ~valid)
    if valid.any():
        assert count >= 1
        assert bars[selected].min() >= bars[valid & ~selected].max(initial=0)  # a top-k set
        expected, margin = reference_selection(bars[valid].astype(np.float64))
        if margin > 1e-5:  # a decision far from float32 rounding
            assert count == expected
    perm = np.random.default_rng(seed).permutation(12)
    np.testing.assert_array_equal(topology.select_prominent(bars[perm], mask=valid[perm]).sum(), count)
    np.testing.assert_array_equal(topology.select_prominent(3.5 * bars, mask=valid).sum(), count)


# ---------------------------------------------------------------------------------------------- loss
def test_entropy_loss_all_bars_matches_scipy(x64):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(30, 6))
    expected = -scipy.stats.entropy(scipy_mst(x)[1])
    np.testing.assert_allclose(
        float(topology.persistent_entropy_loss(jnp.asarray(x), bars="all")), expected, rtol=1e-10
    )


def test_classwise_entropy_loss_on_known_clusters(x64):
    """Class k holds k + 2 well-separated sub-clusters, so its selected bars are its k + 1 joining bars."""
    rng = np.random.default_rng(5)
    xs, labels, expected_selected, expected_in_cluster = [], [], 0.0, 0.0
    for k in range(3):
        x, _ = clusters(rng, [5] * (k + 2), 16)
        lengths = np.sort(scipy_mst(x)[1])[::-1]
        expected_selected += -scipy.stats.entropy(lengths[: k + 1]) + 0.3 * lengths[k + 1 :].mean()
        expected_in_cluster += -scipy.stats.entropy(lengths)
        xs.append(x)
        labels.append(np.full(len(x), k))
    x, labels = np.concatenate(xs), np.concatenate(labels)
    perm = rng.permutation(len(x))
    x, labels = jnp.asarray(x[perm]), jnp.asarray(labels[perm])
    loss = topology.persistent_entropy_loss(x, labels, in_cluster_weight=0.3)
    np.testing.assert_allclose(float(loss), expected_selected, rtol=1e-10)
    np.testing.assert_allclose(
        float(topology.persistent_entropy_loss(x, labels, bars="all")), expected_in_cluster, rtol=1e-10
    )
    # Padding rows and jit (num_classes static) give the same value.
    padded = jnp.concatenate([x, 100 * jnp.ones((7, 16))])
    padded_labels = jnp.concatenate([labels, jnp.zeros(7, labels.dtype)])
    mask = jnp.arange(len(padded)) < len(x)
    jitted = jax.jit(
        lambda x, y, m: topology.persistent_entropy_loss(x, y, mask=m, num_classes=3, in_cluster_weight=0.3)
    )
    np.testing.assert_allclose(float(jitted(padded, padded_labels, mask)), expected_selected, rtol=1e-10)


@pytest.mark.slow
def test_entropy_loss_batched_and_degenerate():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 12, 4)).astype(np.float32)
    labels = np.tile(np.arange(12) % 2, (2, 1))
    batched = topology.persistent_entropy_loss(x, labels)
    np.testing.assert_allclose(
        batched, [topology.persistent_entropy_loss(x[b], labels[b]) for b in range(2)], rtol=1e-6
    )
    vmapped = jax.vmap(lambda x, y: topology.persistent_entropy_loss(x, y, num_classes=2))(x, labels)
    np.testing.assert_allclose(vmapped, batched, rtol=1e-6)
    identical = jnp.ones((6, 4))
    lonely = jnp.asarray(x[0, :5])  # class 1 has a single point
    for points, y in [(identical, np.arange(6) % 2), (lonely, np.array([0, 0, 0, 0, 1])), (lonely[:2], None)]:

        def both(p):
            return topology.persistent_entropy_loss(p, y, in_cluster_weight=0.5) + topology.persistent_entropy_loss(
                p, y, bars="all"
            )

        value, grad = jax.jit(jax.value_and_grad(both))(points)
        assert np.isfinite(float(value)) and np.all(np.isfinite(grad))


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_input_raises_clear_errors():
    x = np.zeros((5, 3), np.float32)
    with pytest.raises(ValueError, match="at least 2 points"):
        topology.zero_dim_barcode(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., n, d\]"):
        topology.zero_dim_barcode(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="mask must have shape"):
        topology.zero_dim_barcode(x, mask=np.ones(4, bool))
    with pytest.raises(ValueError, match="mask must have the shape of bars"):
        topology.select_prominent(np.ones(4, np.float32), mask=np.ones(3, bool))
    with pytest.raises(TypeError, match="bars must have a floating dtype"):
        topology.persistent_entropy(np.ones(4, np.int32))
    with pytest.raises(ValueError, match="labels must have shape"):
        topology.persistent_entropy_loss(x, np.zeros(4, np.int32))
    with pytest.raises(TypeError, match="labels must be integer"):
        topology.persistent_entropy_loss(x, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, num_classes\)"):
        topology.persistent_entropy_loss(x, np.array([0, 1, 2, 0, 1]), num_classes=2)
    with pytest.raises(ValueError, match="num_classes must be given"):
        jax.jit(lambda x, y: topology.persistent_entropy_loss(x, y))(x, np.zeros(5, np.int32))
    with pytest.raises(ValueError, match="bars must be"):
        topology.persistent_entropy_loss(x, bars="some")
    with pytest.raises(ValueError, match="in_cluster_weight needs bars='selected'"):
        topology.persistent_entropy_loss(x, bars="all", in_cluster_weight=0.1)
