"""The Isotropy Layer: identity start, y = x K + b against numpy, gradients against the closed form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from isojax.calibrate import IsotropyLayer


def test_starts_at_identity():
    x = np.random.default_rng(0).normal(size=(2, 5, 12)).astype(np.float32)
    layer = IsotropyLayer()
    params = layer.init(jax.random.key(0), x)["params"]
    np.testing.assert_array_equal(params["dense"]["kernel"], np.eye(12))
    np.testing.assert_array_equal(params["dense"]["bias"], np.zeros(12))
    np.testing.assert_array_equal(layer.apply({"params": params}, x), x)


def test_matches_numpy_and_closed_form_gradients():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(7, 6)).astype(np.float32)
    g = rng.normal(size=(7, 6)).astype(np.float32)
    kernel, bias = rng.normal(size=(6, 6)).astype(np.float32), rng.normal(size=6).astype(np.float32)
    params = {"dense": {"kernel": jnp.asarray(kernel), "bias": jnp.asarray(bias)}}
    layer = IsotropyLayer()
    np.testing.assert_allclose(jax.jit(layer.apply)({"params": params}, x), x @ kernel + bias, rtol=1e-5, atol=1e-5)
    grads = jax.grad(lambda p: jnp.sum(layer.apply({"params": p}, x) * g))(params)
    np.testing.assert_allclose(grads["dense"]["kernel"], x.T @ g, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["dense"]["bias"], g.sum(0), rtol=1e-5, atol=1e-5)
    batched = jax.vmap(lambda v: layer.apply({"params": params}, v))(x[:, None, :])
    np.testing.assert_allclose(batched[:, 0], x @ kernel + bias, rtol=1e-5, atol=1e-5)


def test_compute_and_param_dtypes():
    x = jnp.ones((3, 4), jnp.bfloat16)
    layer = IsotropyLayer(dtype=jnp.bfloat16)
    variables = layer.init(jax.random.key(0), x)
    assert variables["params"]["dense"]["kernel"].dtype == jnp.float32
    assert layer.apply(variables, x).dtype == jnp.bfloat16


def test_bad_input_raises():
    with pytest.raises(TypeError, match="floating"):
        IsotropyLayer().init(jax.random.key(0), np.ones((2, 3), np.int32))
    with pytest.raises(ValueError, match=r"\[\.\.\., d\]"):
        IsotropyLayer().init(jax.random.key(0), np.float32(1.0))
