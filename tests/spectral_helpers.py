"""Numerical helpers shared by the spectral and SoftDecay tests: numpy references, the strategies under test and
the accuracy each one must meet."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.benchmarks.decompositions import STRATEGIES, Strategy, available_strategies, method_for
from isojax.spectral import thin_svd

ALL_METHODS = [pytest.param(method_for(name), id=name) for name in available_strategies()]
"""Every decomposition strategy this backend lowers, as the ``method=`` that runs it: isojax's own names (``svd``,
``gram_eigh_f64``, dispatched per platform) and the benchmark's other strategies (callables), with their names as
test ids."""


def _distinct(methods):
    """One name per distinct program: strategies whose thin SVD lowers to the same StableHLO on this backend are
    the same computation (on CPU JAX ignores the algorithm of svd_dc and gram_eigh*_qr: gesdd and syevd either
    way), and the expensive tests run it once."""
    x = jax.ShapeDtypeStruct((3, 4, 6), jnp.float32)
    programs = {}
    for param in methods:
        strategy = STRATEGIES[param.id]  # compared as the benchmark's callables: isojax's own names add a dispatch
        programs.setdefault(jax.jit(lambda x, m=strategy: thin_svd(x, m)).lower(x).as_text(), param)
    return list(programs.values())


METHODS = _distinct(ALL_METHODS)
"""The strategies of ALL_METHODS that are distinct programs on this backend (the tests run each one)."""


def orthogonal(rng, n):
    return np.linalg.qr(rng.standard_normal((n, n)))[0]


def with_spectrum(rng, n, d, s):
    """An [n, d] matrix with singular values ``s`` (len <= min(n, d); the rest zero) and random vectors."""
    return orthogonal(rng, n)[:, : len(s)] @ np.diag(s) @ orthogonal(rng, d)[:, : len(s)].T


def central_difference(fun, x, h=1e-6):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        grad[i] = (fun(x + e) - fun(x - e)) / (2 * h)
    return grad


def directional_difference(fun, x, direction, h=1e-6):
    """Central difference of ``fun`` at ``x`` along ``direction`` (step ``h`` times the direction)."""
    return (fun(x + h * direction) - fun(x - h * direction)) / (2 * h)


def dense_jacobian(fun, x, mask=None, h=1e-6):
    """``[n·d, n·d]`` Jacobian of ``vec(fun(x[real rows]))`` (zero rows and columns for masked rows) by central
    differences, for a float64 ``x [n, d]``."""
    rows = np.ones(len(x), bool) if mask is None else np.asarray(mask)

    def full(z):
        out = np.zeros_like(x)
        out[rows] = fun(z[rows])
        return out.ravel()

    jac = np.zeros((x.size, x.size))
    for i in range(x.size):
        e = np.zeros(x.size)
        e[i] = h
        jac[:, i] = (full(x + e.reshape(x.shape)) - full(x - e.reshape(x.shape))) / (2 * h)
    return jac


def operator_cases(rng, top: float) -> dict:
    """Small float64 ``(x, mask)`` cases for the derivative-operator tests: a wide matrix with a repeated singular
    value below ``top`` (its largest), and a tall one of rank 2 whose last two rows are masked."""
    tall = np.concatenate([with_spectrum(rng, 4, 3, [top, top / 2]), rng.standard_normal((2, 3))])
    return {
        "wide-repeated": (with_spectrum(rng, 3, 5, [top, 1.0, 1.0]), None),
        "tall-rank-2-masked": (tall, np.arange(6) < 4),
    }


def assert_operator_spectrum(sv, norm, cond, fun, x, mask=None):
    """The operator's ``singular_values()``, ``norm()`` and ``cond()`` of one float64 ``x [n, d]`` against the
    singular values of the central-difference Jacobian of the numpy map ``fun(x[real rows], rank)`` (the map on
    the matrix's rank, which the null rule defines)."""
    real = x if mask is None else x[mask]
    rank = np.linalg.matrix_rank(real)
    ref = np.linalg.svd(dense_jacobian(lambda z: fun(z, rank), x, mask), compute_uv=False)
    np.testing.assert_allclose(sv, ref, atol=1e-7 * ref[0])
    np.testing.assert_allclose(norm, ref[0], rtol=1e-7)
    last = real.size - 1  # masked entries are outside the operator's domain
    np.testing.assert_allclose(cond, ref[0] / ref[last] if ref[last] > 1e-7 * ref[0] else np.inf, rtol=1e-6)


def rel_err(a, b):
    return np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b)


def y_tolerance(method: str, dtype, kappa: float) -> float:
    """Largest relative error of ``Y`` a strategy must meet on a matrix of condition number ``kappa`` (live values)
    with inputs of ``dtype``: ``4·eps·κ`` for the SVD routes (the automatic choice assumes this accuracy), plus
    ``4·eps_G·κ²`` for the Gram route, whose Gram matrix in precision ``eps_G`` squares the condition number
    (``eps_G`` is float64's for ``gram_eigh_f64*``, the input's otherwise). Measured on the tests' [16, 48]
    matrices: at most 0.3 of the bound at κ = 10, below 0.02 from κ = 100 on."""
    eps = float(np.finfo(dtype).eps)
    bound = eps * kappa
    dec = method if isinstance(method, Strategy) else STRATEGIES[method]
    if dec.route == "gram_eigh":
        bound += float(np.finfo(np.float64).eps if dec.float64 else eps) * kappa**2
    return 4 * bound
