"""Activation functions of isojax's layers against scipy in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
import scipy.stats

from isojax.models.activations import ACTIVATIONS


def test_exact_gelu_is_x_times_the_normal_cdf():
    """``hidden_act="gelu"`` against scipy's float64 x Phi(x), and its gradient Phi(x) + x phi(x) against scipy too."""
    x = np.linspace(-10, 10, 20001).astype(np.float32)
    x64 = x.astype(np.float64)
    gelu = ACTIVATIONS["gelu"]
    np.testing.assert_allclose(gelu(jnp.asarray(x)), x64 * scipy.special.ndtr(x64), rtol=0, atol=1.1e-6)
    grad = jax.vmap(jax.grad(gelu))(jnp.asarray(x))
    np.testing.assert_allclose(grad, scipy.special.ndtr(x64) + x64 * scipy.stats.norm.pdf(x64), rtol=0, atol=5e-6)
