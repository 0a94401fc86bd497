"""A stable, differentiable map of singular values: ``X = U diag(s) Vᵀ  ->  Y = U diag(g(s)) Vᵀ``.

``jnp.linalg.svd`` differentiates ``U`` and ``V`` through ``1/(s_i² − s_j²)``, which is infinite where
singular values repeat or vanish, so gradients of ``U g(S) Vᵀ`` are NaN on padding, repeated tokens and
rank-deficient inputs (JAX issue #2311). :func:`spectral_map` gives the map its own derivative instead: the
Daleckii–Krein formula for rectangular matrices, written with divided differences of ``g`` whose limits are
taken explicitly, so the derivative is exact where singular values are distinct and where they coincide.
:func:`spectral_derivative` returns that derivative as an explicit linear operator (:class:`SpectralDerivative`).

**Null space.** For ``g(0) ≠ 0`` the thin SVD's vectors for zero singular values are arbitrary and
``g(0) u vᵀ`` would leak that arbitrary choice into ``Y``. Here a singular value is *null* when
``s ≤ rtol · s_max`` (default ``rtol = max(n, d) · eps``, as in ``numpy.linalg.matrix_rank``), and null pairs
contribute nothing::

    Y = Σ_{s_i > rtol·s_max} g(s_i) u_i v_iᵀ  =  X · V_r diag(g(s_r)/s_r) V_rᵀ

which depends only on ``X`` (the right-hand side names no singular vector of a null or repeated value).
For ``g(0) ≠ 0`` no basis-independent definition can be continuous at a rank drop (approaching along
``ε a bᵀ`` in the null space gives ``g(0) a bᵀ`` for any ``a, b``); this one is the limit along matrices of
the same rank, and its derivative below is the derivative of that rank-stratum map.

**Non-finite input.** No decomposition ever receives a matrix holding NaN or inf (LAPACK's iterative SVD may
never return on one, also under ``jit``): such a matrix is replaced by zeros before the decomposition and its
outputs (``U``, ``s``, ``V``, hence ``Y`` and every derivative) are NaN. Concrete input is checked first: a
NaN or inf in a real row raises ``ValueError`` naming the row (padding rows are zeroed before anything else,
whatever they hold). Products of singular vectors are exact at any scale, but the Gram routes square the
entries, so with them float32 input must stay below about 1e19.

**Decompositions.** The derivative needs only ``U, s, V``, however they were computed, so the thin SVD is a
choice (``method=``; :data:`DECOMPOSITIONS` lists them with the platforms whose JAX lowers them, :func:`thin_svd`
runs one). Wide matrices are decomposed as ``Xᵀ`` (LAPACK's SVD is faster on tall matrices).

- ``svd``: ``jax.lax.linalg.svd`` (= ``jnp.linalg.svd``) with the backend's default: LAPACK gesdd on CPU;
  cuSOLVER gesvdj (Jacobi, batched only up to 32 × 32, else one matrix at a time) when both sides are ≤ 1024,
  gesvd above, on GPU; QDWH polar SVD on TPU. All platforms.
- ``svd_qr`` (``SvdAlgorithm.QR``: gesvd; cpu, cuda, rocm), ``svd_dc`` (``DIVIDE_AND_CONQUER``: gesdd; cpu, rocm),
  ``svd_jacobi`` (``JACOBI``: gesvdj; cuda, rocm), ``svd_polar`` (``POLAR``: gesvdp on GPU, QDWH on TPU).
- ``qr_svd``: Householder QR of ``X`` or ``Xᵀ`` so that the square factor ``R`` is ``min(n, d)`` wide, then
  ``svd`` of ``R``. All platforms.
- ``gram_eigh`` (default implementation; all platforms), ``gram_eigh_qr`` (``EighImplementation.QR``; cpu, cuda,
  rocm), ``gram_eigh_jacobi`` (cuda, rocm, tpu), ``gram_eigh_qdwh`` (tpu): ``jax.lax.linalg.eigh`` of the smaller
  Gram matrix ``G = A Aᵀ = W diag(λ) Wᵀ`` (``A`` = ``X`` or ``Xᵀ``, whichever has fewer rows) in the working
  dtype, then the other side from ``Aᵀ W = Q R`` (Householder QR, sign-fixed so ``R_ii ≥ 0``): its vectors are
  ``Q`` (``Aᵀ w_i / s_i`` re-orthonormalised: the large-value directions that rounding mixes into the small ones
  are removed and null columns completed to an orthonormal set) and ``s_i = R_ii``, whose error is
  ``O(eps·s_max)`` like an SVD's instead of the ``O(eps·s_max²/s_i)`` of ``√λ_i``; descending up to rounding.
  On CPU LAPACK's syevd runs whatever implementation is named.
- ``gram_eigh_f64``, ``gram_eigh_f64_qr``, ``gram_eigh_f64_jacobi`` (cpu, cuda, rocm): the same with ``G``
  formed and decomposed in float64, also for float32 inputs and with ``jax_enable_x64`` off (enabled locally for
  the decomposition; the results are rounded back to the working dtype).

**Accuracy** (float32 inputs, largest relative error of ``Y = soft_decay(X, −0.6)`` against float64, measured
by ``python -m experiments.benchmarks.decompositions``, ``experiments/results/decompositions.md``; κ = σ_max/σ_min over the
live values). The SVD routes are backward stable: error ~``eps·κ`` at most (1e-6 up to κ = 1e2, 5e-6 at 1e3,
4e-5 at 1e4). ``gram_eigh_f64`` is the most accurate (≤ 5e-7 everywhere: one float32 rounding of a float64
result). Forming ``XXᵀ`` in float32 squares the condition number: ``gram_eigh`` reaches 2e-5 at κ = 1e2, 1e-2 at
κ = 1e3, 9e-2 at 1e4, and its smallest singular values are off by 1.4e-2 at κ = 1e3. On the default model's
token states that is 2e-6 for single STS-B sentences (κ ≈ 36), 1.4e-5 for the [2758, 384] sentence matrix
(κ ≈ 84), but 2.7e-3 for 128-token sequences (κ ≈ 560), with the JVP 2.5e-2 and the smallest singular value
1.1e-2 off. So float32 Gram eigh is accurate enough for SoftDecay only for κ up to about 30–100 (short
sequences); for full sequences it gets wrong exactly the small singular values SoftDecay raises. It is never
chosen automatically.

**Platforms.** The platform is the one the computation is *lowered* for, not the backend it is traced on: each
call stages one ``jax.lax.platform_dependent`` branch per distinct choice, and lowering keeps only the branches of
its platforms, so ``jax.export.export(..., platforms=("tpu",))`` from a CPU host holds the TPU choice alone (no
float64) and one artifact exported for several platforms carries each platform's choice. A named strategy a
platform has no lowering for (not in its :data:`DECOMPOSITIONS` entry) is refused for that platform with a
``ValueError`` naming the platform and the strategies it has: when called outside ``jit``, else when that
platform's branch is lowered, before JAX's own ``NotImplementedError``. ``svd_qr`` on CPU (LAPACK gesvd) and
``svd_polar`` on GPUs (cuSOLVER gesvdp) lower and run, but their custom calls have no export compatibility
guarantee: ``jax.export`` serialises them only with ``DisabledSafetyCheck.custom_call`` (``python -m
experiments.benchmarks.lowering`` shows every platform's cells).

**Automatic choice** (``method="auto"``, :func:`select_method`), per lowering platform and from the matrix shape:

- CPU: ``svd``. On 2 shared CPU cores (``experiments/results/decompositions.md``: forward + backward of
  ``soft_decay`` on 32 × [128, 768], 32 × [128, 384] and [2758, 384], interleaved medians) ``svd``, ``svd_dc`` and
  ``qr_svd`` differ by no more than the noise (``svd`` and ``svd_dc`` are the same program and differed by up to
  23 %); ``svd_qr`` (gesvd) takes 2.0–2.1× and ``gram_eigh_f64`` 1.3–1.8× the time of ``svd``; float32
  ``gram_eigh`` (0.7–1.1×) is the only one that may be faster, and it is not accurate enough. ``svd`` also keeps
  results bit-identical to the earlier single-strategy code.
- TPU: ``svd`` (QDWH; TPUs have no float64 for the accurate Gram route).
- GPU (CUDA, ROCm): ``gram_eigh_f64`` when a side is longer than 32, else ``svd`` (cuSOLVER's batched Jacobi).
  **Provisional**: not measured here, but chosen from what JAX documents: above 32 × 32 the SVD of a batch runs
  one matrix at a time (32 sequential gesvdj calls for a BERT batch of [128, 768] matrices), while the Gram route
  is a batched product, a batched eigh (JAX issue 31368's ~1000× cliff above 32 × 32, a per-matrix syevd loop,
  was addressed by PR 31375 before JAX 0.11.2; not verified here) and a QR; in float64 because float32 squares κ.
  Its QR's orgqr step also loops over the batch in jaxlib. ``python -m experiments.accelerator`` times every
  strategy of :data:`DECOMPOSITIONS` on the device; this rule is to be replaced by what it measures.

**On a GPU** (one NVIDIA H200, jax 0.11.2, 2026-11-28, ``experiments/results/accelerator/nvidia-h200.md``; the
suite stopped at its 290 s limit after 1811 tests: 1756 passed, 10 failed, 45 skipped). ``svd_polar`` (cuSOLVER
gesvdp) failed seven tests: the SVD identities at 100·eps (orthonormal ``U`` and ``V``, ``s``, ``U diag(s) Vᵀ =
X``) in float32 and float64, masked rows, rank-deficient input and the degenerate derivative; do not use it on GPUs
for masked or rank-deficient input until those misses are measured. ``svd``, ``svd_jacobi`` and ``qr_svd``
(cuSOLVER gesvdj) each missed Algorithm 1 at 1e-5 absolute with the rescaling in one test and passed the others
that ran; ``gram_eigh_f64`` failed none. The sizes of the misses were not recorded, and the timings that are to
replace the provisional rule were not reached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple, cast

import jax
import jax.extend.backend
import jax.extend.core
import jax.interpreters.ad
import jax.interpreters.batching
import jax.interpreters.mlir
import jax.numpy as jnp
from jax import lax

from isojax._numeric import finite_matrix, nan_unless
from isojax._validate import check_cloud

__all__ = [
    "DECOMPOSITIONS",
    "Decomposition",
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


def _mm(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


def _t(a):
    return jnp.swapaxes(a, -1, -2)


class Decomposition(NamedTuple):
    """One way of computing the thin SVD (an entry of :data:`DECOMPOSITIONS`).

    Attributes:
      route: ``"svd"`` (one SVD), ``"qr_svd"`` (QR, then the square factor's SVD) or ``"gram_eigh"``.
      algorithm: the ``algorithm`` of ``jax.lax.linalg.svd`` or ``implementation`` of ``jax.lax.linalg.eigh``.
      float64: for a Gram route, whether the Gram matrix is formed and decomposed in float64.
      platforms: the platforms whose JAX lowering exists (``cpu``, ``cuda``, ``rocm``, ``tpu``).
    """

    route: str
    algorithm: lax.linalg.SvdAlgorithm | lax.linalg.EighImplementation | None
    float64: bool
    platforms: tuple[str, ...]


_SVD, _EIGH = lax.linalg.SvdAlgorithm, lax.linalg.EighImplementation
DECOMPOSITIONS: dict[str, Decomposition] = {
    "svd": Decomposition("svd", None, False, _ALL),
    "svd_qr": Decomposition("svd", _SVD.QR, False, ("cpu", "cuda", "rocm")),
    "svd_dc": Decomposition("svd", _SVD.DIVIDE_AND_CONQUER, False, ("cpu", "rocm")),
    "svd_jacobi": Decomposition("svd", _SVD.JACOBI, False, ("cuda", "rocm")),
    "svd_polar": Decomposition("svd", _SVD.POLAR, False, ("cuda", "rocm", "tpu")),
    "qr_svd": Decomposition("qr_svd", None, False, _ALL),
    "gram_eigh": Decomposition("gram_eigh", None, False, _ALL),
    "gram_eigh_qr": Decomposition("gram_eigh", _EIGH.QR, False, ("cpu", "cuda", "rocm")),
    "gram_eigh_jacobi": Decomposition("gram_eigh", _EIGH.JACOBI, False, ("cuda", "rocm", "tpu")),
    "gram_eigh_qdwh": Decomposition("gram_eigh", _EIGH.QDWH, False, ("tpu",)),
    "gram_eigh_f64": Decomposition("gram_eigh", None, True, ("cpu", "cuda", "rocm")),
    "gram_eigh_f64_qr": Decomposition("gram_eigh", _EIGH.QR, True, ("cpu", "cuda", "rocm")),
    "gram_eigh_f64_jacobi": Decomposition("gram_eigh", _EIGH.JACOBI, True, ("cuda", "rocm")),
}
"""The decomposition strategies by name (module docstring); ``method=`` takes a name or ``"auto"``."""


def current_platform() -> str:
    """``jax.default_backend()``, with GPUs split into ``cuda`` and ``rocm``: the platform code runs on when it is
    not exported for another one (what the experiments time and report; the decomposition itself is chosen per
    lowering platform, see :func:`select_method`).

    Returns:
      ``"cpu"``, ``"cuda"``, ``"rocm"`` or ``"tpu"``.

    Examples:
      >>> from isojax import spectral
      >>> spectral.current_platform() in ("cpu", "cuda", "rocm", "tpu")
      True
    """
    backend = jax.default_backend()
    if backend == "gpu":
        version = jax.extend.backend.get_backend().platform_version.lower()
        return "rocm" if "rocm" in version else "cuda"
    return backend


def available_methods(platform: str | None = None) -> list[str]:
    """Names in :data:`DECOMPOSITIONS` that lower on ``platform`` (default :func:`current_platform`).

    Args:
      platform: ``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"`` or None (the current one).

    Returns:
      A list of method names (str), in the order of :data:`DECOMPOSITIONS`.

    Examples:
      >>> from isojax import spectral
      >>> spectral.available_methods("tpu")
      ['svd', 'svd_polar', 'qr_svd', 'gram_eigh', 'gram_eigh_jacobi', 'gram_eigh_qdwh']
    """
    platform = current_platform() if platform is None else _check_platform(platform)
    return [name for name, dec in DECOMPOSITIONS.items() if platform in dec.platforms]


def _check_platform(platform: str) -> str:
    if platform not in _ALL:
        raise ValueError(f"platform must be one of {list(_ALL)}, got {platform!r}")
    return platform


def _check_method(method: str) -> str:
    """``method`` if it is ``"auto"`` or a name in :data:`DECOMPOSITIONS`, else ``ValueError`` listing them."""
    if method != "auto" and method not in DECOMPOSITIONS:
        raise ValueError(f"method must be 'auto' or one of {list(DECOMPOSITIONS)}, got {method!r}")
    return method


def _refusal(method: str, platform: str) -> str | None:
    """Why ``method`` cannot run on ``platform`` (None when it can)."""
    if method == "auto" or platform in DECOMPOSITIONS[method].platforms:
        return None
    return (
        f"method {method!r} does not lower on {platform} (only on {', '.join(DECOMPOSITIONS[method].platforms)});"
        f" on {platform} choose 'auto' or one of {available_methods(platform)}"
    )


def select_method(method: str, shape, platform: str | None = None) -> str:
    """The decomposition ``method`` resolves to for ``[..., n, d]`` matrices of ``shape`` on ``platform``.

    ``"auto"`` applies the rule of the module docstring; a name is checked against :data:`DECOMPOSITIONS` and the
    platform (default :func:`current_platform`). Raises ``ValueError`` listing the choices otherwise.

    Inside isojax's functions the same rule is applied to each platform the computation is *lowered* for, not to
    the backend it is traced on (``jax.lax.platform_dependent``): one program exported with
    ``jax.export.export(..., platforms=("cpu", "cuda", "tpu"))`` runs ``svd`` on CPU and TPU and
    ``gram_eigh_f64`` on a GPU, and a name a lowering platform does not support is refused when that platform's
    branch is lowered (or, outside ``jit``, when it is called) with this function's ``ValueError``.

    Args:
      method: ``"auto"`` or a name in :data:`DECOMPOSITIONS`.
      shape: the shape ``[..., n, d]`` of the matrices (a tuple of ints).
      platform: ``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"`` or None (the current one).

    Returns:
      The method name (str) that runs.

    Examples:
      On a GPU, ``"auto"`` takes the float64 Gram route above 32 rows or columns and the SVD below.

      >>> from isojax import spectral
      >>> spectral.select_method("auto", (8, 128, 384), "cuda"), spectral.select_method("auto", (8, 16, 16), "cuda")
      ('gram_eigh_f64', 'svd')
    """
    method = _check_method(method)
    platform = current_platform() if platform is None else _check_platform(platform)
    if method == "auto":
        return _auto(shape, platform)
    if (reason := _refusal(method, platform)) is not None:
        raise ValueError(reason)
    return method


def _auto(shape, platform: str) -> str:
    """The ``method="auto"`` rule (module docstring)."""
    if platform in ("cuda", "rocm") and max(shape[-2:]) > 32:
        return "gram_eigh_f64"
    return "svd"


def thin_svd(x, method: str = "auto"):
    """Thin SVD ``x = u diag(s) vt`` by one of :data:`DECOMPOSITIONS`.

    Args:
      x: ``[..., n, d]`` floating; decomposed in :func:`working_dtype` (float32 for bf16).
      method: a name in :data:`DECOMPOSITIONS` or ``"auto"``, resolved per lowering platform
        (:func:`select_method`).

    Returns:
      ``(u [..., n, k], s [..., k], vt [..., k, d])`` in the working dtype, ``k = min(n, d)``, ``s ≥ 0`` in descending
      order (the Gram route: ``s_i = |R_ii|``, descending up to rounding). Differentiating these directly uses
      JAX's own rules (NaN on repeated values); differentiate through :func:`spectral_map` instead.

    Examples:
      >>> import numpy as np
      >>> from isojax import spectral
      >>> u, s, vt = spectral.thin_svd(np.array([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]], np.float32))
      >>> np.round(np.asarray(s, np.float64), 4).tolist(), u.shape, vt.shape
      ([3.0, 1.0], (3, 2), (2, 2))
    """
    x = check_cloud(x)[0]
    return _decompose_on_platforms(x.astype(working_dtype(x.dtype)), _check_method(method))


def _decompose(x, method: str):
    """``(u, s, vt)`` of ``x`` by ``method``; NaN, without decomposing it, for a matrix that is not finite."""
    x, ok = finite_matrix(x)
    return nan_unless(ok, _decompose_finite(x, method))


def _decompose_finite(x, method: str):
    dec = DECOMPOSITIONS[method]
    if dec.route == "gram_eigh":
        return _gram_eigh(x, dec.algorithm, dec.float64)
    tall = x.shape[-2] >= x.shape[-1]
    a = x if tall else _t(x)  # decompose the tall side: a = q diag(s) wt
    if dec.route == "qr_svd":
        q, r = jnp.linalg.qr(a)
        ur, s, wt = lax.linalg.svd(r, full_matrices=False)
        q = _mm(q, ur)
    else:
        # the svd route's algorithm is an SvdAlgorithm (DECOMPOSITIONS)
        q, s, wt = lax.linalg.svd(a, full_matrices=False, algorithm=cast(lax.linalg.SvdAlgorithm | None, dec.algorithm))
    return (q, s, wt) if tall else (_t(wt), s, _t(q))


def _gram_eigh(x, implementation, float64: bool):
    """Gram route (module docstring): eigh of ``A Aᵀ`` for the shorter side ``A``, other side by QR of ``Aᵀ W``."""
    dtype = x.dtype
    wide = x.shape[-2] <= x.shape[-1]
    a = x if wide else _t(x)  # [k, m], k <= m
    with jax.enable_x64(True) if float64 else contextlib.nullcontext():
        if float64:
            a = a.astype(jnp.float64)
        w, _ = lax.linalg.eigh(_mm(a, _t(a)), implementation=implementation)
        w = w[..., ::-1]  # descending eigenvalues
        q, r = jnp.linalg.qr(_mm(_t(a), w))  # Aᵀ W = Q R, Q [m, k]
        r_diag = jnp.diagonal(r, axis1=-2, axis2=-1)
        q = q * jnp.where(r_diag < 0, -1, 1).astype(q.dtype)[..., None, :]
        s = jnp.abs(r_diag)
        w, s, q = (t.astype(dtype) for t in (w, s, q))
    return (w, s, _t(q)) if wide else (q, s, _t(w))


def _decompose_on_platforms(x, method: str):
    """The thin SVD by ``method`` (a name or ``"auto"``) as :func:`select_method` resolves it for each platform the
    computation is lowered for: one ``jax.lax.platform_dependent`` branch per distinct choice, so a program lowered
    for one platform contains only that platform's decomposition (no float64 in a TPU module). A platform that
    cannot run an explicitly named method gets a branch that raises :func:`select_method`'s ``ValueError`` when it
    is lowered (or called outside ``jit``) instead of JAX's ``NotImplementedError`` from inside its lowering."""
    runs = {p: _auto(x.shape, p) if method == "auto" else method for p in _ALL if _refusal(method, p) is None}
    float64 = any(DECOMPOSITIONS[m].float64 for m in runs.values())
    x64 = bool(
        jax.config.read("jax_enable_x64")
    )  # the caller's setting, kept in every branch that does not need float64
    branches = {
        m: functools.partial(_branch, method=m, x64=x64 or DECOMPOSITIONS[m].float64)
        for m in dict.fromkeys(runs.values())
    }
    per_platform = {
        p: branches[runs[p]]
        if p in runs
        else functools.partial(_branch, method="gram_eigh", x64=x64, reason=_refusal(method, p))
        for p in _ALL
    }
    # platforms that share a branch share one callable (platform_dependent joins them). With a float64 branch the
    # whole dispatch is staged and transformed (vmap, grad) with float64 enabled, as that branch is when it runs
    # alone; each branch sets its own mode, so the others (a TPU one) hold no float64 constant.
    with jax.enable_x64(True) if float64 else contextlib.nullcontext():
        return lax.platform_dependent(x, **per_platform)


def _branch(x, method: str, x64: bool, reason: str | None = None):
    """One platform's branch of :func:`_decompose_on_platforms`: ``method``'s decomposition with float64 enabled
    as ``x64`` says; with a ``reason``, a stand-in that raises it as a ``ValueError`` when it is lowered or evaluated
    (the platform cannot run the method; the shapes are those of any decomposition's)."""
    with jax.enable_x64(x64):
        if reason is not None:
            x = _refuse_p.bind(x, reason=reason)
        return _decompose(x, method)


def _refuse_raise(*_, reason: str, **__):
    raise ValueError(reason)


_refuse_p = jax.extend.core.Primitive("isojax_refused_decomposition")
"""Identity on abstract values whose evaluation and lowering raise ``ValueError(reason)``: it marks a platform
branch of :func:`_decompose_on_platforms` that must never be compiled."""
_refuse_p.def_impl(_refuse_raise)
_refuse_p.def_abstract_eval(lambda x, reason: x)
jax.interpreters.mlir.register_lowering(_refuse_p, _refuse_raise)
jax.interpreters.batching.primitive_batchers[_refuse_p] = lambda args, dims, reason: (
    _refuse_p.bind(*args, reason=reason),
    dims[0],
)
jax.interpreters.ad.primitive_jvps[_refuse_p] = lambda primals, tangents, reason: (
    _refuse_p.bind(*primals, reason=reason),
    tangents[0],
)


class SpectralMap(NamedTuple):
    """Result of :func:`spectral_map`.

    Attributes:
      y: ``[..., n, d]`` the transformed matrix, in the input dtype.
      s: ``[..., min(n, d)]`` singular values of the (masked) input, descending (up to rounding for the Gram route), in
        the working dtype.
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
    n, d = x.shape[-2:]
    work = working_dtype(x.dtype)
    if rtol is None:
        rtol = max(n, d) * float(jnp.finfo(work).eps)
    elif not rtol >= 0:
        raise ValueError(f"rtol must be a non-negative float or None, got {rtol!r}")
    xw = x.astype(work)
    if mask is not None:
        xw = jnp.where(mask[..., None], xw, 0)
    xw = nan_unless(ok, xw)  # traced bad input: a NaN matrix, which the guarded decomposition turns into NaN out
    return xw, mask, tuple(jnp.asarray(p) for p in params), float(rtol), _check_method(method)


def spectral_map(x, fn: Callable, *params, mask=None, rtol: float | None = None, method: str = "auto") -> SpectralMap:
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
      rtol: singular values ``s ≤ rtol · s_max`` are null (module docstring); default ``max(n, d) · eps``.
      method: how the thin SVD is computed: ``"auto"`` or a name in :data:`DECOMPOSITIONS` (module docstring);
        ``ValueError`` for an unknown name or one the backend cannot lower. Only ``U, s, V`` change with it,
        never the derivative's formula.

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


class _Factors(NamedTuple):
    """The decomposition and the divided differences of ``g`` at one ``X`` (shared by the custom JVP and
    :class:`SpectralDerivative`)."""

    u: jax.Array
    s: jax.Array
    vt: jax.Array
    live: jax.Array
    s_eval: jax.Array
    g: jax.Array
    a: jax.Array
    b: jax.Array
    h: jax.Array


def _factor(fn, rtol, method, x, params) -> _Factors:
    """Decompose ``x`` and form ``A``, ``B``, ``h`` of the Daleckii–Krein derivative (:func:`spectral_map`)."""
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
    return _Factors(u, s, vt, live, s_eval, g, a, b, h)


def _action(f, dx, d_diag=None):
    """``(dY, diag(dP))`` for a direction ``dx`` and an optional diagonal term ``d_diag [..., k]``
    (``∂g/∂params · dparams``), by the formula of :func:`spectral_map`; ``f`` has the fields ``u, vt, a, b, h`` of
    :class:`_Factors`. The map ``dx -> dY`` is self-adjoint, so this is also its adjoint."""
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
    x, params = primals
    dx, dparams = tangents
    f = _factor(fn, rtol, method, x, params)
    dg_params = jax.jvp(lambda *p: _live_fn(fn, f.live, f.s_eval, p), params, dparams)[1]
    dy, ds = _action(f, dx, dg_params)
    return (_mm(f.u * f.g[..., None, :], f.vt), f.s), (dy, ds)


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
        dk = self.dscale_ds * ds[..., 0]
        dk_params = _contract_params(self.dscale_dparams, dparams)
        if dk_params is not None:
            dk = dk + dk_params
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
        diag = self.scale[..., None] * jnp.diagonal(self.a, axis1=-2, axis2=-1)
        block = diag[..., :, None] * jnp.eye(k, dtype=diag.dtype) + self.dscale_ds[..., None, None] * self.g[
            ..., :, None
        ] * (jnp.arange(k) == 0)  # M (class docstring)
        values = jnp.concatenate(
            [
                jnp.abs(self.scale)[..., None]
                * jnp.concatenate(
                    [
                        jnp.where(pair_live, jnp.abs(self.a[..., i, j]), 0),
                        jnp.where(pair_live, jnp.abs(self.b[..., i, j]), 0),
                        h_rep.reshape(*h_rep.shape[:-2], -1),
                    ],
                    axis=-1,
                ),
                jnp.linalg.svd(block, compute_uv=False),
            ],
            axis=-1,
        )
        return -jnp.sort(-values, axis=-1)[..., : n * d]  # the rest are zeros (null, masked or padding entries)

    def norm(self) -> jax.Array:
        """``[...]`` operator norm (largest singular value) of ``dX -> dX̃`` in the Frobenius norm."""
        return self.singular_values()[..., 0]

    def cond(self) -> jax.Array:
        """``[...]`` condition number of ``dX -> dX̃`` on the real rows (``inf`` where singular, e.g. for a
        rank-deficient ``X``)."""
        sv = self.singular_values()
        d = self.y.shape[-1]
        count = sv.shape[-1] if self.mask is None else self.mask.sum(-1) * d
        smallest = jnp.take_along_axis(sv, jnp.broadcast_to(count - 1, sv.shape[:-1])[..., None], axis=-1)[..., 0]
        return jnp.where(smallest > 0, sv[..., 0] / jnp.where(smallest > 0, smallest, 1), jnp.inf)


def _scaled(k, z):
    """``k [...]`` times each matrix of ``z [..., n, d]``."""
    return k[..., None, None] * z


def _contract_params(jacobians, dparams):
    """``Σ_j jac_j · dp_j`` over each parameter's own axes (None when there is none)."""
    total = None
    for jac, dp in zip(jacobians, dparams, strict=False):
        term = jnp.tensordot(jac, dp, axes=dp.ndim) if dp.ndim else jac * dp
        total = term if total is None else total + term
    return total


def spectral_derivative(
    x, fn: Callable, *params, mask=None, rtol: float | None = None, method: str = "auto"
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
      method: static decomposition name or ``"auto"``.

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
    f = _factor(fn, rtol, method, xw, params)
    g_of = lambda *p: _live_fn(fn, f.live, f.s_eval, p)  # noqa: E731
    dg_dparams = tuple(jax.jacfwd(g_of, argnums=tuple(range(len(params))))(*params)) if params else ()
    y = _mm(f.u * f.g[..., None, :], f.vt)
    if mask is not None:
        y = jnp.where(mask[..., None], y, 0)
    batch = f.s.shape[:-1]
    return SpectralDerivative(
        y=y,
        u=f.u,
        s=f.s,
        vt=f.vt,
        live=f.live,
        g=f.g,
        a=f.a,
        b=f.b,
        h=f.h,
        dg_dparams=dg_dparams,
        mask=mask,
        scale=jnp.ones(batch, f.s.dtype),
        dscale_ds=jnp.zeros(batch, f.s.dtype),
        dscale_dparams=(),
    )
