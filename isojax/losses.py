"""Isotropy regularisers and the joint-loss balancer, as pure functions to add to a training loss.

* :func:`cosine_regularization` -- Gao et al. (2019), isotropy-calibration-evaluation §3,
  too-much-in-common-centering App. A.
* :func:`spectrum_polynomial`, :func:`spectrum_exponential` -- spectrum control (Wang et al. 2020),
  isotropy-calibration-evaluation §3.
* :func:`isoscore_loss` -- log(1 / IsoScore), isotropy-layer-joint-loss §3.3.
* :func:`istar_loss` -- 1 − IsoScore* (I-STAR, Rudman & Eickhoff).
* :func:`balancer_init`, :func:`balancer_update` -- moving-average loss balancing,
  isotropy-layer-joint-loss §3.3 eq. 3.

The persistent-entropy regulariser lives with the barcodes in :mod:`isojax.topology`
(:func:`isojax.topology.persistent_entropy_loss`).

All losses are to be minimised, take ``[..., n, d]`` inputs (leading axes are batch axes) and have
finite gradients on degenerate input (zero rows, identical rows, repeated singular values).
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from isojax._numeric import promote_float32, safe_div
from isojax._validate import check_float, check_mask, check_points
from isojax.metrics import _cosine_sums, isoscore, isoscore_star

__all__ = [
    "cosine_regularization",
    "spectrum_polynomial",
    "spectrum_exponential",
    "isoscore_loss",
    "istar_loss",
    "BalancerState",
    "balancer_init",
    "balancer_update",
]


@jax.jit
def cosine_regularization(w, *, mask=None, weight: float = 1.0):
    """Cosine regularisation R = λ / N² Σ_i Σ_{j≠i} ŵ_iᵀŵ_j, ŵ = w / ‖w‖ (Gao et al. 2019).

    Evaluated in O(Nd) through the mean-direction identity of too-much-in-common App. A:
    Σ_i Σ_{j≠i} ŵ_iᵀŵ_j = ‖Σ_i ŵ_i‖² − N, so R = λ (‖Σ_i ŵ_i‖² − N) / N², i.e. minimising R
    minimises the norm of the mean direction. (The appendix's eq. 13-14 misplace the bracket:
    "/N² · ‖·‖² − N".) N counts the real rows; a zero row has cosine 0 with every row.

    Args:
      w: ``[..., N, d]`` float embedding matrix (N ≥ 2).
      mask: optional ``[..., N]`` bool, true = real row.
      weight: λ.

    Returns:
      ``[...]`` values in [−λ/N, λ(N − 1)/N].
    """
    w = check_points(w, "w", min_n=2)
    mask = check_mask(mask, w)
    all_pairs, diagonal, count = _cosine_sums(w, mask)
    return weight * safe_div(all_pairs - diagonal, count**2)


def _singular_values(w):
    """Singular values ``[..., min(V, d)]`` (descending) of ``w``, in at least float32.

    ``svd(compute_uv=False)`` has finite gradients even where singular values repeat or vanish.
    """
    w = check_points(w, "w")
    return jnp.linalg.svd(promote_float32(w), compute_uv=False)


def _spectrum_penalty(sigma, prior, weight):
    return weight * jnp.sum((sigma - prior) ** 2, axis=-1)


@jax.jit
def spectrum_polynomial(w, *, c1: float, gamma: float, weight: float = 1.0):
    """Spectrum control towards a polynomial decay: R_pol = λ Σ_k (σ_k − c1 k^γ)².

    σ_k is the k-th largest singular value of the embedding matrix W, k = 1..min(V, d)
    (Wang et al. 2020; isotropy-calibration-evaluation §3). γ < 0 gives a decaying prior.

    Args:
      w: ``[..., V, d]`` float matrix (for instance the output embedding matrix).
      c1: scale of the prior; gamma: decay exponent γ; weight: λ.

    Returns:
      ``[...]`` penalties.
    """
    sigma = _singular_values(w)
    k = jnp.arange(1, sigma.shape[-1] + 1, dtype=sigma.dtype)
    return _spectrum_penalty(sigma, c1 * k**gamma, weight)


@jax.jit
def spectrum_exponential(w, *, c1: float, c2: float, gamma: float, weight: float = 1.0):
    """Spectrum control towards an exponential decay: R_exp = λ Σ_k (σ_k − c1 exp(−c2 k^γ))².

    Same σ_k as :func:`spectrum_polynomial` (Wang et al. 2020; isotropy-calibration-evaluation §3).

    Args:
      w: ``[..., V, d]`` float matrix.
      c1: scale; c2: rate; gamma: exponent γ of k; weight: λ.

    Returns:
      ``[...]`` penalties.
    """
    sigma = _singular_values(w)
    k = jnp.arange(1, sigma.shape[-1] + 1, dtype=sigma.dtype)
    return _spectrum_penalty(sigma, c1 * jnp.exp(-c2 * k**gamma), weight)


@partial(jax.jit, static_argnames=("eps",))
def isoscore_loss(x, *, mask=None, eps: float = 1e-6):
    """IsoScore loss L_2 = log(1 / IsoScore(x)) of isotropy-layer-joint-loss §3.3.

    Computed as −log(max(IsoScore, 0) + eps): IsoScore ∈ [0, 1] is exactly 0 for a cloud on a
    line, and eps keeps the loss and its gradient finite there. See :func:`isojax.metrics.isoscore`.

    Args:
      x: ``[..., n, d]`` float mini-batch of embeddings (e.g. [CLS] vectors), n ≥ 2, d ≥ 2.
      mask: optional ``[..., n]`` bool, true = real row.
      eps: positive floor inside the log.

    Returns:
      ``[...]`` non-negative losses (≤ −log eps).
    """
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps!r}")
    return -jnp.log(jnp.maximum(isoscore(x, mask=mask), 0) + eps)


@partial(jax.jit, static_argnames=("zeta",))
def istar_loss(x, *, c0=None, zeta: float = 0.2, mask=None, weight: float = 1.0):
    """I-STAR regulariser λ (1 − IsoScore*(x; C0, ζ)), added to the task loss.

    Rudman & Eickhoff's I-STAR: training loss = task loss + λ(1 − IsoScore*). ``c0``/``zeta`` as
    in :func:`isojax.metrics.isoscore_star` (``c0=None`` = identity, ζ = 0.2).

    Args:
      x: ``[..., n, d]`` float embeddings; c0: optional ``[d, d]`` reference covariance;
      zeta: shrinkage in [0, 1]; mask: optional ``[..., n]`` bool; weight: λ.

    Returns:
      ``[...]`` values in [0, λ].
    """
    return weight * (1 - isoscore_star(x, c0=c0, zeta=zeta, mask=mask))


class BalancerState(NamedTuple):
    """State of the joint-loss balancer (a pytree).

    Attributes:
      means: ``[m]`` moving means L̄_i of the m losses (set from the first observed losses).
      step: ``[]`` int32 number of updates so far (k in eq. 3).
    """

    means: jax.Array
    step: jax.Array


def balancer_init(num_losses: int = 2) -> BalancerState:
    """Initial :class:`BalancerState` for ``num_losses`` losses (isotropy-layer-joint-loss §3.3)."""
    if isinstance(num_losses, bool) or not isinstance(num_losses, int) or num_losses < 1:
        raise ValueError(f"num_losses must be a positive int, got {num_losses!r}")
    return BalancerState(means=jnp.zeros((num_losses,), jnp.float32), step=jnp.zeros((), jnp.int32))


@partial(jax.jit, static_argnames=("smoothing",))
def balancer_update(state: BalancerState, losses, *, smoothing: float = 0.15):
    """Balance m losses by their moving means (isotropy-layer-joint-loss §3.3, eq. 3).

    With L̄_i the moving means and L̄ = mean_i L̄_i: L̂_i = L_i · L̄ / L̄_i, and the training loss is
    L̂ = mean_i L̂_i (½(L̂_1 + L̂_2) for two losses). Then, at step k = 0, 1, …:
    L̄_i ← L_i · s/(1 + k) + L̄_i · (1 − s/(1 + k)), s = ``smoothing`` (0.15 as in the paper).
    At the first step the means are set to the observed losses (so L̂_i = L̄ there). The factors
    L̄ / L̄_i are statistics and carry no gradient; gradients flow only through L_i. The scheme
    assumes positive losses; a loss whose mean is not positive keeps factor 1.

    Args:
      state: the current :class:`BalancerState`.
      losses: ``[m]`` array (or sequence of m scalars) of the current losses L_i.
      smoothing: s in (0, 1].

    Returns:
      ``(loss, new_state)``: the balanced scalar loss L̂ and the updated state.
    """
    losses = check_float(jnp.asarray(losses), "losses")
    if losses.shape != state.means.shape:
        raise ValueError(f"losses must have shape {state.means.shape} (one per balanced loss), got {losses.shape}")
    if not isinstance(smoothing, (int, float)) or not 0 < smoothing <= 1:
        raise ValueError(f"smoothing must be a number in (0, 1], got {smoothing!r}")
    observed = jax.lax.stop_gradient(losses).astype(state.means.dtype)
    means = jnp.where(state.step == 0, observed, state.means)
    factors = jnp.where(means > 0, jnp.mean(means) / jnp.where(means > 0, means, 1), 1)
    loss = jnp.mean(losses * factors.astype(losses.dtype))
    rate = smoothing / (1 + state.step.astype(means.dtype))
    new_means = observed * rate + means * (1 - rate)
    return loss, BalancerState(means=new_means, step=state.step + 1)
