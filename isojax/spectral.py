"""A stable, differentiable map of singular values: ``X = U diag(s) Vᵀ  ->  Y = U diag(g(s)) Vᵀ``.

:func:`spectral_map` applies ``g`` with its own derivative (Daleckii–Krein divided differences whose limits are
taken explicitly), exact and finite where singular values repeat or vanish, where the derivative of
``jnp.linalg.svd`` is NaN; :func:`spectral_derivative` returns that derivative as a linear operator. Singular
values ``s ≤ rtol · s_max`` are null and contribute nothing. A matrix holding NaN or inf is never decomposed: its
outputs are NaN (concrete input raises ``ValueError`` naming the row). The thin SVD is ``svd`` or
``gram_eigh_f64`` (:data:`METHODS`), chosen per lowering platform by ``method="auto"`` (:func:`select_method`).
Derivation, accuracy and timings of these and other strategies: ``docs/design/spectral.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.extend.backend
import jax.numpy as jnp
from jax import lax

from isojax._numeric import finite_matrix, nan_unless
from isojax._validate import check_cloud

__all__ = [
    "METHODS",
    "SpectralDerivative",
    "SpectralMap",
    "available_methods",
    "current_platform",
    "select_method",
    "spectral_derivative",
    "spectral_map",
    "thin_svd",
    "working_dtype",
]

_HIGHEST = lax.Precision.HIGHEST  # float32 products stay float32 on GPU/TPU (no TF32 / bf16 passes)
_ALL = ("cpu", "cuda", "rocm", "tpu")

METHODS: dict[str, tuple[str, ...]] = {"svd": _ALL, "gram_eigh_f64": ("cpu", "cuda", "rocm")}
"""The decompositions by name, with the platforms that lower them (TPUs have no float64). ``method=`` also takes
``"auto"`` or a callable ``x -> (u, s, vt)`` (the thin SVD of a finite ``[..., n, d]`` matrix in the working dtype,
such as the strategies of ``experiments/benchmarks/decompositions.py``), which runs on every platform."""


def _mm(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


def _t(a):
    return jnp.swapaxes(a, -1, -2)


def current_platform() -> str:
    """``jax.default_backend()``, with GPUs split into ``cuda`` and ``rocm``.

    Returns:
      ``"cpu"``, ``"cuda"``, ``"rocm"`` or ``"tpu"``.

    Examples:
      >>> from isojax import spectral
      >>> spectral.current_platform() in ("cpu", "cuda", "rocm", "tpu")
      True
    """
    if (backend := jax.default_backend()) != "gpu":
        return backend
    return "rocm" if "rocm" in jax.extend.backend.get_backend().platform_version.lower() else "cuda"


def available_methods(platform: str | None = None) -> list[str]:
    """Names in :data:`METHODS` that lower on ``platform`` (default :func:`current_platform`).

    Args:
      platform: ``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"`` or None (the current one).

    Returns:
      A list of method names (str), in the order of :data:`METHODS`.

    Examples:
      >>> from isojax import spectral
      >>> spectral.available_methods("tpu"), spectral.available_methods("cuda")
      (['svd'], ['svd', 'gram_eigh_f64'])
    """
    return [name for name, platforms in METHODS.items() if _platform(platform) in platforms]


def _platform(platform: str | None) -> str:
    if platform not in (None, *_ALL):
        raise ValueError(f"platform must be one of {list(_ALL)}, got {platform!r}")
    return platform or current_platform()


def select_method(method, shape, platform: str | None = None):
    """The decomposition ``method`` resolves to for ``[..., n, d]`` matrices of ``shape`` on ``platform``.

    ``"auto"`` is ``svd`` on CPU and TPU and, on GPUs, ``gram_eigh_f64`` when a side is longer than 32, else
    ``svd`` (``docs/design/spectral.md`` gives the reasons). A name is checked against :data:`METHODS` and the
    platform (default :func:`current_platform`), ``ValueError`` naming it otherwise; a callable is returned as is.
    Inside isojax's functions the rule is applied to each platform the computation is *lowered* for
    (``jax.lax.platform_dependent``), so one exported program runs each platform's choice.

    Args:
      method: ``"auto"``, a name in :data:`METHODS` or a decomposition callable.
      shape: the shape ``[..., n, d]`` of the matrices (a tuple of ints).
      platform: ``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"`` or None (the current one).

    Returns:
      The method name (str) that runs, or the callable.

    Examples:
      >>> from isojax import spectral
      >>> spectral.select_method("auto", (8, 128, 384), "cuda"), spectral.select_method("auto", (8, 16, 16), "cuda")
      ('gram_eigh_f64', 'svd')
    """
    platform = _platform(platform)
    if callable(method):
        return method
    if method == "auto":
        return _auto(shape, platform)
    if method not in METHODS:
        raise ValueError(
            f"method must be 'auto', one of {list(METHODS)} or a decomposition callable, got {method!r} (the other"
            " strategies measured for SoftDecay are in experiments/benchmarks/decompositions.py, STRATEGIES)"
        )
    if platform not in METHODS[method]:
        raise ValueError(
            f"method {method!r} does not lower on {platform} (only on {', '.join(METHODS[method])});"
            f" on {platform} choose 'auto' or one of {available_methods(platform)}"
        )
    return method


def _auto(shape, platform: str) -> str:
    """The ``method="auto"`` rule (:func:`select_method`)."""
    return "gram_eigh_f64" if platform in ("cuda", "rocm") and max(shape[-2:]) > 32 else "svd"


def thin_svd(x, method="auto"):
    """Thin SVD ``x = u diag(s) vt``.

    Args:
      x: ``[..., n, d]`` floating; decomposed in :func:`working_dtype` (float32 for bf16).
      method: ``"auto"``, a name in :data:`METHODS` (resolved per lowering platform, :func:`select_method`) or a
        decomposition callable.

    Returns:
      ``(u [..., n, k], s [..., k], vt [..., k, d])`` in the working dtype, ``k = min(n, d)``, ``s ≥ 0`` in descending
      order (``gram_eigh_f64``: ``s_i = |R_ii|``, descending up to rounding). Differentiating these directly uses
      JAX's own rules (NaN on repeated values); differentiate through :func:`spectral_map` instead.

    Examples:
      >>> import numpy as np
      >>> from isojax import spectral
      >>> u, s, vt = spectral.thin_svd(np.array([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]], np.float32))
      >>> np.round(np.asarray(s, np.float64), 4).tolist(), u.shape, vt.shape
      ([3.0, 1.0], (3, 2), (2, 2))
    """
    x = check_cloud(x)[0]
    select_method(method, x.shape)
    return _decompose_on_platforms(x.astype(working_dtype(x.dtype)), method)


def svd(x, algorithm: lax.linalg.SvdAlgorithm | None = None):
    """``jax.lax.linalg.svd`` of the tall side (LAPACK's SVD is faster on tall matrices)."""
    tall = x.shape[-2] >= x.shape[-1]
    q, s, wt = lax.linalg.svd(x if tall else _t(x), full_matrices=False, algorithm=algorithm)
    return (q, s, wt) if tall else (_t(wt), s, _t(q))


def gram_eigh(x, implementation: lax.linalg.EighImplementation | None = None, float64: bool = True):
    """Thin SVD from ``eigh`` of the smaller Gram matrix ``A Aᵀ = W diag(λ) Wᵀ`` (in float64 unless ``float64`` is
    false, also with ``jax_enable_x64`` off), the other side and ``s_i = R_ii`` from ``Aᵀ W = Q R``."""
    dtype = x.dtype
    wide = x.shape[-2] <= x.shape[-1]
    a = x if wide else _t(x)  # [k, m], k <= m
    with jax.enable_x64(True) if float64 else contextlib.nullcontext():
        a = a.astype(jnp.float64) if float64 else a
        w = lax.linalg.eigh(_mm(a, _t(a)), implementation=implementation)[0][..., ::-1]  # descending eigenvalues
        q, r = jnp.linalg.qr(_mm(_t(a), w))  # Aᵀ W = Q R, Q [m, k]
        r_diag = jnp.diagonal(r, axis1=-2, axis2=-1)
        q = q * jnp.where(r_diag < 0, -1, 1).astype(q.dtype)[..., None, :]
        w, s, q = (t.astype(dtype) for t in (w, jnp.abs(r_diag), q))
    return (w, s, _t(q)) if wide else (q, s, _t(w))


def _decompose_on_platforms(x, method):
    """The thin SVD by ``method``: a callable runs as is; a name or ``"auto"`` as :func:`select_method` resolves it
    for each platform the computation is lowered for, one ``jax.lax.platform_dependent`` branch per distinct
    choice, so a program lowered for TPU holds no float64. The callers have checked ``method`` on the backend it is
    traced on (:func:`select_method`); lowering for a platform that cannot run it fails in JAX (no branch)."""
    x64 = bool(jax.config.read("jax_enable_x64"))  # the caller's setting, kept in every branch without float64
    if callable(method):
        return _decompose(x, method, x64)
    runs = {p: _auto(x.shape, p) if method == "auto" else method for p in _ALL if p in METHODS.get(method, _ALL)}
    branches = {m: functools.partial(_decompose, method=m, x64=x64) for m in dict.fromkeys(runs.values())}
    # With a float64 branch the whole dispatch is staged and transformed (vmap, grad) with float64 enabled, as that
    # branch is when it runs alone; each branch sets its own mode, so the others hold no float64 constant.
    with jax.enable_x64(True) if "gram_eigh_f64" in branches else contextlib.nullcontext():
        return lax.platform_dependent(x, **{p: branches[m] for p, m in runs.items()})


def _decompose(x, method, x64: bool):
    """``(u, s, vt)`` of ``x`` by ``method`` (a name or a callable) with float64 enabled for ``gram_eigh_f64``, else
    as the caller had it (``x64``); NaN, without decomposing it, for a matrix that is not finite."""
    fn = method if callable(method) else svd if method == "svd" else gram_eigh
    with jax.enable_x64(x64 or method == "gram_eigh_f64"):
        x, ok = finite_matrix(x)
        return nan_unless(ok, fn(x))


class SpectralMap(NamedTuple):
    """Result of :func:`spectral_map`.

    Attributes:
      y: ``[..., n, d]`` the transformed matrix, in the input dtype.
      s: ``[..., min(n, d)]`` singular values of the (masked) input, descending (up to rounding for
        ``gram_eigh_f64``), in the working dtype.
    """

    y: jax.Array
    s: jax.Array


def working_dtype(dtype) -> jnp.dtype:
    """The dtype singular-value work runs in: float32 for bf16/float16/float32 inputs, float64 for float64.

    Args:
      dtype: a floating dtype (anything ``jnp.promote_types`` accepts).

    Returns:
      The working ``jnp.dtype``: ``promote_types(dtype, float32)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from isojax import spectral
      >>> str(spectral.working_dtype(jnp.bfloat16))
      'float32'
    """
    return jnp.promote_types(dtype, jnp.float32)


def _prepare(x, fn, params, mask, rtol, method):
    """Checked inputs of :func:`spectral_map` / :func:`spectral_derivative`: ``(x in the working dtype with masked
    rows zeroed, mask, params, rtol, method)``."""
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(s, *params), got {type(fn).__name__}")
    x, mask, ok = check_cloud(x, mask, count_real=False)  # an empty cloud maps to an empty cloud
    work = working_dtype(x.dtype)
    if rtol is None:
        rtol = max(x.shape[-2:]) * float(jnp.finfo(work).eps)
    elif not rtol >= 0:
        raise ValueError(f"rtol must be a non-negative float or None, got {rtol!r}")
    xw = x.astype(work) if mask is None else jnp.where(mask[..., None], x.astype(work), 0)
    xw = nan_unless(ok, xw)  # traced bad input: a NaN matrix, which the guarded decomposition turns into NaN out
    select_method(method, x.shape)
    return xw, mask, tuple(jnp.asarray(p) for p in params), float(rtol), method


def spectral_map(
    x, fn: Callable, *params, mask=None, rtol: float | None = None, method: str | Callable = "auto"
) -> SpectralMap:
    """Apply ``fn`` to the singular values of each ``[n, d]`` matrix: ``Y = Σ_{i live} fn(s_i) u_i v_iᵀ``.

    Args:
      x: ``[..., n, d]`` floating array; the SVD runs in :func:`working_dtype` (float32 for bf16), ``y`` is
        cast back to ``x.dtype``.
      fn: ``fn(s, *params)``, elementwise in ``s`` (broadcasting ``params`` against ``s [..., k]``), finite
        with finite derivatives for ``s > 0``. It is evaluated only at live singular values (null ones are
        replaced by ``s_max``, or by 1 for a zero matrix, and their results discarded).
      *params: arrays differentiated through ``fn`` (e.g. SoftDecay's alpha).
      mask: optional ``[..., n]`` boolean, true = real row. Masked rows are zeroed before the decomposition
        (so they are left out of it: the live singular triplets are those of the real rows alone) and come
        back as zeros; their values, even inf/NaN, do not reach ``y`` or any gradient.
      rtol: singular values ``s ≤ rtol · s_max`` are null and contribute nothing, so ``y`` depends on ``x`` alone,
        not on the arbitrary singular vectors of null or repeated values; default ``max(n, d) · eps`` (as
        ``numpy.linalg.matrix_rank``). ``docs/design/spectral.md`` explains the choice for ``fn(0) ≠ 0``.
      method: how the thin SVD is computed: ``"auto"``, a name in :data:`METHODS` or a decomposition callable
        (:func:`select_method`); ``ValueError`` for an unknown name or one the backend cannot lower. Only
        ``U, s, V`` change with it, never the derivative's formula.

    Returns:
      :class:`SpectralMap` ``(y [..., n, d], s [..., min(n, d)])``; both are differentiable.

    Derivative (custom JVP, so ``jvp``, ``grad`` and ``vmap`` of either all work; :func:`spectral_derivative`
    gives it as an operator). With ``dP = Uᵀ dX V``, ``sym``/``skew`` its symmetric/antisymmetric parts,
    ``h_i = g_i/s_i`` (0 for null ``i``, where ``g_i = 0``)::

        dY = U [A ∘ sym(dP) + B ∘ skew(dP) + diag(∂g/∂params · dparams)] Vᵀ
             + (I − UUᵀ) dX V diag(h) Vᵀ + U diag(h) Uᵀ dX (I − VVᵀ),     ds = diag(dP)
        A_ij = (g_i − g_j)/(s_i − s_j),  B_ij = (g_i + g_j)/(s_i + s_j)   (B = 0 for two null values)

    ``A_ij`` uses its limit ``(g'(s_i) + g'(s_j))/2`` when ``|s_i − s_j| ≤ eps^(1/3) · max(s_i, s_j)``
    (the diagonal gives ``g'(s_i)``; error ``O(eps^(2/3))`` either side of the switch, where the plain
    quotient would lose all digits to cancellation). Exact and finite on repeated singular values; zero on
    null–null directions (small perturbations there stay null). First-order only: differentiating the
    derivative again goes through the decomposition's own JAX rule.

    Examples:
      Cubing the singular values is the matrix product ``X Xᵀ X = U diag(s³) Vᵀ``.

      >>> import numpy as np
      >>> from isojax import spectral
      >>> x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
      >>> y, s = spectral.spectral_map(x, lambda s: s**3)
      >>> np.allclose(y, x @ x.T @ x, atol=1e-4)
      True
    """
    xw, mask, params, rtol, method = _prepare(x, fn, params, mask, rtol, method)
    y, s = _spectral_map(fn, rtol, method, xw, params)
    if mask is not None:
        y = jnp.where(mask[..., None], y, 0)
    return SpectralMap(y.astype(x.dtype), s)


def _null_split(rtol, s):
    """``live = s > rtol·s_max`` and the points ``fn`` is evaluated at (nulls replaced by a live value)."""
    s_max = jnp.max(s, axis=-1, keepdims=True)
    live = s > rtol * s_max
    return live, jnp.where(live, s, jnp.where(s_max > 0, s_max, 1))


def _live_fn(fn, live, t, params):
    """``fn(t, *params)`` on live entries, 0 on null ones."""
    return jnp.where(live, jnp.broadcast_to(fn(t, *params), live.shape).astype(t.dtype), 0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _spectral_map(fn, rtol, method, x, params):
    u, s, vt = _decompose_on_platforms(x, method)
    live, s_eval = _null_split(rtol, s)
    g = _live_fn(fn, live, s_eval, params)
    return _mm(u * g[..., None, :], vt), s


def _factor(fn, rtol, method, x, params) -> tuple[SpectralDerivative, jax.Array]:
    """Decompose ``x`` and form ``A``, ``B``, ``h`` of the Daleckii–Krein derivative (:func:`spectral_map`): the
    :class:`SpectralDerivative` with ``K = 1`` and no mask or parameter derivatives, and the points ``fn`` was
    evaluated at (shared by the custom JVP and :func:`spectral_derivative`)."""
    u, s, vt = _decompose_on_platforms(x, method)
    live, s_eval = _null_split(rtol, s)
    g, dg_ds = jax.jvp(lambda t: _live_fn(fn, live, t, params), (s_eval,), (jnp.ones_like(s),))
    s_live = jnp.where(live, s, 0)
    si, sj = s_live[..., :, None], s_live[..., None, :]
    gi, gj = g[..., :, None], g[..., None, :]
    diff, total = si - sj, si + sj
    delta = float(jnp.finfo(s.dtype).eps) ** (1 / 3)
    close = jnp.abs(diff) <= delta * jnp.maximum(si, sj)
    a = jnp.where(close, (dg_ds[..., :, None] + dg_ds[..., None, :]) / 2, (gi - gj) / jnp.where(close, 1, diff))
    b = jnp.where(total > 0, (gi + gj) / jnp.where(total > 0, total, 1), 0)
    h = jnp.where(live, g / jnp.where(live, s, 1), 0)
    one = jnp.ones(s.shape[:-1], s.dtype)
    y = _mm(u * g[..., None, :], vt)
    return SpectralDerivative(y, u, s, vt, live, g, a, b, h, (), None, one, jnp.zeros_like(one), ()), s_eval


def _action(f, dx, d_diag=None):
    """``(dY, diag(dP))`` for a direction ``dx`` and an optional diagonal term ``d_diag [..., k]``
    (``∂g/∂params · dparams``), by the formula of :func:`spectral_map`; ``f`` is a :class:`SpectralDerivative`.
    The map ``dx -> dY`` is self-adjoint, so this is also its adjoint."""
    u, vt, h = f.u, f.vt, f.h
    n, d = u.shape[-2], vt.shape[-1]
    ut = _t(u)
    if n <= d:  # u is square: only the row-space complement term remains
        w = _mm(ut, dx)  # [k, d]
        dp = _mm(w, _t(vt))  # Uᵀ dX V
    else:  # v is square: only the column-space complement term remains
        z = _mm(dx, _t(vt))  # [n, k]
        dp = _mm(ut, z)
    dpt = _t(dp)
    ds = jnp.diagonal(dp, axis1=-2, axis2=-1)
    m = f.a * (dp + dpt) / 2 + f.b * (dp - dpt) / 2
    if d_diag is not None:
        m = m + d_diag[..., None] * jnp.eye(ds.shape[-1], dtype=ds.dtype)
    if n < d:  # U [m − diag(h) dP] Vᵀ + U diag(h) Uᵀ dX
        dy = _mm(u, _mm(m - h[..., :, None] * dp, vt) + h[..., :, None] * w)
    elif n > d:  # U [m − dP diag(h)] Vᵀ + dX V diag(h) Vᵀ
        dy = _mm(_mm(u, m - dp * h[..., None, :]) + z * h[..., None, :], vt)
    else:
        dy = _mm(_mm(u, m), vt)
    return dy, ds


@_spectral_map.defjvp
def _spectral_map_jvp(fn, rtol, method, primals, tangents):
    (x, params), (dx, dparams) = primals, tangents
    f, s_eval = _factor(fn, rtol, method, x, params)
    dg_params = jax.jvp(lambda *p: _live_fn(fn, f.live, s_eval, p), params, dparams)[1]
    dy, ds = _action(f, dx, dg_params)
    return (f.y, f.s), (dy, ds)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SpectralDerivative:
    """The derivative at one ``X`` of ``X̃ = K(σ_max, p) · Y`` with ``Y = Σ_live g(s_i, p) u_i v_iᵀ``, as an
    explicit linear operator (Daleckii–Krein). ``K = 1`` for :func:`spectral_derivative` (the derivative of
    :func:`spectral_map`); SoftDecay's rescale ``K = σ_max/f(σ_max)`` for
    :func:`isojax.softdecay.softdecay_derivative`. A pytree: it can be returned from ``jit`` and ``vmap``-ed.

    In the singular bases of ``X`` (``k = min(n, d)``, ``dP = Uᵀ dX V``) the map ``dX -> dY`` is diagonal::

        dP_ij + dP_ji  ->  A_ij (dP_ij + dP_ji),   dP_ij − dP_ji  ->  B_ij (dP_ij − dP_ji),   dP_ii -> A_ii dP_ii
        complement blocks (Uᵀ dX V_⊥ for n < d, U_⊥ᵀ dX V for n > d):  row/column i scaled by h_i

    so it is self-adjoint with singular values ``|A_ij|``, ``|B_ij|`` (``i < j``, both live), ``|A_ii|`` (``i`` live),
    ``|h_i|`` with multiplicity ``n_r + d − 2r`` (``r`` live values, ``n_r`` real rows) and zeros. The rescale
    adds, through ``dσ_max = dP_00``, the rank-one term ``Y · ∂K/∂σ_max · dP_00``: off the diagonal the operator
    is ``K`` times the one above; on the diagonal coordinates ``dP_ii`` it is the ``k × k`` matrix
    ``M = K diag(A_ii) + ∂K/∂σ_max · g e_0ᵀ``, whose singular values replace ``|K A_ii|``.

    Attributes:
      y: ``[..., n, d]`` ``Y = Σ_live g(s_i) u_i v_iᵀ``, before the scale (working dtype; masked rows 0).
      u: ``[..., n, k]`` left singular vectors.
      s: ``[..., k]`` singular values (``s[..., 0]`` is ``σ_max``).
      vt: ``[..., k, d]`` right singular vectors (transposed).
      live: ``[..., k]`` bool, ``s_i > rtol·s_max``.
      g: ``[..., k]`` ``g(s_i)`` (0 for null values).
      a: ``[..., k, k]`` ``A_ij = (g_i − g_j)/(s_i − s_j)`` (``g'`` on the diagonal and at ties), symmetric part.
      b: ``[..., k, k]`` ``B_ij = (g_i + g_j)/(s_i + s_j)``, antisymmetric part.
      h: ``[..., k]`` ``h_i = g_i/s_i`` (0 for null values), complement blocks.
      dg_dparams: ``∂g/∂p_j``, each ``[..., k, *p_j.shape]``.
      mask: ``[..., n]`` bool or None: masked rows are zero in and out.
      scale: ``[...]`` ``K``.
      dscale_ds: ``[...]`` ``∂K/∂σ_max``.
      dscale_dparams: ``∂K/∂p_j``, each ``[..., *p_j.shape]`` (empty: ``K`` does not depend on the parameters).
    """

    y: jax.Array
    u: jax.Array
    s: jax.Array
    vt: jax.Array
    live: jax.Array
    g: jax.Array
    a: jax.Array
    b: jax.Array
    h: jax.Array
    dg_dparams: tuple[jax.Array, ...]
    mask: jax.Array | None
    scale: jax.Array
    dscale_ds: jax.Array
    dscale_dparams: tuple[jax.Array, ...]

    @property
    def output(self) -> jax.Array:
        """``[..., n, d]`` ``X̃ = K · Y``."""
        return _scaled(self.scale, self.y)

    def _masked(self, z):
        return z if self.mask is None else jnp.where(self.mask[..., None], z, 0)

    def _full(self, z):
        """``z`` broadcast to ``[..., n, d]`` in the working dtype (so ``jvp(0, 1.0)`` is ``∂X̃/∂α``)."""
        return jnp.broadcast_to(jnp.asarray(z, self.y.dtype), self.y.shape)

    def jvp(self, dx, *dparams) -> SpectralMap:
        """Tangents ``(dX̃, ds)`` for ``dx [..., n, d]`` (broadcast) and optionally one tangent per parameter
        (= ``jax.jvp`` of :func:`spectral_map`, or of ``soft_decay`` for its operator; ``ds`` is the singular
        values' tangent). ``dX̃ = K dY + Y (∂K/∂σ_max ds_0 + Σ_j ∂K/∂p_j · dp_j)``."""
        dparams = tuple(jnp.asarray(dp, self.s.dtype) for dp in dparams)
        d_diag = _contract_params(self.dg_dparams, dparams)
        dy, ds = _action(self, self._masked(self._full(dx)), d_diag)
        dk = _contract_params(self.dscale_dparams, dparams, self.dscale_ds * ds[..., 0])
        return SpectralMap(self._masked(_scaled(self.scale, dy) + _scaled(dk, self.y)), ds)

    def vjp(self, dy, ds=None) -> tuple:
        """The adjoint: cotangents ``(dx, *dparams)`` of output cotangents ``dy [..., n, d]`` and optionally
        ``ds [..., k]`` (= ``jax.vjp``). With ``K̄ = ⟨Y, dy⟩``: ``dx = J(K dy) + U diag(ds + K̄ ∂K/∂σ_max e_0) Vᵀ``
        (``J = dX -> dY`` is self-adjoint), ``dp_j = Σ diag(Uᵀ K dy V) · ∂g/∂p_j + Σ K̄ ∂K/∂p_j`` (sums over the
        batch)."""
        dy = self._masked(self._full(dy))
        k_bar = jnp.sum(self.y * dy, axis=(-2, -1))
        ds = jnp.zeros_like(self.s) if ds is None else jnp.asarray(ds, self.s.dtype)
        ds = ds.at[..., 0].add(k_bar * self.dscale_ds)
        dx, diag = _action(self, _scaled(self.scale, dy), ds)
        dparams = [jnp.tensordot(diag, jac, axes=diag.ndim) for jac in self.dg_dparams]
        for i, jac in enumerate(self.dscale_dparams):
            dparams[i] = dparams[i] + jnp.tensordot(k_bar, jac, axes=k_bar.ndim)
        return (self._masked(dx), *dparams)

    def singular_values(self) -> jax.Array:
        """``[..., n·d]`` singular values of ``dX -> dX̃``, descending (class docstring): the singular values of
        the dense Jacobian ``∂ vec(X̃)/∂ vec(X)``, masked entries counted as zeros."""
        n, d = self.y.shape[-2:]
        k = self.s.shape[-1]
        i, j = jnp.triu_indices(k, 1)
        pair_live = self.live[..., i] & self.live[..., j]
        r = self.live.sum(-1)
        n_real = n if self.mask is None else self.mask.sum(-1)
        reps = jnp.arange(n + d) < (n_real + d - 2 * r)[..., None]  # multiplicity of each |h_i|
        h_rep = jnp.where(self.live[..., :, None] & reps[..., None, :], jnp.abs(self.h)[..., :, None], 0)
        ab = jnp.where(pair_live[..., None, :], jnp.abs(jnp.stack([self.a[..., i, j], self.b[..., i, j]], -2)), 0)
        off_diagonal = jnp.concatenate([ab.reshape(*ab.shape[:-2], -1), h_rep.reshape(*h_rep.shape[:-2], -1)], -1)
        diag = self.scale[..., None] * jnp.diagonal(self.a, axis1=-2, axis2=-1)
        rank_one = self.dscale_ds[..., None, None] * self.g[..., :, None] * (jnp.arange(k) == 0)
        block = diag[..., :, None] * jnp.eye(k, dtype=diag.dtype) + rank_one  # M (class docstring)
        values = jnp.concatenate(
            [jnp.abs(self.scale)[..., None] * off_diagonal, jnp.linalg.svd(block, compute_uv=False)], -1
        )
        return -jnp.sort(-values, axis=-1)[..., : n * d]  # the rest are zeros (null, masked or padding entries)

    def norm(self) -> jax.Array:
        """``[...]`` operator norm (largest singular value) of ``dX -> dX̃`` in the Frobenius norm."""
        return self.singular_values()[..., 0]

    def cond(self) -> jax.Array:
        """``[...]`` condition number of ``dX -> dX̃`` on the real rows (``inf`` where singular, e.g. for a
        rank-deficient ``X``)."""
        sv = self.singular_values()
        count = sv.shape[-1] if self.mask is None else self.mask.sum(-1) * self.y.shape[-1]
        smallest = jnp.take_along_axis(sv, jnp.broadcast_to(count - 1, sv.shape[:-1])[..., None], axis=-1)[..., 0]
        return jnp.where(smallest > 0, sv[..., 0] / jnp.where(smallest > 0, smallest, 1), jnp.inf)


def _scaled(k, z):
    """``k [...]`` times each matrix of ``z [..., n, d]``."""
    return k[..., None, None] * z


def _contract_params(jacobians, dparams, total=None):
    """``total + Σ_j jac_j · dp_j`` over each parameter's own axes (None when there is neither)."""
    for jac, dp in zip(jacobians, dparams):
        term = jnp.tensordot(jac, dp, axes=dp.ndim) if dp.ndim else jac * dp
        total = term if total is None else total + term
    return total


def spectral_derivative(
    x, fn: Callable, *params, mask=None, rtol: float | None = None, method: str | Callable = "auto"
) -> SpectralDerivative:
    """The derivative of ``spectral_map(x, fn, *params, mask=mask, rtol=rtol, method=method)`` at ``x`` as a
    :class:`SpectralDerivative` (``K = 1``): its ``jvp`` equals ``jax.jvp`` of :func:`spectral_map`, its ``vjp``
    ``jax.vjp``; it exposes the divided-difference matrices ``A``, ``B``, ``h`` (formula in :func:`spectral_map`),
    the operator's singular values, norm and condition number. Same arguments as :func:`spectral_map`;
    everything is in the working dtype. It shares its implementation with the custom JVP.

    Args:
      x: ``[..., n, d]`` floating array.
      fn: ``fn(s, *params)``, elementwise in ``s`` (as in :func:`spectral_map`).
      *params: arrays ``fn`` depends on (their tangents are the extra arguments of ``jvp``).
      mask: optional ``[..., n]`` bool, true = real row.
      rtol: static float, the null threshold relative to ``s_max`` (default ``max(n, d) · eps``).
      method: static ``"auto"``, decomposition name or callable.

    Returns:
      A :class:`SpectralDerivative` with leading shape ``[...]``, ``k = min(n, d)``, in the working dtype.

    Examples:
      For ``g(s) = s³`` (``Y = X Xᵀ X``) the product rule gives ``dY = dX XᵀX + X dXᵀ X + X Xᵀ dX``.

      >>> import numpy as np
      >>> from isojax import spectral
      >>> rng = np.random.default_rng(0)
      >>> x, dx = rng.normal(size=(2, 4, 3)).astype(np.float32)
      >>> op = spectral.spectral_derivative(x, lambda s: s**3)
      >>> np.allclose(op.jvp(dx).y, dx @ x.T @ x + x @ dx.T @ x + x @ x.T @ dx, atol=1e-4)
      True
    """
    xw, mask, params, rtol, method = _prepare(x, fn, params, mask, rtol, method)
    f, s_eval = _factor(fn, rtol, method, xw, params)
    g_of = lambda *p: _live_fn(fn, f.live, s_eval, p)  # noqa: E731
    dg_dparams = tuple(jax.jacfwd(g_of, argnums=tuple(range(len(params))))(*params)) if params else ()
    y = f.y if mask is None else jnp.where(mask[..., None], f.y, 0)
    return dataclasses.replace(f, y=y, dg_dparams=dg_dparams, mask=mask)
