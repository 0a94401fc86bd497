"""Analytic gradient study: closed-form gradients of the isotropy regularisers, and the common-enemies split.

The papers' arguments are gradient arguments; this module writes the gradients out, so that they can be
inspected term by term instead of only computed by ``jax.grad``.

**Closed forms.** Each ``*_grad`` function takes the arguments of the loss (or metric) it differentiates and
returns ∂value/∂x with the shape of ``x`` (for batched input ``[..., n, d]``: the gradient of each cloud's value
with respect to its own points, i.e. ``jax.grad`` of the sum over the leading axes). Each equals ``jax.grad``
of that function, on degenerate input too (repeated rows, padding rows, zero rows, ties); the tests check
1e-6 relative agreement in float64.

* :func:`cosine_regularization_grad` -- :func:`isojax.losses.cosine_regularization`.
* :func:`spectrum_polynomial_grad`, :func:`spectrum_exponential_grad` -- spectrum control, through
  ∂σ_k/∂W = u_k v_kᵀ.
* :func:`isoscore_grad`, :func:`isoscore_star_grad`, :func:`isoscore_loss_grad`, :func:`istar_loss_grad` --
  IsoScore and IsoScore* through the covariance spectrum.
* :func:`persistent_entropy_loss_grad` -- through the selected MST edges. It is defined beside its loss in
  :mod:`isojax.topology` (it shares the loss's class split and bar selection) and re-exported here.

**SoftDecay's derivative operator** (the Daleckii–Krein divided-difference matrices of
:func:`isojax.soft_decay` for a given X and α, their action, adjoint, norm and conditioning, and ∂X̃/∂α) lives
with the spectral map, whose custom JVP shares its implementation, in :mod:`isojax.spectral`
(:class:`SpectralDerivative`, :func:`spectral_derivative`) and :mod:`isojax.softdecay`
(:func:`softdecay_derivative`), and is re-exported here.

**Common enemies** (too-much-in-common §3.3, eq. 5-6). For a softmax output layer, logits = h Wᵀ (+ b) over an
embedding matrix W (tied to the input embeddings or not), the gradient of the cross-entropy on W splits into
the target part -- row t pulled towards h, −(1 − p_t) h -- and the non-target part -- every other row j
pushed away along the same h, p_j h. Within one prediction all non-target rows receive parallel gradients:
the "common enemies" effect, which the paper blames for the common direction shared by all embeddings.
:func:`softmax_gradient_split` computes the two parts and :func:`common_enemies_alignment` measures how the
non-target part aligns with W's mean vector and first principal direction.

Conventions as in :mod:`isojax.metrics`: plain functions (the caller jits), float hyperparameters traced, and
its bad-input rule (padding rows never count; a NaN or inf in a counted row raises ``ValueError`` when concrete
and gives NaN when traced; no decomposition sees a non-finite matrix). The gradients of the scale-invariant
measures (cosine regularisation, IsoScore and its loss) are homogeneous of degree −1 and are computed on the
cloud divided by a power of two (exact), so they hold at any finite float32 scale.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from isojax import losses, metrics
from isojax._numeric import HIGHEST, finite_matrix, promote_float32, safe_div, safe_norm
from isojax._stats import IDENTICAL_VARIANCE, centered_rows, covariance, masked_rows, unit_rows, unit_scale
from isojax._validate import (
    check_cloud,
    check_finite_rows,
    check_float,
    check_hyperparameter,
    check_points,
    check_square,
    nan_unless,
)
from isojax.softdecay import softdecay_derivative
from isojax.spectral import SpectralDerivative, spectral_derivative
from isojax.topology import persistent_entropy_loss_grad

__all__ = [
    "cosine_regularization_grad",
    "spectrum_polynomial_grad",
    "spectrum_exponential_grad",
    "isoscore_grad",
    "isoscore_star_grad",
    "isoscore_loss_grad",
    "istar_loss_grad",
    "persistent_entropy_loss_grad",
    "SpectralDerivative",
    "spectral_derivative",
    "softdecay_derivative",
    "SoftmaxGradients",
    "softmax_gradient_split",
    "CommonEnemiesAlignment",
    "common_enemies_alignment",
]


# ----------------------------------------------------------------------------------------------
# Cosine regularisation and spectrum control
# ----------------------------------------------------------------------------------------------
def cosine_regularization_grad(w, *, mask=None, weight=1.0):
    """Closed-form gradient of :func:`isojax.losses.cosine_regularization` with respect to ``w``.

    R = λ (‖s‖² − Σ_i ‖ŵ_i‖²) / N² with s = Σ_i ŵ_i over the N real rows and ŵ = w / ‖w‖. The second sum
    counts the non-zero rows (constant), and ∂ŵ_i/∂w_i = (I − ŵ_iŵ_iᵀ) / ‖w_i‖, so

        ∂R/∂w_i = 2λ / (N² ‖w_i‖) · (I − ŵ_iŵ_iᵀ) s,

    the component of the summed direction s orthogonal to w_i: a descent step rotates every row away from the
    mean direction (its norm does not change to first order), more strongly the shorter the row. Zero rows
    and padding rows get 0.

    Args:
      w: ``[..., N, d]`` float matrix (N ≥ 2), as in :func:`isojax.losses.cosine_regularization`.
      mask: optional ``[..., N]`` bool, true = real row.
      weight: λ (traced).

    Returns:
      ``[..., N, d]`` gradient, in ``w``'s dtype.

    Examples:
      Two orthogonal unit rows, ``s = (1, 1)``: each row's gradient is ``2 / 4 · (I − ŵŵᵀ) s``, the other row's
      direction halved.

      >>> import numpy as np
      >>> from isojax import gradients
      >>> g = gradients.cosine_regularization_grad(np.eye(2, dtype=np.float32))
      >>> np.allclose(g, [[0, 0.5], [0.5, 0]], atol=1e-6)
      True
    """
    w, mask, ok = check_cloud(w, mask, "w", min_n=2)
    weight, _ = check_hyperparameter(weight, "weight")
    rows, scale = unit_scale(promote_float32(w), mask)  # the gradient of a 0-homogeneous R is (−1)-homogeneous
    rows, _, count = masked_rows(rows, mask)
    norms = safe_norm(rows, keepdims=True)
    unit = unit_rows(rows)
    total = jnp.sum(unit, axis=-2, keepdims=True)
    orthogonal = total - jnp.sum(unit * total, axis=-1, keepdims=True) * unit
    grad = 2 * weight * safe_div(safe_div(orthogonal, norms), count[..., None, None] ** 2)
    return nan_unless(ok, (grad / scale[..., None, None]).astype(w.dtype))


def _spectrum_grad(w, prior, weight):
    """λ Σ_k 2 (σ_k − prior_k) u_k v_kᵀ = U diag(2λ(σ − prior)) Vᵀ (thin SVD)."""
    weight, _ = check_hyperparameter(weight, "weight")
    matrix, ok = finite_matrix(promote_float32(w))  # the SVD never sees a non-finite matrix: NaN out instead
    u, sigma, vt = jnp.linalg.svd(matrix, full_matrices=False)
    scale = 2 * weight * (sigma - prior)
    return nan_unless(ok, jnp.matmul(u * scale[..., None, :], vt, precision=HIGHEST).astype(w.dtype))


def spectrum_polynomial_grad(w, *, c1, gamma, weight=1.0):
    """Closed-form gradient of :func:`isojax.losses.spectrum_polynomial` with respect to ``w``.

    R = λ Σ_k (σ_k − c1 k^γ)² and ∂σ_k/∂W = u_k v_kᵀ (u_k, v_k the k-th left/right singular vectors), so

        ∂R/∂W = Σ_k 2λ (σ_k − c1 k^γ) u_k v_kᵀ = U diag(2λ(σ − c1 k^γ)) Vᵀ.

    Where singular values repeat (σ_k = σ_{k+1} with different priors, e.g. the zeros of a rank-deficient W)
    the sorted singular values have no unique derivative and the value depends on the basis the SVD solver
    picks inside the repeated block; this returns the same element as ``jax.grad`` (the same thin SVD).

    Args:
      w: ``[..., V, d]`` float matrix, as in :func:`isojax.losses.spectrum_polynomial`.
      c1: scale of the prior (traced).
      gamma: decay exponent γ (traced).
      weight: λ (traced).

    Returns:
      ``[..., V, d]`` gradient, in ``w``'s dtype.

    Examples:
      ``W = diag(2, 1)``, flat prior 1: ``U diag(2(σ − 1)) Vᵀ = diag(2, 0)``.

      >>> import numpy as np
      >>> from isojax import gradients
      >>> g = gradients.spectrum_polynomial_grad(np.diag([2.0, 1.0]).astype(np.float32), c1=1.0, gamma=0.0)
      >>> np.allclose(g, [[2.0, 0.0], [0.0, 0.0]], atol=1e-5)
      True
    """
    w = check_cloud(w, None, "w")[0]
    return _spectrum_grad(w, losses.polynomial_decay(min(w.shape[-2:]), c1=c1, gamma=gamma), weight)


def spectrum_exponential_grad(w, *, c1, c2, gamma, weight=1.0):
    """Closed-form gradient of :func:`isojax.losses.spectrum_exponential`:
    ∂R/∂W = U diag(2λ(σ − c1 exp(−c2 k^γ))) Vᵀ (see :func:`spectrum_polynomial_grad`).

    Args:
      w: ``[..., V, d]`` float matrix, as in :func:`isojax.losses.spectrum_exponential`.
      c1: scale of the prior (traced).
      c2: rate (traced).
      gamma: exponent γ of k (traced).
      weight: λ (traced).

    Returns:
      ``[..., V, d]`` gradient, in ``w``'s dtype.

    Examples:
      ``W = diag(2, 1)``, prior ``exp(−k)``: ``diag(2(2 − e^−1), 2(1 − e^−2))``.

      >>> import numpy as np
      >>> from isojax import gradients
      >>> g = gradients.spectrum_exponential_grad(np.diag([2.0, 1.0]).astype(np.float32), c1=1.0, c2=1.0, gamma=1.0)
      >>> np.allclose(g, np.diag([2 * (2 - np.exp(-1)), 2 * (1 - np.exp(-2))]), atol=1e-5)
      True
    """
    w = check_cloud(w, None, "w")[0]
    return _spectrum_grad(w, losses.exponential_decay(min(w.shape[-2:]), c1=c1, c2=c2, gamma=gamma), weight)


# ----------------------------------------------------------------------------------------------
# IsoScore and IsoScore*
# ----------------------------------------------------------------------------------------------
def _isoscore_star_grad(x, mask, c0, zeta):
    """∂IsoScore*/∂x of checked input (ζ = 0 with ``c0=None``: IsoScore); see :func:`isoscore_grad`.

    IsoScore (``c0=None``, ζ = 0) is scale-invariant, so its gradient is computed on ``x / s`` (a power of two,
    exact) and divided by ``s``; IsoScore* is not (ζ·C0 sets a scale) and is computed on ``x`` itself."""
    scale = None
    if c0 is None and isinstance(zeta, float) and zeta == 0:
        x, scale = unit_scale(x, mask)
    x32 = promote_float32(x)
    xc, _, count = centered_rows(x32, mask)
    _, cov = covariance(x32, mask)
    d = x.shape[-1]
    reference = jnp.eye(d, dtype=cov.dtype) if c0 is None else promote_float32(c0)
    shrunk = (1 - zeta) * cov + zeta * reference
    trace = jnp.trace(shrunk, axis1=-2, axis2=-1)[..., None, None]
    sq_norm = jnp.sum(shrunk**2, axis=(-2, -1))[..., None, None]
    # IsoScore: rows identical up to rounding have score 0 and a zero gradient (isojax.metrics.isoscore)
    spread = trace > d * IDENTICAL_VARIANCE if scale is not None else jnp.ones_like(trace, bool)
    trace, sq_norm = jnp.where(spread, trace, 1), jnp.where(spread, sq_norm, 1)
    eye = jnp.eye(d, dtype=cov.dtype)
    d_score = (1 - zeta) * (safe_div(2 * trace, sq_norm) * eye - 2 * safe_div(trace, sq_norm) ** 2 * shrunk) / (d - 1)
    grad = 2 * jnp.matmul(xc, d_score, precision=HIGHEST) / jnp.maximum(count - 1, 1)[..., None, None]
    grad = jnp.where(spread, grad, 0)
    if scale is not None:
        grad = grad / scale[..., None, None]
    return grad.astype(x.dtype)


def isoscore_grad(x, *, mask=None):
    """Closed-form gradient of :func:`isojax.metrics.isoscore` with respect to ``x``, through the covariance
    spectrum.

    IsoScore = g(λ) with λ the eigenvalues of the sample covariance C (ddof=1) and
    g(λ) = ((Σλ)² / Σλ² − 1) / (d − 1) (see :func:`isojax.metrics.isoscore`). With S = Σλ = tr C and
    Q = Σλ² = ‖C‖_F²,

        ∂g/∂λ_k = (2S/Q − 2S²λ_k/Q²) / (d − 1).

    The eigenvalues move as ∂λ_k/∂C = u_k u_kᵀ (C = U diag(λ) Uᵀ), so

        ∂IsoScore/∂C = U diag(∂g/∂λ) Uᵀ = (2S/Q · I − 2S²/Q² · C) / (d − 1),

    because U Uᵀ = I and U diag(λ) Uᵀ = C. The eigenvectors cancel: the result is a polynomial in C, so repeated
    (degenerate) eigenvalues, where individual eigenvectors are undefined, give the same, correct answer --
    as they must, since g is symmetric in λ (Lewis 1996: a symmetric function of the eigenvalues has gradient
    U diag(∇g) Uᵀ whatever basis U of a repeated eigenspace is taken). Finally C = Σ_i (x_i − μ)(x_i − μ)ᵀ /
    (N − 1) over the N real rows, and Σ_i (x_i − μ) = 0 removes the mean's contribution:

        ∂IsoScore/∂x_i = 2 / (N − 1) · ∂IsoScore/∂C · (x_i − μ)     (real rows; padding rows get 0).

    A zero covariance (identical points, score 0 by definition) gets a zero gradient.

    Args:
      x: ``[..., n, d]`` float array, n ≥ 2 real rows, d ≥ 2.
      mask: optional ``[..., n]`` bool, true = real row.

    Returns:
      ``[..., n, d]`` gradient, in ``x``'s dtype.

    Examples:
      Zero at an isotropic cloud (IsoScore's maximum), and a central finite difference elsewhere.

      >>> import numpy as np
      >>> from isojax import gradients, metrics
      >>> cross = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], np.float32)
      >>> np.allclose(gradients.isoscore_grad(cross), 0.0, atol=1e-6)
      True
      >>> x = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
      >>> e = np.zeros_like(x)
      >>> e[0, 0] = 1e-3
      >>> g = gradients.isoscore_grad(x)
      >>> fd = (float(metrics.isoscore(x + e)) - float(metrics.isoscore(x - e))) / 2e-3
      >>> bool(np.isclose(float(g[0, 0]), fd, atol=1e-3))
      True
    """
    x, mask, ok = check_cloud(x, mask, min_n=2, min_d=2)
    return nan_unless(ok, _isoscore_star_grad(x, mask, None, 0.0))


def isoscore_star_grad(x, *, c0=None, zeta=0.2, mask=None):
    """Closed-form gradient of :func:`isojax.metrics.isoscore_star` with respect to ``x``.

    As :func:`isoscore_grad` with the shrunk covariance C_ζ = (1 − ζ)C + ζC0 (C0 = I when ``c0`` is None) in
    place of C, and the chain factor ∂C_ζ/∂C = (1 − ζ):

        ∂IsoScore*/∂x_i = 2(1 − ζ) / (N − 1) · (2S/Q · I − 2S²/Q² · C_ζ) (x_i − μ) / (d − 1),

    S = tr C_ζ, Q = ‖C_ζ‖_F². A traced ζ outside [0, 1] gives NaN.

    Args:
      x: ``[..., n, d]`` float array (n ≥ 2, d ≥ 2), as in :func:`isojax.metrics.isoscore_star`.
      c0: optional ``[d, d]`` (or broadcastable ``[..., d, d]``) symmetric PSD reference covariance; None = identity.
      zeta: shrinkage weight ζ in [0, 1] (traced).
      mask: optional ``[..., n]`` bool, true = real row.

    Returns:
      ``[..., n, d]`` gradient, in ``x``'s dtype.

    Examples:
      Two points ``∓e_1`` with ``ζ = 0.5``: ``C_ζ = diag(1.5, 0.5)``, ``S = 2``, ``Q = 2.5``, so the gradient of
      ``x_i`` is ``(1.6 I − 1.28 C_ζ) x_i = diag(−0.32, 0.96) x_i``: spreading the line further lowers the score.

      >>> import numpy as np
      >>> from isojax import gradients
      >>> line = np.array([[-1.0, 0.0], [1.0, 0.0]], np.float32)
      >>> np.allclose(gradients.isoscore_star_grad(line, zeta=0.5), [[0.32, 0.0], [-0.32, 0.0]], atol=1e-5)
      True
    """
    x, mask, ok = check_cloud(x, mask, min_n=2, min_d=2)
    zeta, zeta_ok = check_hyperparameter(zeta, "zeta", low=0.0, high=1.0)
    c0 = None if c0 is None else check_square(c0, "c0", x.shape[-1])
    return nan_unless(ok, nan_unless(zeta_ok, _isoscore_star_grad(x, mask, c0, zeta)))


def isoscore_loss_grad(x, *, mask=None, eps=1e-6):
    """Closed-form gradient of :func:`isojax.losses.isoscore_loss` = −log(max(IsoScore, 0) + ε):
    ∂L/∂x = −[IsoScore > 0] / (IsoScore + ε) · ∂IsoScore/∂x (:func:`isoscore_grad`).

    Args:
      x: ``[..., n, d]`` float array (n ≥ 2, d ≥ 2), as in :func:`isojax.losses.isoscore_loss`.
      mask: optional ``[..., n]`` bool, true = real row.
      eps: positive floor ε inside the log (traced; a traced eps ≤ 0 gives NaN).

    Returns:
      ``[..., n, d]`` gradient, in ``x``'s dtype.

    Examples:
      Against a central finite difference of :func:`isojax.losses.isoscore_loss`:

      >>> import numpy as np
      >>> from isojax import gradients, losses
      >>> x = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
      >>> e = np.zeros_like(x)
      >>> e[0, 0] = 1e-3
      >>> g = gradients.isoscore_loss_grad(x)
      >>> fd = (float(losses.isoscore_loss(x + e)) - float(losses.isoscore_loss(x - e))) / 2e-3
      >>> bool(np.isclose(float(g[0, 0]), fd, atol=2e-3))
      True
    """
    eps, eps_ok = check_hyperparameter(eps, "eps", low=0.0, low_open=True)
    score = metrics.isoscore(x, mask=mask)
    factor = jnp.where(score > 0, -1 / (jnp.where(score > 0, score, 0) + eps), 0)
    return nan_unless(eps_ok, (factor[..., None, None] * isoscore_grad(x, mask=mask)).astype(x.dtype))


def istar_loss_grad(x, *, c0=None, zeta=0.2, mask=None, weight=1.0):
    """Closed-form gradient of :func:`isojax.losses.istar_loss` = λ(1 − IsoScore*):
    ∂L/∂x = −λ ∂IsoScore*/∂x (:func:`isoscore_star_grad`).

    Args:
      x: ``[..., n, d]`` float array (n ≥ 2, d ≥ 2), as in :func:`isojax.losses.istar_loss`.
      c0: optional ``[d, d]`` (or broadcastable ``[..., d, d]``) symmetric PSD reference covariance; None = identity.
      zeta: shrinkage weight ζ in [0, 1] (traced).
      mask: optional ``[..., n]`` bool, true = real row.
      weight: λ (traced).

    Returns:
      ``[..., n, d]`` gradient, in ``x``'s dtype.

    Examples:
      ``−λ`` times the IsoScore* gradient of the two points ``∓e_1`` (see :func:`isoscore_star_grad`).

      >>> import numpy as np
      >>> from isojax import gradients
      >>> line = np.array([[-1.0, 0.0], [1.0, 0.0]], np.float32)
      >>> np.allclose(gradients.istar_loss_grad(line, zeta=0.5, weight=2.0), [[-0.64, 0.0], [0.64, 0.0]], atol=1e-5)
      True
    """
    weight, _ = check_hyperparameter(weight, "weight")
    return -weight * isoscore_star_grad(x, c0=c0, zeta=zeta, mask=mask)


# ----------------------------------------------------------------------------------------------
# Common enemies (too-much-in-common §3.3)
# ----------------------------------------------------------------------------------------------
class SoftmaxGradients(NamedTuple):
    """The gradient of a softmax layer's mean cross-entropy on its embedding matrix W, split by rows' roles.

    Attributes:
      loss: ``[]`` the weighted mean cross-entropy L = Σ_n ω_n CE_n.
      target: ``[V, d]`` the target part Σ_n ω_n (−(1 − p_{n,t_n})) e_{t_n} h_nᵀ: row t_n pulled towards h_n.
      non_target: ``[V, d]`` the non-target part Σ_n ω_n Σ_{j≠t_n} p_{n,j} e_j h_nᵀ: row j pushed along h_n.
    """

    loss: jax.Array
    target: jax.Array
    non_target: jax.Array

    @property
    def full(self) -> jax.Array:
        """``[V, d]`` ∂L/∂W = target + non_target (too-much-in-common eq. 5)."""
        return self.target + self.non_target


def softmax_gradient_split(w, h, targets, *, bias=None, weights=None) -> SoftmaxGradients:
    """Split ∂L/∂W of a softmax layer's mean cross-entropy into its target and non-target parts.

    logits_n = W h_n (+ b), p_n = softmax(logits_n), CE_n = −log p_{n,t_n}, L = Σ_n ω_n CE_n with
    ω_n = weights_n / Σ weights (1/N without weights; a mask works as 0/1 weights, e.g. the masked positions
    of an MLM batch). The gradient on W (too-much-in-common eq. 5, summed over the predictions) is

        ∂L/∂W = Σ_n ω_n (p_n − e_{t_n}) h_nᵀ
              = Σ_n ω_n (−(1 − p_{n,t_n})) e_{t_n} h_nᵀ   +   Σ_n ω_n Σ_{j≠t_n} p_{n,j} e_j h_nᵀ,
                 target part                                  non-target part

    so a gradient step W ← W − η ∂L/∂W (eq. 6) moves every non-target row j by −η ω_n p_{n,j} h_n: for one
    prediction all of them along the same direction −h_n -- the common enemies. The target coefficient
    1 − p_t is computed as Σ_{j≠t} p_j (accurate when p_t → 1, where 1 − p_t would round to 0), so the target
    row receives exactly minus the total non-target weight; the parts sum to ``jax.grad`` of the loss.
    Only the output-layer path is covered; when W is tied to the input embeddings its gradient also has an
    input-side part (the paper, too, studies the output side).

    Args:
      w: ``[V, d]`` output embedding matrix (vocabulary V).
      h: ``[N, d]`` output vectors (e.g. the transformed hidden states of the masked positions).
      targets: ``[N]`` integer target ids in [0, V) (checked when concrete).
      bias: optional ``[V]`` output bias.
      weights: optional ``[N]`` non-negative weights or a bool mask (true = counts).

    Returns:
      :class:`SoftmaxGradients` (``loss []``, ``target`` and ``non_target`` ``[V, d]``) in the promoted dtype of
      ``w`` and ``h``, at least float32.

    Examples:
      ``W = 0``: the softmax over 3 rows is uniform, so the target row gets ``−(1 − 1/3) h`` and each other row
      ``1/3 · h``; the loss is ``log 3``.

      >>> import numpy as np
      >>> from isojax import gradients
      >>> split = gradients.softmax_gradient_split(
      ...     np.zeros((3, 2), np.float32), np.array([[1.0, 0.0]], np.float32), np.array([0])
      ... )
      >>> round(float(split.loss), 4), round(float(np.log(3)), 4)
      (1.0986, 1.0986)
      >>> np.allclose(split.target, [[-2 / 3, 0], [0, 0], [0, 0]])
      True
      >>> np.allclose(split.non_target, [[0, 0], [1 / 3, 0], [1 / 3, 0]])
      True
    """
    w = _check_matrix(w)
    h = check_float(h, "h")
    if h.ndim != 2 or h.shape[1] != w.shape[1]:
        raise ValueError(f"h must have shape [N, {w.shape[1]}] (d of w), got {h.shape}")
    ok = check_finite_rows(w, None, "w") & check_finite_rows(h, None, "h")
    targets = _check_targets(targets, h.shape[0], w.shape[0])
    work = jnp.promote_types(jnp.promote_types(w.dtype, h.dtype), jnp.float32)
    w, h = w.astype(work), h.astype(work)
    logits = jnp.matmul(h, w.T, precision=HIGHEST)
    if bias is not None:
        bias = check_float(bias, "bias")
        if bias.shape != (w.shape[0],):
            raise ValueError(f"bias must have shape ({w.shape[0]},) (one per row of w), got {bias.shape}")
        logits = logits + bias.astype(work)
    omega = _example_weights(weights, h.shape[0], work)
    log_p = jax.nn.log_softmax(logits, axis=-1)
    is_target = jax.nn.one_hot(targets, w.shape[0], dtype=bool)
    pushes = jnp.where(is_target, 0, jnp.exp(log_p)) * omega[:, None]  # [N, V]: ω_n p_{n,j}, j ≠ t_n
    non_target = jnp.matmul(pushes.T, h, precision=HIGHEST)
    target = jnp.zeros_like(w).at[targets].add(-jnp.sum(pushes, axis=1)[:, None] * h)  # ω_n (1 − p_t) = Σ_{j≠t}
    loss = -jnp.sum(omega * jnp.sum(jnp.where(is_target, log_p, 0), axis=1))
    return nan_unless(ok, SoftmaxGradients(loss=loss, target=target, non_target=non_target))


def _check_matrix(w):
    """An embedding matrix ``[V, d]`` (V >= 2, no batch axes)."""
    w = check_points(w, "w", min_n=2)
    if w.ndim != 2:
        raise ValueError(f"w must have shape [V, d], got {w.shape}")
    return w


def _check_targets(targets, n: int, vocab: int):
    concrete = None if isinstance(targets, jax.core.Tracer) else np.asarray(targets)
    targets = jnp.asarray(targets)
    if targets.shape != (n,):
        raise ValueError(f"targets must have shape ({n},) (one per row of h), got {targets.shape}")
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise TypeError(f"targets must be integer ids, got {targets.dtype}")
    if concrete is not None and not np.all((concrete >= 0) & (concrete < vocab)):
        raise ValueError(f"targets must lie in [0, V) = [0, {vocab})")
    return targets


def _example_weights(weights, n: int, dtype):
    """ω_n = weights_n / Σ weights (uniform 1/N without weights; all zero if every weight is 0)."""
    if weights is None:
        return jnp.full((n,), 1 / n, dtype)
    weights = jnp.asarray(weights)
    if weights.shape != (n,):
        raise ValueError(f"weights must have shape ({n},) (one per row of h), got {weights.shape}")
    if not isinstance(weights, jax.core.Tracer) and np.any(np.asarray(weights) < 0):
        raise ValueError("weights must be non-negative")
    weights = weights.astype(dtype)
    return safe_div(weights, jnp.sum(weights))


class CommonEnemiesAlignment(NamedTuple):
    """How gradient rows g_j (e.g. :attr:`SoftmaxGradients.non_target`) align with W's common direction.

    The descent direction −g is compared with the mean embedding μ = mean_j w_j and with the first principal
    direction v_1 of W (top right singular vector of the centered W, an axis: its sign is arbitrary, so the
    absolute cosine is reported).

    Attributes:
      mean_cosine: ``[]`` cos(−Σ_j g_j, μ): > 0 when the step moves the rows, on the whole, further along
        their shared mean direction (≈ 1: the common enemies drive the common shift).
      principal_cosine: ``[]`` ``|cos(Σ_j g_j, v_1)|``.
      row_mean_cosines: ``[V]`` cos(−g_j, μ) for each row (0 for a zero gradient row or a padding row).
      row_principal_cosines: ``[V]`` ``|cos(g_j, v_1)|`` for each row.
      coherence: ``[]`` the mean cosine between distinct rows' gradients (TokenUni of the rows g_j): 1 when all
        rows are pushed along one direction.
    """

    mean_cosine: jax.Array
    principal_cosine: jax.Array
    row_mean_cosines: jax.Array
    row_principal_cosines: jax.Array
    coherence: jax.Array


def _cosine(a, b):
    """Cosine of the last axes of ``a`` and ``b`` (0 when either is zero)."""
    return safe_div(jnp.sum(a * b, axis=-1), safe_norm(a) * safe_norm(b))


def common_enemies_alignment(w, grad, *, mask=None) -> CommonEnemiesAlignment:
    """Alignment of the gradient rows ``grad`` with the mean vector and first principal direction of ``w``.

    μ = mean of the real rows of W; v_1 = the eigenvector of the largest eigenvalue of their covariance (the
    top right singular vector of the centered W). See :class:`CommonEnemiesAlignment` for the measures. No
    gradient flows through the result's directions (they are measurements).

    Args:
      w: ``[V, d]`` embedding matrix.
      grad: ``[V, d]`` gradient rows, e.g. ``softmax_gradient_split(...).non_target``.
      mask: optional ``[V]`` bool, true = the row counts (e.g. leave out special or unused tokens).

    Returns:
      :class:`CommonEnemiesAlignment` (float32, or ``w``'s dtype if wider).

    Examples:
      Rows ``(1, 1)`` and ``(3, −1)`` (mean ``(2, 0)``, principal axis ``(1, −1)/√2``), both pushed along ``+e_1``
      (gradient rows ``−e_1``): the step follows the mean exactly, at 45° to the principal axis, and the rows move
      in parallel.

      >>> import numpy as np
      >>> from isojax import gradients
      >>> w = np.array([[1.0, 1.0], [3.0, -1.0]], np.float32)
      >>> out = gradients.common_enemies_alignment(w, np.array([[-1.0, 0.0], [-1.0, 0.0]], np.float32))
      >>> round(float(out.mean_cosine), 4), round(float(out.principal_cosine), 4), round(float(out.coherence), 4)
      (1.0, 0.7071, 1.0)
    """
    w = _check_matrix(w)
    grad = check_float(grad, "grad")
    if grad.shape != w.shape:
        raise ValueError(f"grad must have the shape of w {w.shape}, got {grad.shape}")
    w, mask, ok = check_cloud(w, mask, "w", min_n=2)  # the principal direction needs a covariance
    ok = ok & check_finite_rows(grad, mask, "grad")
    w = jax.lax.stop_gradient(promote_float32(w))
    grad, _, _ = masked_rows(grad.astype(w.dtype), mask)
    mean, cov = covariance(w, mask)
    cov, cov_ok = finite_matrix(cov)
    principal = jnp.linalg.eigh(cov)[1][:, -1]
    total = jnp.sum(grad, axis=0)
    return nan_unless(
        ok & cov_ok,
        CommonEnemiesAlignment(
            mean_cosine=_cosine(-total, mean),
            principal_cosine=jnp.abs(_cosine(total, principal)),
            row_mean_cosines=_cosine(-grad, mean),
            row_principal_cosines=jnp.abs(_cosine(grad, principal)),
            coherence=metrics.token_uniformity(grad, mask=mask),
        ),
    )
