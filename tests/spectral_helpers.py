"""Numerical helpers shared by the spectral and SoftDecay tests (numpy only)."""
import numpy as np


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


def rel_err(a, b):
    return np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b)
