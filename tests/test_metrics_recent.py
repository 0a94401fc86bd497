"""The measures since 2022 in isojax.metrics against independent references: numpy argmax/median, brute-force
double loops over pairs, python loops over attention maps, scikit-dimension's TwoNN, numpy cosines."""

import itertools
import warnings

import jax
import numpy as np
import pytest
from conftest import require

from isojax import metrics


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def padded_cloud(rng, n, d, extra=3, garbage=np.nan):
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 3, size=d) + rng.normal(size=d)
    return np.concatenate([x, np.full((extra, d), garbage)]), np.arange(n + extra) < n, x


def unit(x):
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


# ---------------------------------------------------------------------------------------------- massive activations
def test_massive_activations_are_numpy_argmax_and_median():
    rng = np.random.default_rng(0)
    x, mask, real = padded_cloud(rng, 20, 7)
    real[4, 5] = -2000.0
    x[4, 5] = -2000.0
    m = metrics.massive_activations(x, mask=mask)
    flat = np.abs(real).ravel()
    assert float(m.value) == flat.max()
    assert (int(m.token), int(m.dimension)) == np.unravel_index(flat.argmax(), real.shape) == (4, 5)
    np.testing.assert_allclose(m.ratio, flat.max() / np.median(flat), rtol=1e-12)
    batch = np.stack([x, x[::-1]]), np.stack([mask, mask[::-1]])  # leading axes: independent clouds
    both = metrics.massive_activations(batch[0], mask=batch[1])
    np.testing.assert_array_equal(both.token, [4, len(x) - 1 - 4])
    odd = metrics.massive_activations(np.array([[1.0, -3.0, 2.0]]))  # median of an odd count: the middle one
    assert float(odd.ratio) == 1.5


def test_massive_activations_zero_median():
    sparse = np.zeros((4, 3))
    sparse[1, 2] = 5.0
    assert float(metrics.massive_activations(sparse).ratio) == np.inf
    assert float(metrics.massive_activations(np.zeros((4, 3))).ratio) == 1.0


# ---------------------------------------------------------------------------------------------- rogue dimensions
def brute_force_rogue(x):
    """Double loop over ordered pairs i != j of CC_k = x_ik x_jk / (|x_i||x_j|); standardised cosines likewise."""
    n, d = x.shape
    cc = np.zeros(d)
    for i in range(n):
        for j in range(n):
            if i != j:
                cc += x[i] * x[j] / (np.linalg.norm(x[i]) * np.linalg.norm(x[j]))
    cc /= n * (n - 1)
    z = (x - x.mean(0)) / x.std(0)
    cosines = [
        z[i] @ z[j] / (np.linalg.norm(z[i]) * np.linalg.norm(z[j])) for i in range(n) for j in range(n) if i != j
    ]
    return cc, float(np.mean(cosines))


def test_rogue_dimensions_equal_a_brute_force_double_loop():
    rng = np.random.default_rng(1)
    x, mask, real = padded_cloud(rng, 15, 6)
    real[:, 2] += 40.0  # a rogue dimension
    x[:15, 2] += 40.0
    cc, standardized = brute_force_rogue(real)
    r = metrics.rogue_dimensions(x, mask=mask)
    np.testing.assert_allclose(r.contributions, cc, rtol=1e-10, atol=1e-14)
    u = unit(real)
    mean_cosine = np.mean([u[i] @ u[j] for i, j in itertools.permutations(range(len(real)), 2)])
    np.testing.assert_allclose(r.mean_cosine, mean_cosine, rtol=1e-10)  # Σ CC_k = mean cosine
    top = np.sort(np.abs(cc))[::-1]
    np.testing.assert_allclose(r.top1_share, top[0] / top.sum(), rtol=1e-10)
    np.testing.assert_allclose(r.top3_share, top[:3].sum() / top.sum(), rtol=1e-10)
    np.testing.assert_allclose(r.standardized_cosine, standardized, rtol=1e-9, atol=1e-12)
    assert float(r.top1_share) > 0.9 and abs(float(r.standardized_cosine)) < 0.1


# ---------------------------------------------------------------------------------------------- attention sinks
def loop_sinks(probs, mask, epsilon):
    """Python loops: α_k = mean over real queries i >= k of A[i, k]; α at the first real token; the share > ε."""
    b_count, layers, heads, length, _ = probs.shape
    firsts = np.zeros((b_count, layers, heads))
    alphas = np.zeros((b_count, layers, heads, length))
    for b in range(b_count):
        real = [t for t in range(length) if mask[b, t]]
        for layer in range(layers):
            for h in range(heads):
                for k in real:
                    queries = [i for i in real if i >= k]
                    alphas[b, layer, h, k] = sum(probs[b, layer, h, i, k] for i in queries) / len(queries)
                firsts[b, layer, h] = alphas[b, layer, h, real[0]]
    return alphas, firsts, float(np.mean(firsts > epsilon))


def causal_probs(rng, shape, mask, sink):
    """Random causal softmax attention over the real keys, with extra logit ``sink`` on the first real key."""
    b_count, layers, heads, length = shape
    logits = rng.normal(size=(b_count, layers, heads, length, length))
    first = mask.argmax(-1)
    logits[np.arange(b_count), ..., first] += sink[:, :, :, None] if sink.ndim == 3 else sink
    allowed = np.tril(np.ones((length, length), bool)) & mask[:, None, None, None, :]
    logits = np.where(allowed, logits, -1e30)  # padding query rows: all keys disallowed, no inf - inf
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs = np.where(allowed, probs, 0)
    probs /= np.maximum(probs.sum(-1, keepdims=True), 1e-300)
    return np.where(mask[:, None, None, :, None], probs, np.nan)  # padding queries hold garbage


def test_attention_sinks_equal_python_loops():
    rng = np.random.default_rng(2)
    length = 7
    mask = np.array([[True] * 7, [True] * 4 + [False] * 3, [False] * 2 + [True] * 5])  # right and left padding
    sink = rng.uniform(-4, 2, size=(3, 2, 4))
    probs = causal_probs(rng, (3, 2, 4, length), mask, sink)
    expected_alpha, expected_first, expected_rate = loop_sinks(np.nan_to_num(probs), mask, 0.3)
    s = metrics.attention_sinks(probs, mask=mask, epsilon=0.3)
    np.testing.assert_allclose(s.alpha, expected_alpha, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(s.first, expected_first, rtol=1e-12)
    assert float(s.rate) == pytest.approx(expected_rate, rel=1e-12) and 0 < expected_rate < 1
    np.testing.assert_allclose(jax.jit(metrics.attention_sinks)(probs, mask=mask, epsilon=0.3).rate, expected_rate)


def test_attention_sinks_bad_input():
    probs = np.full((2, 3, 3), 1 / 3)
    with pytest.raises(ValueError, match="probs must have shape"):
        metrics.attention_sinks(probs[..., :2])
    with pytest.raises(ValueError, match="mask must select at least 1 row"):
        metrics.attention_sinks(probs, mask=np.array([[True] * 3, [False] * 3]))
    bad = probs.copy()
    bad[1, 2, 0] = np.nan
    with pytest.raises(ValueError, match="probs has a non-finite value"):
        metrics.attention_sinks(bad)
    assert np.isnan(jax.jit(metrics.attention_sinks)(bad).rate)
    with pytest.raises(ValueError, match=r"epsilon must be in \[0.0, 1.0\]"):
        metrics.attention_sinks(probs, epsilon=1.5)


# ---------------------------------------------------------------------------------------------- TwoNN
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # skdim's unused log(1 - 1)
@pytest.mark.parametrize("method", ["linear", "mle"])
@pytest.mark.parametrize("n,d,intrinsic", [(300, 5, 2), (400, 40, 4)])
def test_twonn_matches_scikit_dimension(method, n, d, intrinsic):
    """skdim.id.TwoNN (0.5.0): linear = Facco's fit through the origin of −log(1 − i/N) on log μ discarding the
    largest 10 %; mle = the censored unbiased MLE; d > 25 takes skdim's sorted-distance branch."""
    require("skdim")
    import skdim

    rng = np.random.default_rng(n + d)
    real = rng.normal(size=(n, intrinsic)) @ rng.normal(size=(intrinsic, d)) + 3.0
    x = np.concatenate([real, np.full((5, d), np.inf)])
    mask = np.arange(n + 5) < n
    expected = skdim.id.TwoNN(method=method).fit(real).dimension_
    got = metrics.twonn_dimension(x, mask=mask, method=method)
    np.testing.assert_allclose(got, expected, rtol=1e-9)
    assert abs(float(got) - intrinsic) < 0.5
    for fraction in (0.0, 0.25) if method == "mle" else (0.25,):
        expected = skdim.id.TwoNN(method=method, discard_fraction=fraction).fit(real).dimension_
        got = metrics.twonn_dimension(real, method=method, discard_fraction=fraction)
        np.testing.assert_allclose(got, expected, rtol=1e-9)


def test_twonn_drops_duplicates_as_scikit_dimension_does():
    require("skdim")
    import skdim

    rng = np.random.default_rng(5)
    real = rng.normal(size=(60, 3))
    real[10] = real[11]  # r1 = 0 for both: dropped
    real[20] = real[30]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # skdim warns that it drops them
        expected = skdim.id.TwoNN().fit(real).dimension_
    np.testing.assert_allclose(metrics.twonn_dimension(real), expected, rtol=1e-9)
    np.testing.assert_allclose(metrics.twonn_dimension(real.astype(np.float32)), expected, rtol=1e-3)  # exact r1 = 0
    with pytest.raises(ValueError, match="at least 2 points with a distinct nearest neighbour"):
        metrics.twonn_dimension(np.ones((5, 3)))
    assert np.isnan(jax.jit(metrics.twonn_dimension)(np.ones((5, 3))))
    with pytest.raises(ValueError, match="discard_fraction must be in"):
        metrics.twonn_dimension(real, discard_fraction=0.0)
    with pytest.raises(ValueError, match="method must be"):
        metrics.twonn_dimension(real, method="ls")


# ---------------------------------------------------------------------------------------------- random pairs, alignment
def test_random_pair_cosine_estimates_the_mean_over_all_pairs():
    rng = np.random.default_rng(6)
    x, mask, real = padded_cloud(rng, 30, 5, garbage=1e30)
    u = unit(real)
    exact = np.mean([u[i] @ u[j] for i, j in itertools.permutations(range(len(real)), 2)])
    cos = u @ u.T
    spread = np.std(cos[~np.eye(len(real), dtype=bool)])
    got = metrics.random_pair_cosine(x, jax.random.key(0), num_pairs=40_000, mask=mask)
    assert abs(float(got) - exact) < 5 * spread / np.sqrt(40_000)
    again = metrics.random_pair_cosine(x, jax.random.key(0), num_pairs=40_000, mask=mask)
    assert float(again) == float(got)  # the key decides
    only_pair = metrics.random_pair_cosine(x, jax.random.key(1), num_pairs=16, mask=np.arange(len(x)) < 2)
    np.testing.assert_allclose(only_pair, u[0] @ u[1], rtol=1e-12)  # never a row with itself, never padding


def test_alignment_equals_numpy():
    rng = np.random.default_rng(7)
    x, mask, real = padded_cloud(rng, 12, 4)
    y = x + 0.3 * rng.normal(size=x.shape)
    expected = np.mean(np.linalg.norm(unit(real) - unit(y[:12]), axis=-1) ** 2)
    np.testing.assert_allclose(metrics.alignment(x, y, mask=mask), expected, rtol=1e-12)
    expected_1 = np.mean(np.linalg.norm(unit(real) - unit(y[:12]), axis=-1))
    np.testing.assert_allclose(metrics.alignment(x, y, mask=mask, alpha=1.0), expected_1, rtol=1e-12)
    with pytest.raises(ValueError, match="y must have the shape of x"):
        metrics.alignment(real, real[:3])
