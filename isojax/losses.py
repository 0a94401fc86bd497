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

Conventions (as in :mod:`isojax.metrics`, and in optax's style):

* **Plain functions, the caller jits.** Nothing is jitted where it is defined; losses are meant to be called
  inside the caller's jitted training step.
* **Float hyperparameters are traced**: ``weight`` (λ), ``c1``, ``c2``, ``gamma``, ``eps``, ``zeta`` and
  ``smoothing`` may be arrays inside ``jit`` -- a scheduled or learned value, no recompile for a new value, and
  ``jax.grad`` with respect to them. A concrete value out of range raises ``ValueError``, a traced one makes
  the result NaN.
* **Whole-set losses, no reduction.** Every regulariser here is a property of a whole set of vectors -- an
  embedding matrix ``[..., V, d]`` or a batch of embeddings ``[..., n, d]`` (IsoScore of a batch is not a mean of
  per-example terms) -- so there is no per-example output to weight: the result is one value per set, ``[...]``,
  leading axes index independent sets and are never reduced. ``mask [..., n]`` (true = real row) excludes
  padding rows exactly. ``weight`` λ multiplies the result (a convenience: ``weight * loss(x)`` is the same).

All losses are to be minimised and have finite gradients on degenerate input (zero rows, identical rows,
repeated singular values). Bad input follows the rule of :mod:`isojax.metrics`: padding rows never count, a
NaN or inf in a counted row raises ``ValueError`` (concrete) or gives NaN (traced), and no SVD ever sees a
non-finite matrix. Closed-form gradients of the regularisers are in :mod:`isojax.gradients`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from isojax._numeric import finite_matrix, promote_float32, safe_div
from isojax._stats import cosine_sums, unit_scale
from isojax._validate import check_cloud, check_float, check_hyperparameter, nan_unless
from isojax.metrics import isoscore, isoscore_star

__all__ = [
    "cosine_regularization",
    "polynomial_decay",
    "exponential_decay",
    "spectrum_polynomial",
    "spectrum_exponential",
    "isoscore_loss",
    "istar_loss",
    "BalancerState",
    "balancer_factors",
    "balancer_init",
    "balancer_update",
]


def cosine_regularization(w, *, mask=None, weight=1.0):
    """Cosine regularisation R = λ / N² Σ_i Σ_{j≠i} ŵ_iᵀŵ_j, ŵ = w / ‖w‖ (Gao et al. 2019).

    Evaluated in O(Nd) through the mean-direction identity of too-much-in-common App. A:
    Σ_i Σ_{j≠i} ŵ_iᵀŵ_j = ‖Σ_i ŵ_i‖² − N, so R = λ (‖Σ_i ŵ_i‖² − N) / N², i.e. minimising R
    minimises the norm of the mean direction. (The appendix's eq. 13-14 misplace the bracket:
    "/N² · ‖·‖² − N".) N counts the real rows; a zero row has cosine 0 with every row.

    Args:
      w: ``[..., N, d]`` float embedding matrix (N ≥ 2).
      mask: optional ``[..., N]`` bool, true = real row.
      weight: λ (traced).

    Returns:
      ``[...]`` values in [−λ/N, λ(N − 1)/N], float32 (or ``w``'s dtype if wider).

    Examples:
      Two opposite rows reach the minimum −λ/N, two parallel rows the maximum λ(N − 1)/N.

      >>> import numpy as np
      >>> from isojax import losses
      >>> opposite = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
      >>> parallel = np.array([[1.0, 0.0], [2.0, 0.0]], np.float32)
      >>> [round(float(losses.cosine_regularization(w)), 4) for w in (opposite, parallel)]
      [-0.5, 0.5]
    """
    w, mask, ok = check_cloud(w, mask, "w", min_n=2)
    weight, _ = check_hyperparameter(weight, "weight")
    all_pairs, diagonal, count = cosine_sums(unit_scale(promote_float32(w), mask)[0], mask)  # scale-invariant
    return nan_unless(ok, weight * safe_div(all_pairs - diagonal, count**2))


def _ranks(num: int):
    """``k = 1..num`` as floats ``[num]`` (the default float dtype)."""
    return jnp.arange(1, num + 1, dtype=jnp.result_type(float))


def polynomial_decay(num: int, *, c1, gamma):
    """The polynomial prior spectrum of spectrum control, c1 k^γ for k = 1..``num``.

    Args:
      num: static int, the number of singular values.
      c1: scale (float, traced).
      gamma: exponent γ (float, traced).

    Returns:
      ``[num]`` prior values in the default float dtype (float32 unless x64 is enabled).

    Examples:
      >>> import numpy as np
      >>> from isojax import losses
      >>> np.round(np.asarray(losses.polynomial_decay(3, c1=2.0, gamma=-1.0), np.float64), 4).tolist()
      [2.0, 1.0, 0.6667]
    """
    c1, _ = check_hyperparameter(c1, "c1")
    gamma, _ = check_hyperparameter(gamma, "gamma")
    return c1 * _ranks(num) ** gamma


def exponential_decay(num: int, *, c1, c2, gamma):
    """The exponential prior spectrum of spectrum control, c1 exp(−c2 k^γ) for k = 1..``num``.

    Args:
      num: static int, the number of singular values.
      c1: scale (float, traced).
      c2: rate (float, traced).
      gamma: exponent γ of k (float, traced).

    Returns:
      ``[num]`` prior values in the default float dtype (float32 unless x64 is enabled).

    Examples:
      >>> import numpy as np
      >>> from isojax import losses
      >>> np.round(np.asarray(losses.exponential_decay(2, c1=1.0, c2=1.0, gamma=1.0), np.float64), 4).tolist()
      [0.3679, 0.1353]
    """
    c1, _ = check_hyperparameter(c1, "c1")
    c2, _ = check_hyperparameter(c2, "c2")
    gamma, _ = check_hyperparameter(gamma, "gamma")
    return c1 * jnp.exp(-c2 * _ranks(num) ** gamma)


def _spectrum_penalty(w, prior, weight):
    """λ Σ_k (σ_k − prior_k)² with σ the singular values of ``w`` (``svd(compute_uv=False)``, in at least
    float32: its gradient is finite even where singular values repeat or vanish). A non-finite ``w`` (checked
    by the caller) reaches the SVD as zeros and the result is NaN."""
    weight, _ = check_hyperparameter(weight, "weight")
    w, ok = finite_matrix(promote_float32(w))
    sigma = jnp.linalg.svd(w, compute_uv=False)
    return nan_unless(ok, weight * jnp.sum((sigma - prior) ** 2, axis=-1))


def spectrum_polynomial(w, *, c1, gamma, weight=1.0):
    """Spectrum control towards a polynomial decay: R_pol = λ Σ_k (σ_k − c1 k^γ)².

    σ_k is the k-th largest singular value of the embedding matrix W, k = 1..min(V, d)
    (Wang et al. 2020; isotropy-calibration-evaluation §3). γ < 0 gives a decaying prior
    (:func:`polynomial_decay`).

    Args:
      w: ``[..., V, d]`` float matrix (for instance the output embedding matrix). Not scale-invariant: the
        squared differences overflow float32 for σ above about 1e19.
      c1: scale of the prior (traced).
      gamma: decay exponent γ (traced).
      weight: λ (traced).

    Returns:
      ``[...]`` non-negative penalties, float32 (or ``w``'s dtype if wider).

    Examples:
      ``W = diag(2, 1)`` against the flat prior ``c1 k^0 = 1``: ``(2 − 1)² + (1 − 1)² = 1``.

      >>> import numpy as np
      >>> from isojax import losses
      >>> round(float(losses.spectrum_polynomial(np.diag([2.0, 1.0]).astype(np.float32), c1=1.0, gamma=0.0)), 4)
      1.0
    """
    w = check_cloud(w, None, "w")[0]
    return _spectrum_penalty(w, polynomial_decay(min(w.shape[-2:]), c1=c1, gamma=gamma), weight)


def spectrum_exponential(w, *, c1, c2, gamma, weight=1.0):
    """Spectrum control towards an exponential decay: R_exp = λ Σ_k (σ_k − c1 exp(−c2 k^γ))².

    Same σ_k as :func:`spectrum_polynomial` (Wang et al. 2020; isotropy-calibration-evaluation §3); prior
    :func:`exponential_decay`.

    Args:
      w: ``[..., V, d]`` float matrix.
      c1: scale of the prior (traced).
      c2: rate (traced).
      gamma: exponent γ of k (traced).
      weight: λ (traced).

    Returns:
      ``[...]`` non-negative penalties, float32 (or ``w``'s dtype if wider).

    Examples:
      ``W = diag(2, 1)`` against the prior ``exp(−k)``:

      >>> import numpy as np
      >>> from isojax import losses
      >>> w = np.diag([2.0, 1.0]).astype(np.float32)
      >>> got = float(losses.spectrum_exponential(w, c1=1.0, c2=1.0, gamma=1.0))
      >>> round(got, 4), round(float((2 - np.exp(-1)) ** 2 + (1 - np.exp(-2)) ** 2), 4)
      (3.4115, 3.4115)
    """
    w = check_cloud(w, None, "w")[0]
    return _spectrum_penalty(w, exponential_decay(min(w.shape[-2:]), c1=c1, c2=c2, gamma=gamma), weight)


def isoscore_loss(x, *, mask=None, eps=1e-6):
    """IsoScore loss L_2 = log(1 / IsoScore(x)) of isotropy-layer-joint-loss §3.3.

    Computed as −log(max(IsoScore, 0) + eps): IsoScore ∈ [0, 1] is exactly 0 for a cloud on a
    line, and eps keeps the loss and its gradient finite there. See :func:`isojax.metrics.isoscore`.
    A whole-batch quantity: one value per batch of embeddings.

    Args:
      x: ``[..., n, d]`` float mini-batch of embeddings (e.g. [CLS] vectors), n ≥ 2, d ≥ 2.
      mask: optional ``[..., n]`` bool, true = real row.
      eps: positive floor inside the log (traced; a traced eps ≤ 0 gives NaN).

    Returns:
      ``[...]`` non-negative losses (≤ −log eps), float32 (or ``x``'s dtype if wider).

    Examples:
      A cloud spread evenly over two of three dimensions has IsoScore 1/2, so the loss is ``log 2``.

      >>> import numpy as np
      >>> from isojax import losses
      >>> disk = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, -1.0, 0.0]], np.float32)
      >>> round(float(losses.isoscore_loss(disk)), 4), round(float(np.log(2)), 4)
      (0.6931, 0.6931)
    """
    eps, eps_ok = check_hyperparameter(eps, "eps", low=0.0, low_open=True)
    score = isoscore(x, mask=mask)  # NaN (traced bad input) stays NaN: the floor below must not hide it
    return nan_unless(eps_ok & ~jnp.isnan(score), -jnp.log(jnp.where(score > 0, score, 0) + eps))


def istar_loss(x, *, c0=None, zeta=0.2, mask=None, weight=1.0):
    """I-STAR regulariser λ (1 − IsoScore*(x; C0, ζ)), added to the task loss.

    Rudman & Eickhoff's I-STAR: training loss = task loss + λ(1 − IsoScore*). ``c0``/``zeta`` as
    in :func:`isojax.metrics.isoscore_star` (``c0=None`` = identity, ζ = 0.2). A whole-batch quantity.

    IsoScore* is not scale-invariant, and a loss that raises it can shrink the batch instead of spreading it:
    for a fixed C0, IsoScore*(s·x) → IsoScore(C0) as s → 0 (→ 1 for C0 = I), and a batch with fewer rows than
    dimensions (C of rank ≤ n − 1, C0 full rank) gains most that way. Fine-tuning the default model on WNLI with
    λ = 1 did this with both C0 (``experiments/results/glue_methods.md``): the term fell while the dev [CLS]
    became less isotropic (IsoScore about half the baseline's) and crowded around its mean.

    Args:
      x: ``[..., n, d]`` float embeddings.
      c0: optional ``[d, d]`` (or broadcastable ``[..., d, d]``) symmetric PSD reference covariance; None = identity.
      zeta: shrinkage ζ in [0, 1] (traced).
      mask: optional ``[..., n]`` bool, true = real row.
      weight: λ (traced).

    Returns:
      ``[...]`` values in [0, λ], float32 (or ``x``'s dtype if wider).

    Examples:
      Two points on a line: IsoScore* with ``zeta = 0.5`` is 0.6 (see :func:`isojax.metrics.isoscore_star`).

      >>> import numpy as np
      >>> from isojax import losses
      >>> round(float(losses.istar_loss(np.array([[-1.0, 0.0], [1.0, 0.0]], np.float32), zeta=0.5)), 4)
      0.4
    """
    weight, _ = check_hyperparameter(weight, "weight")
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
    """Initial :class:`BalancerState` for ``num_losses`` losses (isotropy-layer-joint-loss §3.3).

    Args:
      num_losses: positive int, the number m of balanced losses.

    Returns:
      A :class:`BalancerState` with ``means`` zeros ``[m]`` float32 and ``step`` 0 (int32); the first
      :func:`balancer_update` sets the means to the observed losses.

    Examples:
      >>> from isojax import losses
      >>> state = losses.balancer_init(2)
      >>> state.means.tolist(), int(state.step)
      ([0.0, 0.0], 0)
    """
    if isinstance(num_losses, bool) or not isinstance(num_losses, int) or num_losses < 1:
        raise ValueError(f"num_losses must be a positive int, got {num_losses!r}")
    return BalancerState(means=jnp.zeros((num_losses,), jnp.float32), step=jnp.zeros((), jnp.int32))


def balancer_factors(means):
    """The factors ``L̄ / L̄_i`` by which :func:`balancer_update` scales the losses (1 where a mean is not positive).

    Args:
      means: ``[m]`` moving means L̄_i (:attr:`BalancerState.means`).

    Returns:
      ``[m]`` factors, ``means``' dtype.

    Examples:
      >>> import numpy as np
      >>> np.asarray(balancer_factors(np.array([1.0, 3.0], np.float32))).tolist()
      [2.0, 0.6666666865348816]
    """
    return jnp.where(means > 0, jnp.mean(means) / jnp.where(means > 0, means, 1), 1)


def balancer_update(state: BalancerState, losses, *, smoothing=0.15):
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
      smoothing: s in (0, 1] (traced; a traced value outside gives NaN loss and means).

    Returns:
      ``(loss, new_state)``: the balanced scalar loss L̂ (``[]``, ``losses``' dtype) and the updated state.

    Examples:
      At the first step the means are the losses 1 and 3 (mean 2), so both rescaled losses are 2.

      >>> import numpy as np
      >>> from isojax import losses
      >>> loss, state = losses.balancer_update(losses.balancer_init(2), np.array([1.0, 3.0], np.float32))
      >>> round(float(loss), 4), np.round(np.asarray(state.means, np.float64), 4).tolist(), int(state.step)
      (2.0, [1.0, 3.0], 1)
    """
    losses = check_float(jnp.asarray(losses), "losses")
    if losses.shape != state.means.shape:
        raise ValueError(f"losses must have shape {state.means.shape} (one per balanced loss), got {losses.shape}")
    smoothing, smoothing_ok = check_hyperparameter(smoothing, "smoothing", low=0.0, high=1.0, low_open=True)
    observed = jax.lax.stop_gradient(losses).astype(state.means.dtype)
    means = jnp.where(state.step == 0, observed, state.means)
    factors = balancer_factors(means)
    loss = jnp.mean(losses * factors.astype(losses.dtype))
    rate = (smoothing / (1 + state.step)).astype(means.dtype)  # the state keeps its dtype (a scan carry)
    new_means = nan_unless(smoothing_ok, observed * rate + means * (1 - rate))
    return nan_unless(smoothing_ok, loss), BalancerState(means=new_means, step=state.step + 1)
