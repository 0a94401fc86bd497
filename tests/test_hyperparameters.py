"""Float hyperparameters of the losses, metrics, topology and calibration functions are traced.

For each one: a function jitted once and called with three values compiles once (a trace counter and the jit
cache size) and gives the eager results; ``jax.grad`` with respect to the hyperparameter matches central finite
differences in float64; a traced value out of range gives NaN while a concrete one raises ``ValueError``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from isojax import calibrate, losses, metrics, topology


def cloud(seed=0, n=12, d=4):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + 0.3


def whitened_sum(x, eps):
    state = calibrate.fit_whitening(x, eps=eps)
    return jnp.sum(jnp.sin(calibrate.apply_whitening(state, x)))


def balanced_means(x, smoothing):
    """Sum of the balancer's moving means after two updates with losses made from x (float64 state)."""
    state = losses.BalancerState(means=jnp.zeros(2, x.dtype), step=jnp.zeros((), jnp.int32))
    for scale in (1.0, 1.7):
        _, state = losses.balancer_update(
            state, scale * jnp.stack([jnp.sum(x**2), jnp.sum(jnp.abs(x))]), smoothing=smoothing
        )
    return jnp.sum(state.means)


LABELS = np.arange(12) % 2
C0 = np.cov(np.random.default_rng(9).normal(size=(40, 4)).T)

# name -> (f(x, value) -> scalar, three valid values, an out-of-range value or None)
CASES = {
    "isoscore_star zeta": (lambda x, v: metrics.isoscore_star(x, zeta=v), (0.1, 0.5, 0.9), 1.5),
    "isoscore_star zeta c0": (lambda x, v: metrics.isoscore_star(x, c0=C0, zeta=v), (0.1, 0.5, 0.9), -0.1),
    "rbf_uniformity t": (lambda x, v: metrics.rbf_uniformity(x, t=v), (0.5, 2.0, 3.0), 0.0),
    "lsds t": (lambda x, v: metrics.lsds(x, jnp.sin(x), k=3, t=v), (0.5, 1.0, 4.0), -1.0),
    "lsds reg": (lambda x, v: metrics.lsds(x, jnp.sin(x), k=5, weights="barycentric", reg=v), (1e-3, 0.01, 0.1), 0.0),
    "cosine weight": (lambda x, v: losses.cosine_regularization(x, weight=v), (0.1, 1.0, 3.0), None),
    "spectrum_polynomial c1": (lambda x, v: losses.spectrum_polynomial(x, c1=v, gamma=-0.5), (0.5, 1.0, 2.0), None),
    "spectrum_polynomial gamma": (lambda x, v: losses.spectrum_polynomial(x, c1=2.0, gamma=v), (-1.0, -0.5, 0.3), None),
    "spectrum_polynomial weight": (
        lambda x, v: losses.spectrum_polynomial(x, c1=2.0, gamma=-0.5, weight=v),
        (0.1, 1.0, 2.0),
        None,
    ),
    "spectrum_exponential c1": (
        lambda x, v: losses.spectrum_exponential(x, c1=v, c2=0.3, gamma=1.0),
        (1.0, 2.0, 3.0),
        None,
    ),
    "spectrum_exponential c2": (
        lambda x, v: losses.spectrum_exponential(x, c1=2.0, c2=v, gamma=1.0),
        (0.1, 0.3, 0.7),
        None,
    ),
    "spectrum_exponential gamma": (
        lambda x, v: losses.spectrum_exponential(x, c1=2.0, c2=0.3, gamma=v),
        (0.5, 1.0, 1.5),
        None,
    ),
    "isoscore_loss eps": (lambda x, v: losses.isoscore_loss(x, eps=v), (1e-6, 1e-3, 0.1), 0.0),
    "istar_loss zeta": (lambda x, v: losses.istar_loss(x, zeta=v), (0.1, 0.5, 0.9), 2.0),
    "istar_loss weight": (lambda x, v: losses.istar_loss(x, weight=v), (0.1, 1.0, 3.0), None),
    "balancer smoothing": (balanced_means, (0.15, 0.5, 1.0), 0.0),
    "persistent_entropy in_cluster_weight": (
        lambda x, v: topology.persistent_entropy_loss(x, LABELS, num_classes=2, in_cluster_weight=v),
        (0.0, 0.4, 2.0),
        -0.5,
    ),
    "fit_whitening eps": (whitened_sum, (0.0, 1e-3, 0.1), -1e-3),
    "isobn_scale eps": (
        lambda x, v: jnp.sum(calibrate.isobn_scale(jnp.cov(x.T), jnp.std(x, 0), eps=v)),
        (1e-3, 0.1, 1.0),
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jitted_once_for_three_values(name):
    f, values, _ = CASES[name]
    traces = []

    def counted(x, value):
        traces.append(value)
        return f(x, value)

    with jax.enable_x64(True):  # float64: jitted and eager results agree to rounding, whatever the conditioning
        x = jnp.asarray(cloud())
        jitted = jax.jit(counted)
        results = [float(jitted(x, value)) for value in values]
        assert len(traces) == 1, traces  # one trace, so one compilation for the three values
        np.testing.assert_allclose(results, [float(f(x, value)) for value in values], rtol=1e-10, atol=1e-12)
    assert len(set(results)) == 3, results  # the hyperparameter takes effect


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name):
    f, values, _ = CASES[name]
    with jax.enable_x64(True):
        x = jnp.asarray(cloud(1))
        value = values[1]
        h = 1e-6 * max(1.0, abs(value))
        expected = (float(f(x, value + h)) - float(f(x, value - h))) / (2 * h)
        grad = float(jax.grad(f, argnums=1)(x, jnp.float64(value)))
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", sorted(name for name, case in CASES.items() if case[2] is not None))
def test_out_of_range_is_nan_when_traced_and_an_error_when_concrete(name):
    f, values, bad = CASES[name]
    x = jnp.asarray(cloud(), jnp.float32)
    assert np.isnan(float(jax.jit(f)(x, bad)))
    assert np.isfinite(float(jax.jit(f)(x, values[0])))
    with pytest.raises(ValueError, match="must"):
        f(x, bad)


def test_fit_flow_learning_rate_is_traced():
    """The flow's learning rate: one compilation for three values, NaN parameters for a traced rate <= 0."""
    x = jnp.asarray(cloud(2, n=64, d=4), jnp.float32)
    key = jax.random.key(0)
    traces = []

    def fit(x, rate):
        traces.append(rate)
        state = calibrate.fit_flow(x, key, levels=1, depth=1, hidden=4, steps=3, learning_rate=rate, batch_size=16)
        return state.log_likelihood[-1]

    jitted = jax.jit(fit)
    results = [float(jitted(x, rate)) for rate in (1e-3, 1e-2, 0.1)]
    assert len(traces) == 1  # one trace, so one compilation for the three rates
    assert len(set(results)) == 3 and np.all(np.isfinite(results))
    assert np.isnan(float(jitted(x, -1e-3)))
    with pytest.raises(ValueError, match="learning_rate must be positive"):
        fit(x, 0.0)


def test_hyperparameter_type_and_shape_errors():
    x = cloud().astype(np.float32)
    with pytest.raises(TypeError, match="zeta must have a floating dtype"):
        metrics.isoscore_star(x, zeta=jnp.array(1))
    with pytest.raises(TypeError, match="t must have a floating dtype"):
        metrics.rbf_uniformity(x, t=True)
    with pytest.raises(ValueError, match="weight must be a scalar"):
        losses.cosine_regularization(x, weight=jnp.ones(2))
    with pytest.raises(TypeError, match="k is shape-like and must be static under jit"):
        jax.jit(metrics.explained_variance)(x, 2)
