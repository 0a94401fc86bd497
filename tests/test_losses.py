"""Tests of isojax.losses (and the persistent-entropy loss) against independent references.

References: the pairwise double sum of eq. 12 and the mean-direction form of too-much-in-common
App. A, numpy SVD formulas, the ``isoscore`` package, a plain-Python transcription of the balancer
(isotropy-layer eq. 3), and central finite differences in float64 for every gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import require

from isojax import losses, topology


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def central_differences(f, x, h=1e-6):
    """Gradient of the scalar function f at x by central differences, coordinate by coordinate."""
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[index] = h
        grad[index] = (float(f(x + step)) - float(f(x - step))) / (2 * h)
    return grad


# ---------------------------------------------------------------------------------------------- values
def test_cosine_regularization_equals_pairwise_sum_and_mean_direction_form():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(40, 6)) + 0.7
    unit = w / np.linalg.norm(w, axis=1, keepdims=True)
    n = len(w)
    pairwise = sum(unit[i] @ unit[j] for i in range(n) for j in range(n) if i != j) / n**2  # eq. 12
    mean_direction = (np.linalg.norm(unit.sum(0)) ** 2 - n) / n**2  # App. A
    value = float(losses.cosine_regularization(w.astype(np.float32), weight=0.3))
    np.testing.assert_allclose(value, 0.3 * pairwise, rtol=1e-5)
    np.testing.assert_allclose(value, 0.3 * mean_direction, rtol=1e-5)
    padded = np.concatenate([w, np.ones((5, 6))]).astype(np.float32)
    mask = np.arange(45) < 40
    np.testing.assert_allclose(float(losses.cosine_regularization(padded, mask=mask, weight=0.3)), value, rtol=1e-5)


def test_spectrum_control_matches_numpy():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(2, 30, 5)).astype(np.float32)
    sigma = np.linalg.svd(w.astype(np.float64), compute_uv=False)
    k = np.arange(1, 6)
    polynomial = 0.5 * ((sigma - 4.0 * k**-0.7) ** 2).sum(-1)
    exponential = 0.5 * ((sigma - 4.0 * np.exp(-0.3 * k**0.8)) ** 2).sum(-1)
    np.testing.assert_allclose(losses.spectrum_polynomial(w, c1=4.0, gamma=-0.7, weight=0.5), polynomial, rtol=1e-5)
    np.testing.assert_allclose(
        losses.spectrum_exponential(w, c1=4.0, c2=0.3, gamma=0.8, weight=0.5), exponential, rtol=1e-5
    )


def test_isoscore_and_istar_losses_match_package():
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6))).astype(np.float32)
    score = float(require("IsoScore.IsoScore").IsoScore(x.astype(np.float64)))
    np.testing.assert_allclose(float(losses.isoscore_loss(x)), np.log(1 / (score + 1e-6)), rtol=1e-5)
    star = float(require("IsoScore.IsoScore").IsoScore_star(x.astype(np.float64), np.eye(6), 0.2))
    np.testing.assert_allclose(float(losses.istar_loss(x, weight=2.0)), 2.0 * (1 - star), rtol=1e-5)
    line = np.outer(np.linspace(-1, 1, 50), [1.0, 2.0, 3.0]).astype(np.float32)  # IsoScore 0
    # finite and eps-bounded: IsoScore is 0 up to rounding, so the loss is -log(eps) with eps in float32
    assert -np.log(2e-6) < float(losses.isoscore_loss(line)) <= -np.log(np.float32(1e-6))


def test_istar_loss_rewards_shrinking_the_batch_towards_its_mean():
    """As the docstring warns: with a fixed C0, 1 - IsoScore*(s x) falls to 1 - IsoScore(C0) as s -> 0 (to 0 for
    C0 = I), the isoscore package's IsoScore* with zeta = 1; a batch with fewer rows than dimensions gains most."""
    isoscore_package = require("IsoScore.IsoScore")
    rng = np.random.default_rng(5)
    d = 24
    mixing = rng.normal(size=(d, d)) * np.linspace(1, 0.1, d)
    data = rng.normal(size=(400, d)) @ mixing.T
    c0 = np.cov(data, rowvar=False)
    batch = data[:8]  # rank 7 < d
    limit = 1 - isoscore_package.IsoScore_star(batch, c0, 1.0)  # = 1 - IsoScore(C0)
    scales = [1.0, 0.3, 0.1, 0.01, 1e-4]
    with_data = [float(losses.istar_loss((s * batch).astype(np.float32), c0=c0.astype(np.float32))) for s in scales]
    with_identity = [float(losses.istar_loss((s * batch).astype(np.float32))) for s in scales]
    assert np.all(np.diff(with_data) < 0) and np.all(np.diff(with_identity) < 0)
    np.testing.assert_allclose(with_data[-1], limit, atol=1e-4)
    np.testing.assert_allclose(with_identity[-1], 0.0, atol=1e-4)
    np.testing.assert_allclose(
        with_data[0], 1 - isoscore_package.IsoScore_star(batch, c0, 0.2), atol=1e-5
    )  # the scale-1 value is the package's


def python_balancer(history, smoothing=0.15):
    """isotropy-layer-joint-loss §3.3 transcribed step by step (means start at the first losses)."""
    means, outputs = None, []
    for k, current in enumerate(history):
        if means is None:
            means = list(current)
        overall = sum(means) / len(means)
        outputs.append(sum(loss * overall / mean for loss, mean in zip(current, means)) / len(current))
        rate = smoothing / (1 + k)
        means = [loss * rate + mean * (1 - rate) for loss, mean in zip(current, means)]
    return outputs, means


def test_balancer_matches_transcription_and_scans():
    rng = np.random.default_rng(3)
    history = np.stack([rng.uniform(0.2, 1.0, 7), rng.uniform(3.0, 9.0, 7)], axis=1).astype(np.float32)
    expected, expected_means = python_balancer(history.tolist())
    state = losses.balancer_init(2)
    outputs = []
    for current in history:
        loss, state = losses.balancer_update(state, current)
        outputs.append(float(loss))
    np.testing.assert_allclose(outputs, expected, rtol=1e-6)
    np.testing.assert_allclose(state.means, expected_means, rtol=1e-6)
    assert int(state.step) == 7

    def step(state, current):
        loss, state = losses.balancer_update(state, current)
        return state, loss

    final, scanned = jax.jit(lambda h: jax.lax.scan(step, losses.balancer_init(2), h))(history)
    np.testing.assert_allclose(scanned, expected, rtol=1e-6)
    np.testing.assert_allclose(final.means, expected_means, rtol=1e-6)


# ---------------------------------------------------------------------------------------------- gradients
def check_gradient(f, x, name=""):
    """jax.grad of f at x (float64) against central differences."""
    expected = central_differences(jax.jit(f), x)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(jnp.asarray(x)), expected, rtol=1e-6, atol=1e-8, err_msg=name)


def test_gradients_match_finite_differences(x64):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(9, 4)) @ rng.normal(size=(4, 4)) + 0.5
    mask = np.arange(9) < 7
    c0 = np.cov(rng.normal(size=(50, 4)).T)
    cases = {
        "cosine": lambda x: losses.cosine_regularization(x, mask=mask, weight=0.7),
        "spectrum_polynomial": lambda x: losses.spectrum_polynomial(x, c1=3.0, gamma=-0.5, weight=0.2),
        "spectrum_exponential": lambda x: losses.spectrum_exponential(x, c1=3.0, c2=0.4, gamma=1.2),
        "isoscore": lambda x: losses.isoscore_loss(x, mask=mask),
        "istar": lambda x: losses.istar_loss(x, zeta=0.3, weight=1.5),
        "istar_c0": lambda x: losses.istar_loss(x, c0=c0, zeta=0.3, mask=mask),
    }
    for name, f in cases.items():
        check_gradient(f, x, name)


def test_persistent_entropy_loss_gradient_matches_finite_differences(x64):
    rng = np.random.default_rng(5)
    centers = 6.0 * rng.normal(size=(3, 3))
    x = centers[np.arange(12) % 3] + 0.5 * rng.normal(size=(12, 3))
    labels = np.arange(12) % 2
    for f in (
        lambda x: topology.persistent_entropy_loss(x, in_cluster_weight=0.4),
        lambda x: topology.persistent_entropy_loss(x, bars="all"),
        lambda x: topology.persistent_entropy_loss(x, labels, num_classes=2, in_cluster_weight=0.4),
    ):
        check_gradient(f, x)


def test_balancer_gradient_flows_through_the_losses_only(x64):
    state = losses.balancer_init(2)
    _, state = losses.balancer_update(state, jnp.array([2.0, 8.0]))
    current = np.array([1.5, 9.0])

    def f(current):
        return losses.balancer_update(state, current)[0]

    grad = jax.grad(f)(jnp.asarray(current))
    check_gradient(f, current)
    np.testing.assert_allclose(grad, 0.5 * np.mean(state.means) / np.asarray(state.means), rtol=1e-12)


LOSSES = {
    "cosine": lambda x, mask: losses.cosine_regularization(x, mask=mask),
    "spectrum_polynomial": lambda x, mask: losses.spectrum_polynomial(x, c1=1.0, gamma=-1.0),
    "spectrum_exponential": lambda x, mask: losses.spectrum_exponential(x, c1=1.0, c2=1.0, gamma=1.0),
    "isoscore": lambda x, mask: losses.isoscore_loss(x, mask=mask),
    "istar": lambda x, mask: losses.istar_loss(x, mask=mask),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_finite_gradients_on_degenerate_input(name):
    """Zero rows, identical rows, a repeated spectrum, and two real rows + zero padding rows
    (as one batch), then two rows unpadded."""
    f = LOSSES[name]
    identical = np.tile(np.array([[1.0, -2.0, 0.5, 3.0]], np.float32), (5, 1))
    repeated = np.concatenate([np.diag(np.array([1.0, 1.0, 2.0, 3.0], np.float32)), np.zeros((1, 4), np.float32)])
    two = np.array([[1.0, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, -1.0]], np.float32)
    x = np.stack(
        [np.zeros((5, 4), np.float32), identical, repeated, np.concatenate([two, np.zeros((3, 4), np.float32)])]
    )
    mask = np.arange(5) < np.array([5, 5, 5, 2])[:, None]
    (_, values), grad = jax.jit(jax.value_and_grad(lambda x: (jnp.sum(f(x, mask)), f(x, mask)), has_aux=True))(x)
    assert np.all(np.isfinite(values)) and np.all(np.isfinite(grad)), (values, grad)
    value, grad = jax.jit(jax.value_and_grad(lambda x: f(x, None)))(two)
    assert np.isfinite(float(value)) and np.all(np.isfinite(grad))


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_input_raises_clear_errors():
    x = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"w must have shape \[\.\.\., n, d\]"):
        losses.spectrum_polynomial(np.zeros(3, np.float32), c1=1.0, gamma=-1.0)
    with pytest.raises(ValueError, match="at least 2 points"):
        losses.cosine_regularization(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="mask must have shape"):
        losses.cosine_regularization(x, mask=np.ones(3, bool))
    with pytest.raises(ValueError, match="eps must be positive"):
        losses.isoscore_loss(x, eps=0.0)
    with pytest.raises(ValueError, match="num_losses"):
        losses.balancer_init(0)
    with pytest.raises(ValueError, match=r"losses must have shape \(2,\)"):
        losses.balancer_update(losses.balancer_init(2), jnp.ones(3))
    with pytest.raises(ValueError, match="smoothing"):
        losses.balancer_update(losses.balancer_init(2), jnp.ones(2), smoothing=1.5)


@pytest.mark.parametrize("n, d", [(8, 16), (3, 5), (512, 64)])
def test_identical_rows_have_isoscore_zero_and_a_zero_gradient(n, d):
    """Rows that are copies of one random row (whose centring leaves rounding residue, not zeros) are identical
    points: IsoScore 0, the loss its ceiling −log eps, and a zero gradient, the closed form's too."""
    from isojax import gradients, metrics

    x = np.tile(np.random.default_rng(n).normal(size=d).astype(np.float32), (n, 1))
    assert float(metrics.isoscore(x)) == 0.0
    value, grad = jax.value_and_grad(lambda x: losses.isoscore_loss(x, eps=1e-6))(x)
    np.testing.assert_allclose(value, -np.log(1e-6), rtol=1e-6)
    np.testing.assert_array_equal(grad, 0.0)
    np.testing.assert_array_equal(gradients.isoscore_loss_grad(x), 0.0)
