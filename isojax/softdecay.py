"""SoftDecay (softdecay-token-uniformity, §4.3 eq. 2 and Algorithm 1): raise the small singular values of a
set of representations, keeping the largest one.

    f(σ) = −ln(1 − α(σ + α)) / α,   α ∈ [−1, 0)                                   (eq. 2)
    X = U diag(σ) Vᵀ  ->  X̃ = U diag(K f(σ)) Vᵀ,   K = max σ / max f(σ)          (Algorithm 1)

Two uses: per sequence over the ``[L, H]`` token states of each example (fine-tuning, learnable α; pass the
attention mask) and over a whole ``[N, d]`` matrix of sentence embeddings (unsupervised STS, fixed α).
:func:`softdecay_derivative` gives the transform's derivative as an explicit linear operator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from isojax._validate import check_float, check_points
from isojax.spectral import SpectralDerivative, spectral_derivative, spectral_map, working_dtype

__all__ = ["SoftDecay", "alpha_from_param", "decay_curve", "soft_decay", "softdecay_derivative"]

_THETA_CLIP = 30.0  # |θ| bound of the SoftDecay module's parameter (see alpha_from_param)


def decay_curve(s, alpha):
    """SoftDecay's scalar function (eq. 2), ``f(σ) = −ln(1 − α(σ + α))/α = ln(1 + a(σ − a))/a`` with ``a = −α``.

    Elementwise over ``s`` (any shape, ``s > 0``), ``alpha`` broadcastable. Monotone increasing and concave
    for α < 0, with ``f(σ) < σ``; note ``f(0) = −ln(1 − α²)/α < 0``, so ``f(σ) < 0`` for ``σ < |α|``.
    For ``α ∈ [−1, 0)`` and ``σ > 0`` the log argument ``1 + a(σ − a) = (1 − a)(1 + a) + aσ`` is positive,
    so no epsilon is added (the authors' code adds 1e-7 inside the log, a change of at most ``1e-7/(|α|·arg)``).
    It is computed as ``log1p(a(σ − a))`` when that argument is ≥ −1/2 (accurate for small ``|α|``) and as
    ``log((1 − a)(1 + a) + aσ)`` otherwise (accurate for α → −1, where it becomes ``ln σ``).

    Args:
      s: float array of singular values, any shape, ``s > 0``.
      alpha: float α in ``[−1, 0)``, broadcastable against ``s`` (not checked here; see :func:`soft_decay`).

    Returns:
      ``f(s)``, the broadcast shape of ``s`` and ``alpha``, in their promoted float dtype.

    Examples:
      ``α = −0.5``, ``σ = 1``: ``f = ln(1 + 0.5 · 0.5) / 0.5 = 2 ln 1.25``.

      >>> import numpy as np
      >>> from isojax import softdecay
      >>> round(float(softdecay.decay_curve(1.0, -0.5)), 4), round(float(2 * np.log(1.25)), 4)
      (0.4463, 0.4463)
    """
    a = -alpha
    arg = a * (s - a)
    small = arg >= -0.5
    log_c = jnp.where(
        small, jnp.log1p(jnp.where(small, arg, 0)), jnp.log(jnp.where(small, 1, (1 - a) * (1 + a) + a * s))
    )
    return log_c / a


def _check_alpha(alpha, dtype):
    """Scalar α as an array of ``dtype``; ValueError for a concrete α outside [−1, 0)."""
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):  # Python numbers, or floating arrays
        alpha = check_float(alpha, "alpha")
    alpha = jnp.asarray(alpha)
    if alpha.ndim != 0:
        raise ValueError(f"alpha must be a scalar, got shape {alpha.shape} (vmap over alpha for several values)")
    if not isinstance(alpha, jax.core.Tracer) and not -1.0 <= float(alpha) < 0.0:
        raise ValueError(
            f"alpha must satisfy -1 <= alpha < 0, got {float(alpha)}: for alpha >= 0 the log "
            "argument 1 - alpha(s + alpha) turns negative for large s, for alpha < -1 it is "
            "negative for s < |alpha| - 1/|alpha|"
        )
    return alpha.astype(dtype)


def _rescale_factor(s_max, alpha):
    """Algorithm 1's ``K = σ_max / f(σ_max)`` (steps 3–4) for ``s_max [...]``, kept finite (see :func:`soft_decay`):
    a zero matrix (``σ_max = 0``) gets ``K = 1/f(1)``, and ``|f(σ_max)|`` is floored at ``eps·σ_max``."""
    s_top = jnp.where(s_max > 0, s_max, 1)  # zero matrix: y = 0 whatever K is; keep K and its gradient finite
    f_top = decay_curve(s_top, alpha)
    floor = jnp.finfo(s_top.dtype).eps * s_top
    return s_top / jnp.where(jnp.abs(f_top) >= floor, f_top, floor)


def soft_decay(x, alpha, *, mask=None, rescale: bool = True, method: str | Callable = "auto"):
    """SoftDecay transform of each ``[n, d]`` matrix in ``x`` (Algorithm 1, eq. 2).

    ``X = U diag(σ) Vᵀ -> X̃ = Σ_i K f(σ_i) u_i v_iᵀ`` with ``f`` = :func:`decay_curve` and
    ``K = σ_max / f(σ_max)`` (``K = 1`` when ``rescale=False``); ``f`` is increasing, so ``K f(σ_max) = σ_max``:
    the largest singular value is kept and the order of the others too. They rise relative to it,
    ``K f(σ_i) ≥ σ_i``, wherever ``f(σ)/σ`` decreases, which is ``σ ≥ σ*(α)`` with ``σ*`` between √2 and e
    (so for all ``σ_i ≥ e`` whatever α); below that the paper's property (2) fails: ``f(0) < 0``, so values
    ``σ < |α|`` map to ``K f(σ) < 0`` (a sign flip of that singular pair).

    Args:
      x: ``[..., n, d]`` floating; bf16/float16 inputs are decomposed in float32, the result has ``x.dtype``.
        ``[B, L, H]`` token states give one transform per sequence; an ``[N, d]`` embedding matrix one transform
        over all rows.
      alpha: scalar in ``[−1, 0)`` (the paper uses −0.2 … −1.0). A concrete value outside raises ValueError.
        A traced value (under ``jit``/``grad``) cannot be checked at trace time: outside ``[−1, 0)`` the whole
        output is NaN (loud, never a silently clamped α); :class:`SoftDecay` cannot produce such an α.
      mask: optional ``[..., n]`` boolean, true = real row (token). Masked rows are left out of the SVD and come
        back as zeros, whatever they hold (NaN and inf included).
      rescale: apply Algorithm 1's ``K`` (steps 3–4).
      method: how the SVD is computed: ``"auto"`` (chosen per platform and shape), ``"svd"``, ``"gram_eigh_f64"``
        or a decomposition callable (:func:`isojax.spectral.select_method`; the SoftDecay guide gives the rule,
        ``docs/design/spectral.md`` the measurements). ``ValueError`` for an unknown name or one the backend
        cannot lower.

    Null space: singular values ``σ ≤ max(n, d)·eps·σ_max`` (zero up to rounding: padding, repeated rows,
    rank deficiency) contribute nothing, instead of ``K f(0) u vᵀ`` with arbitrary thin-SVD vectors that
    Algorithm 1 taken literally would add (``f(0) ≠ 0``); see :func:`isojax.spectral.spectral_map`. On full-rank
    input this is exactly Algorithm 1. A zero matrix maps to zero.

    Small inputs: Algorithm 1 assumes ``σ_max > |α|``. For ``σ_max < |α|``, ``f(σ_max) < 0`` and K is negative
    (the literal formula, kept); at ``σ_max = |α|`` K has a pole, and ``|f(σ_max)|`` is bounded below by
    ``eps·σ_max`` so that the output stays finite.

    Non-finite input: a NaN or inf in a real row raises ``ValueError`` naming the row for concrete input; traced,
    that matrix's output is NaN, and the SVD never sees it (zeros are decomposed in its place, see
    :mod:`isojax.spectral`): a step whose activations overflow fails loudly instead of hanging. Range: SoftDecay
    is not scale-invariant (α acts on the singular values themselves); ``svd`` handles any finite float32 input,
    ``gram_eigh_f64`` squares it and needs ``|x|`` below about 1e19.

    Gradients with respect to ``x`` and ``alpha`` are exact where singular values are distinct or repeated
    (not at a repeated ``σ_max``, where ``max`` has no derivative) and finite everywhere (custom JVP of
    :func:`isojax.spectral.spectral_map`); works under ``jit``, ``vmap``, ``grad`` and sharding.

    Returns:
      ``[..., n, d]`` array of ``x.dtype``.

    Examples:
      ``X = diag(2, 1)``, ``α = −0.5``: the largest singular value stays 2 and the other becomes
      ``2 f(1) / f(2) = 2 ln 1.25 / ln 1.75``.

      >>> import numpy as np
      >>> from isojax import softdecay
      >>> y = softdecay.soft_decay(np.diag([2.0, 1.0]).astype(np.float32), -0.5)
      >>> sigma = np.linalg.svd(np.asarray(y, np.float64), compute_uv=False)
      >>> np.round(sigma, 4).tolist(), round(float(2 * np.log(1.25) / np.log(1.75)), 4)
      ([2.0, 0.7975], 0.7975)
    """
    x = check_points(x, "x")
    work = working_dtype(x.dtype)
    alpha = _check_alpha(alpha, work)
    y, s = spectral_map(x.astype(work), decay_curve, alpha, mask=mask, method=method)
    if rescale:
        y = y * _rescale_factor(s[..., 0], alpha)[..., None, None]
    y = jnp.where((alpha >= -1) & (alpha < 0), y, jnp.nan)
    return y.astype(x.dtype)


def softdecay_derivative(
    x, alpha, *, mask=None, rescale: bool = True, method: str | Callable = "auto"
) -> SpectralDerivative:
    """The derivative of ``soft_decay(x, alpha, mask=mask, rescale=rescale, method=method)`` at ``(x, alpha)`` as an
    explicit linear operator (:class:`isojax.spectral.SpectralDerivative`, whose docstring gives its structure).

    With ``Y = Σ_live f(σ_i) u_i v_iᵀ`` and ``X̃ = K Y`` (``K = σ_max/f(σ_max)``, or 1 without rescale)::

        dX̃ = K · [U (A ∘ sym(dP) + B ∘ skew(dP) + diag(∂f/∂α) dα) Vᵀ + complement terms]
             + Y · (∂K/∂σ_max · dP_00 + ∂K/∂α · dα),          dP = Uᵀ dX V
        ∂X̃/∂α = K U diag(∂f/∂α(σ)) Vᵀ + Y ∂K/∂α,   ∂K/∂α = −σ_max ∂f/∂α(σ_max) / f(σ_max)²

    ``A``, ``B``, ``h`` are the divided differences of ``f`` (:func:`isojax.spectral.spectral_map`); ``K`` and its
    partials are those of the finite ``K`` :func:`soft_decay` uses. ``op.jvp(dx, dalpha)`` equals ``jax.jvp`` of
    ``soft_decay`` (its ``.y``), ``op.vjp(w)`` returns ``(dx, dalpha)`` = ``jax.vjp``, ``op.jvp(0, 1).y`` is
    ``∂X̃/∂α``, ``op.singular_values()``, ``op.norm()``, ``op.cond()`` describe ``dX -> dX̃`` (α fixed).
    ``op.output`` is ``soft_decay``'s value in the working dtype.

    Args:
      x: ``[..., n, d]`` floating, as in :func:`soft_decay`.
      alpha: scalar in ``[−1, 0)``.
      mask: optional ``[..., n]`` bool, true = real row.
      rescale: static bool, apply Algorithm 1's ``K``.
      method: static SVD strategy, as in :func:`soft_decay`.

    Returns:
      A :class:`isojax.spectral.SpectralDerivative` with leading shape ``[...]``; everything is in the working
      dtype (float32 for bf16/float16 ``x``).

    Examples:
      ``X = diag(2, 1)``: ``X̃ = diag(2, 2 r(α))`` with ``r = f(1)/f(2) = ln(1 − α(1 + α)) / ln(1 − α(2 + α))``,
      so ``∂X̃/∂α = diag(0, 2 r'(α))``; ``r'`` by a central difference in float64.

      >>> import numpy as np
      >>> from isojax import softdecay
      >>> import jax
      >>> op = jax.jit(softdecay.softdecay_derivative)(np.diag([2.0, 1.0]).astype(np.float32), -0.5)  # a pytree
      >>> d_alpha = np.asarray(jax.jit(lambda op: op.jvp(0.0, 1.0).y)(op))  # jit: one compilation, not one per op
      >>> r = lambda a: np.log(1 - a * (1 + a)) / np.log(1 - a * (2 + a))
      >>> np.allclose(d_alpha, np.diag([0.0, 2 * (r(-0.5 + 1e-6) - r(-0.5 - 1e-6)) / 2e-6]), atol=1e-4)
      True
    """
    x = check_points(x, "x")
    work = working_dtype(x.dtype)
    alpha = _check_alpha(alpha, work)
    op = spectral_derivative(x.astype(work), decay_curve, alpha, mask=mask, method=method)
    if not rescale:
        return op
    s_max = op.s[..., 0]
    k, dk_ds = jax.jvp(lambda t: _rescale_factor(t, alpha), (s_max,), (jnp.ones_like(s_max),))
    dk_dalpha = jax.jvp(lambda a: _rescale_factor(s_max, a), (alpha,), (jnp.ones_like(alpha),))[1]
    return dataclasses.replace(op, scale=k, dscale_ds=dk_ds, dscale_dparams=(dk_dalpha,))


def alpha_from_param(theta, alpha_init: float):
    """α of the :class:`SoftDecay` module from its parameter θ (``params["theta"]``).

    ``α = −sigmoid(θ̂ + logit(−α₀))`` with ``θ̂ = clip(θ, −30, 30)``, computed in odds form
    ``α = α₀ e^θ̂ / ((1 + α₀) − α₀ e^θ̂)`` so that the initial θ = 0 gives exactly ``α₀ = alpha_init``.
    α lies in ``[−1, 0)`` for every θ: the clip (where the sigmoid is saturated to float32 precision, so no
    learning signal is lost) keeps ``e^θ̂`` finite and α strictly negative (``|α| ≥ e^−30·|α₀| ≈ 9e-14·|α₀|``).

    Args:
      theta: float θ, any shape (the module's is a float32 scalar); traced.
      alpha_init: Python float α₀ in ``(−1, 0)``.

    Returns:
      α, the shape and dtype of ``theta``, in ``[−1, 0)``.

    Examples:
      θ = 0 gives α₀; θ = 1 gives the sigmoid form ``−sigmoid(1 + logit(0.2))``.

      >>> import numpy as np
      >>> from isojax import softdecay
      >>> round(float(softdecay.alpha_from_param(np.float32(0.0), -0.2)), 4)
      -0.2
      >>> got = float(softdecay.alpha_from_param(np.float32(1.0), -0.2))
      >>> round(got, 4), round(float(-1 / (1 + np.exp(-(1 + np.log(0.2 / 0.8))))), 4)
      (-0.4046, -0.4046)
    """
    if not -1.0 < alpha_init < 0.0:
        raise ValueError(f"alpha_init must satisfy -1 < alpha_init < 0, got {alpha_init}")
    t = jnp.exp(jnp.clip(theta, -_THETA_CLIP, _THETA_CLIP))
    return alpha_init * t / ((1 + alpha_init) - alpha_init * t)


class SoftDecay(nn.Module):
    """SoftDecay with a learnable α (Algorithm 1): ``SoftDecay()(x, mask)`` = ``soft_decay(x, α, mask=mask)``.

    Parameter: ``theta`` (float32 scalar, initialised to 0), with ``α = alpha_from_param(theta, alpha_init)``,
    a logistic map into ``[−1, 0)``, so optimisation can never make α non-negative. ``alpha_init`` is the
    authors' −0.2 by default.

    Called as ``module(x [..., n, d], mask [..., n] = None)``: with ``x`` = last-layer token states ``[B, L, H]``
    and the attention mask, one SVD per sequence over its real tokens (padding excluded, returned as zeros);
    this is the signature :func:`isojax.models.build_encoder` uses for ``last_layer_transform``.

    Attributes:
      alpha_init: the starting α, a Python float in ``(−1, 0)`` (the authors' −0.2): the parameter ``theta``
        starts at 0, where ``alpha_from_param(0, alpha_init) = alpha_init``.
      rescale: apply Algorithm 1's ``K`` (:func:`soft_decay`'s ``rescale``), so that the output's largest singular
        value is the input's.
      method: the SVD strategy (:func:`soft_decay`'s ``method``): ``"auto"``, a name in
        :data:`isojax.spectral.METHODS` or a decomposition callable.
    """

    alpha_init: float = -0.2
    rescale: bool = True
    method: str | Callable = "auto"

    @nn.compact
    def __call__(self, x, mask=None):
        theta = self.param("theta", nn.initializers.zeros_init(), (), jnp.float32)
        return soft_decay(
            x, alpha_from_param(theta, self.alpha_init), mask=mask, rescale=self.rescale, method=self.method
        )
