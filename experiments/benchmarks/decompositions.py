"""Accuracy and speed of each way of computing the thin SVD behind SoftDecay (:data:`STRATEGIES`).

    python -m experiments.benchmarks.decompositions [--methods svd,gram_eigh,...] [--alpha -0.6] [--repeats 7] [--skip-speed]
                                         [--skip-real] [--out experiments/results]

Error table: every strategy this backend lowers, on float32 inputs (random, degenerate, and real token / sentence
matrices of the default model on STS-B test sentences), against float64 references:
- ``Y``: ``soft_decay(X, α)`` against a float64 numpy Algorithm 1 on the same float32 matrix (thin SVD by LAPACK,
  singular values ``≤ max(n, d)·eps32·σ_max`` null, masked rows left out);
- ``dY``: ``jax.jvp`` in ``X`` along a random direction against a float64 reference: ``jax.jvp`` of isojax's
  Daleckii–Krein rule over LAPACK's float64 SVD (checked against float64 finite differences by the test suite),
  with the float32 null threshold, times Algorithm 1's ``K``;
- ``∂X̃/∂α`` (``jax.jvp`` in α) against the same float64 reference;
- ``s_min``: the smallest live singular value from ``isojax.spectral.thin_svd`` against numpy's float64 SVD.
Each entry is the largest relative error (Frobenius norm for matrices) over the matrices of the case; ``κ`` is the
largest ``σ_max/σ_min`` over their live singular values.
Speed table: ``jit`` of value-and-gradient (x and α) of ``Σ W ∘ soft_decay(X, α)`` on 32×[128, 768], 32×[128, 384]
and one [2758, 384] matrix, all strategies interleaved after warm-up (medians, ms, and the ratio to ``svd``).
Writes experiments/results/decompositions.{md,json}; ``docs/design/spectral.md`` reads the tables.

isojax itself keeps ``svd`` and ``gram_eigh_f64`` (``isojax.spectral.METHODS``), which ``method="auto"`` chooses
between per platform. :data:`STRATEGIES` holds those two and the strategies measured beside them; an entry is a
callable that isojax's ``method=`` accepts (:func:`method_for` gives the argument for a name), so that these
measurements, the accelerator command and the test suite can run every one of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os

# As in experiments/benchmarks/softdecay.py: jaxlib's CPU LAPACK calls run inside XLA's own thread pool, and
# OpenBLAS threads on top of that oversubscribe the cores. Must be set before numpy/jax load.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.benchmarks.common import median_ms  # noqa: E402
from experiments.tooling.report import markdown_table, provenance, write_result  # noqa: E402
from isojax.argtypes import int_at_least  # noqa: E402
from isojax.softdecay import decay_curve, soft_decay  # noqa: E402
from isojax.spectral import (  # noqa: E402
    METHODS,
    current_platform,
    gram_eigh,
    select_method,
    spectral_map,
    svd,
    thin_svd,
)

EPS32 = float(np.finfo(np.float32).eps)
SPEED_SHAPES = ((32, 128, 768), (32, 128, 384), (2758, 384))
_ALL = ("cpu", "cuda", "rocm", "tpu")


# ---------------------------------------------------------------------------------------------------- strategies
@dataclasses.dataclass(frozen=True)
class Strategy:
    """One way of computing the thin SVD; called on a finite ``[..., n, d]`` matrix in the working dtype it returns
    ``(u, s, vt)``, so an instance is a ``method=`` of isojax's functions (it runs as is on every platform).

    Attributes:
      name: the key in :data:`STRATEGIES`.
      route: ``"svd"`` (one SVD of the tall side), ``"qr_svd"`` (Householder QR, then the square factor's SVD) or
        ``"gram_eigh"`` (``isojax.spectral.gram_eigh``: eigh of the smaller Gram matrix, the other side by QR).
      algorithm: the ``algorithm`` of ``jax.lax.linalg.svd`` or ``implementation`` of ``jax.lax.linalg.eigh``.
      float64: for a Gram route, whether the Gram matrix is formed and decomposed in float64.
      platforms: the platforms whose JAX lowers it (``experiments/results/lowering.md``).
    """

    name: str
    route: str
    algorithm: jax.lax.linalg.SvdAlgorithm | jax.lax.linalg.EighImplementation | None
    float64: bool
    platforms: tuple[str, ...]

    def __call__(self, x):
        if self.route == "gram_eigh":
            return gram_eigh(x, self.algorithm, self.float64)  # type: ignore[arg-type]
        if self.route == "svd":
            return svd(x, self.algorithm)  # type: ignore[arg-type]
        tall = x.shape[-2] >= x.shape[-1]
        q, r = jnp.linalg.qr(x if tall else jnp.swapaxes(x, -1, -2))
        ur, s, wt = svd(r)
        q = jnp.matmul(q, ur, precision=jax.lax.Precision.HIGHEST)
        return (q, s, wt) if tall else (jnp.swapaxes(wt, -1, -2), s, jnp.swapaxes(q, -1, -2))


_SVD, _EIGH = jax.lax.linalg.SvdAlgorithm, jax.lax.linalg.EighImplementation
STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("svd", "svd", None, False, _ALL),
        Strategy("svd_qr", "svd", _SVD.QR, False, ("cpu", "cuda", "rocm")),
        Strategy("svd_dc", "svd", _SVD.DIVIDE_AND_CONQUER, False, ("cpu", "rocm")),
        Strategy("svd_jacobi", "svd", _SVD.JACOBI, False, ("cuda", "rocm")),
        Strategy("svd_polar", "svd", _SVD.POLAR, False, ("cuda", "rocm", "tpu")),
        Strategy("qr_svd", "qr_svd", None, False, _ALL),
        Strategy("gram_eigh", "gram_eigh", None, False, _ALL),
        Strategy("gram_eigh_qr", "gram_eigh", _EIGH.QR, False, ("cpu", "cuda", "rocm")),
        Strategy("gram_eigh_jacobi", "gram_eigh", _EIGH.JACOBI, False, ("cuda", "rocm", "tpu")),
        Strategy("gram_eigh_qdwh", "gram_eigh", _EIGH.QDWH, False, ("tpu",)),
        Strategy("gram_eigh_f64", "gram_eigh", None, True, ("cpu", "cuda", "rocm")),
        Strategy("gram_eigh_f64_qr", "gram_eigh", _EIGH.QR, True, ("cpu", "cuda", "rocm")),
        Strategy("gram_eigh_f64_jacobi", "gram_eigh", _EIGH.JACOBI, True, ("cuda", "rocm")),
    )
}
"""The strategies by name (``docs/design/spectral.md`` describes each and what was measured). ``svd`` and
``gram_eigh_f64`` are isojax's own :data:`isojax.spectral.METHODS`."""


def available_strategies(platform: str | None = None) -> list[str]:
    """Names in :data:`STRATEGIES` that lower on ``platform`` (default ``isojax.spectral.current_platform()``)."""
    platform = platform or current_platform()
    return [name for name, st in STRATEGIES.items() if platform in st.platforms]


def method_for(name: str, platform: str | None = None):
    """The ``method=`` argument that runs strategy ``name`` on ``platform`` (default the current one): isojax's own
    name for ``auto`` and :data:`isojax.spectral.METHODS` (chosen per lowering platform), else the
    :class:`Strategy`. ``ValueError`` naming it for an unknown name or one the platform does not lower."""
    platform = platform or current_platform()
    if name == "auto" or name in METHODS:
        select_method(name, (2, 2), platform)
        return name
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}: choose 'auto' or one of {list(STRATEGIES)}")
    if platform not in STRATEGIES[name].platforms:
        raise ValueError(
            f"method {name!r} does not lower on {platform} (only on {', '.join(STRATEGIES[name].platforms)});"
            f" on {platform} choose 'auto' or one of {available_strategies(platform)}"
        )
    return STRATEGIES[name]


# ---------------------------------------------------------------------------------------------------- cases
def _orthonormal(rng, n, k):
    return np.linalg.qr(rng.standard_normal((n, k)))[0]


def _with_spectrum(rng, n, d, s):
    k = len(s)
    return (_orthonormal(rng, n, k) * np.asarray(s)) @ _orthonormal(rng, d, k).T


def synthetic_cases(rng) -> dict[str, tuple[str, np.ndarray, np.ndarray | None]]:
    """``name -> (group, x [b, n, d] float32, mask [b, n] or None)``."""
    cases: dict[str, tuple[str, np.ndarray, np.ndarray | None]] = {
        "gaussian 4×[128, 768]": ("random", rng.standard_normal((4, 128, 768)), None),
        "gaussian 4×[128, 384]": ("random", rng.standard_normal((4, 128, 384)), None),
        "gaussian [768, 128] (tall)": ("random", rng.standard_normal((1, 768, 128)), None),
    }
    for kappa in (1e1, 1e2, 1e3, 1e4):
        spectra = np.geomspace(10.0, 10.0 / kappa, 128)
        cases[f"κ = {kappa:.0e}, 2×[128, 384]"] = (
            "random",
            np.stack([_with_spectrum(rng, 128, 384, spectra) for _ in range(2)]),
            None,
        )
    row = rng.standard_normal((1, 384))
    base = rng.standard_normal((40, 384))
    padded = np.concatenate([base, np.tile(base[:1], (88, 1))])[None]
    repeated = [5.0] + [2.0] * 60 + [1.0] * 67
    cases.update(
        {
            "repeated rows [128, 384] (rank 1)": ("degenerate", np.tile(row, (128, 1))[None], None),
            "rank 1 outer product [128, 384]": ("degenerate", np.outer(rng.standard_normal(128), row)[None], None),
            "40 rows + 88 copies of row 1": ("degenerate", padded, None),
            "40 rows + 88 masked rows": ("degenerate", padded, (np.arange(128) < 40)[None]),
            "repeated singular values (60×2, 67×1)": (
                "degenerate",
                _with_spectrum(rng, 128, 384, repeated)[None],
                None,
            ),
            "scale 1e-6, 2×[128, 384]": ("degenerate", 1e-6 * rng.standard_normal((2, 128, 384)), None),
            "scale 1e+6, 2×[128, 384]": ("degenerate", 1e6 * rng.standard_normal((2, 128, 384)), None),
        }
    )
    return {k: (g, x.astype(np.float32), m) for k, (g, x, m) in cases.items()}


def real_cases(n_sentences: int = 32, n_packed: int = 8) -> dict[str, tuple[str, np.ndarray, np.ndarray | None]]:
    """Last-layer token states of the default model (all-MiniLM-L6-v2) on STS-B test sentences, padded to 128 with
    the attention mask: single sentences, and sentences packed into ~128-token sequences; and the [2758, 384]
    matrix of STS-B test sentence embeddings (last2avg pooling, as in the SoftDecay paper's STS experiments)."""
    import isojax
    from isojax.data.sts import load_stsb
    from isojax.eval.encode import encode

    module, params, tokenizer = isojax.from_pretrained("default")
    data = load_stsb("test", source="package")
    sentences = data.sentences1 + data.sentences2
    packed, current = [], ""
    for sentence in dict.fromkeys(sentences):  # distinct sentences, joined while they fit in 128 tokens
        joined = f"{current} {sentence}".strip()
        if len(tokenizer(joined)["input_ids"]) > 128:
            packed.append(current)
            joined = sentence
            if len(packed) == n_packed:
                break
        current = joined
    apply = jax.jit(lambda ids, mask: module.apply({"params": params}, ids, mask).last_hidden_state)

    def tokens(texts):
        enc = tokenizer(texts, padding="max_length", truncation=True, max_length=128, return_tensors="np")
        mask = enc["attention_mask"].astype(bool)
        return np.asarray(apply(enc["input_ids"], mask), np.float32), mask

    single = tokens(sentences[:n_sentences])
    whole = tokens(packed)
    emb = encode(module, params, tokenizer, sentences, pooling="last2avg").astype(np.float32)
    lengths = single[1].sum(1)
    return {
        f"MiniLM tokens, {n_sentences} STS-B sentences ({lengths.min()}–{lengths.max()} of 128 rows, masked)": (
            "real",
            *single,
        ),
        f"MiniLM tokens, {n_packed} packed sequences ({whole[1].sum(1).min()}–{whole[1].sum(1).max()} of 128 "
        "rows, masked)": ("real", *whole),
        f"MiniLM sentence matrix [{len(emb)}, {emb.shape[1]}] (STS-B test, last2avg)": ("real", emb[None], None),
    }


# ---------------------------------------------------------------------------------------------------- errors
def numpy_soft_decay(x, alpha, mask, rtol):
    """float64 Algorithm 1 on each matrix, with masked rows left out and ``s ≤ rtol·s_max`` null."""
    x = np.asarray(x, np.float64)
    if mask is not None:
        x = np.where(mask[..., None], x, 0)
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    f = -np.log(1 - alpha * (s + alpha)) / alpha
    k = s[..., :1] / f[..., :1]
    live = s > rtol * s[..., :1]
    return (u * np.where(live, k * f, 0)[..., None, :]) @ vt, s, live


def _rel(a, b, scale=None):
    """Largest ``‖a − b‖/‖scale‖`` (Frobenius, ``scale = b`` by default) over the leading (batch) axis."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    axes = tuple(range(1, a.ndim))
    return float(np.max(np.linalg.norm(a - b, axis=axes) / np.linalg.norm(b if scale is None else scale, axis=axes)))


def _derivatives(y_of, x, alpha, dx):
    """``(Y, ∂Y/∂X · dx, ∂Y/∂α)`` of ``y_of(x, alpha)``."""
    y, dy = jax.jvp(y_of, (x, alpha), (dx, jnp.zeros_like(alpha)))
    return y, dy, jax.jvp(lambda a: y_of(x, a), (alpha,), (jnp.ones_like(alpha),))[1]


@functools.cache
def _runner(method: str):
    """jitted ``(x, mask, alpha, dx) -> (Y, dY, ∂X̃/∂α, s)`` of soft_decay and thin_svd with ``method``."""

    @jax.jit
    def run(x, mask, alpha, dx):
        xm = x if mask is None else jnp.where(mask[..., None], x, 0)
        return (
            *_derivatives(lambda z, a: soft_decay(z, a, mask=mask, method=method_for(method)), x, alpha, dx),
            thin_svd(xm, method_for(method))[1],
        )

    return run


@functools.partial(jax.jit, static_argnames="rtol")
def _reference(x, mask, alpha, dx, rtol):
    """float64 reference derivatives: isojax's Daleckii–Krein JVP over LAPACK's float64 SVD with the float32 null
    threshold ``rtol``, times Algorithm 1's ``K``."""

    def y_of(z, a):
        y, s = spectral_map(z, decay_curve, a, mask=mask, rtol=rtol, method="svd")
        return y * (s[..., :1] / decay_curve(s[..., :1], a))[..., None]

    return _derivatives(y_of, x, alpha, dx)[1:]


def case_errors(methods, x, mask, alpha, rng) -> dict:
    """Errors of each method on one case (module docstring) and the case's κ."""
    n, d = x.shape[-2:]
    dx = rng.standard_normal(x.shape).astype(np.float32)
    rtol = max(n, d) * EPS32
    y_ref, s_ref, live = numpy_soft_decay(x, alpha, mask, rtol)
    last = (live.sum(-1) - 1)[:, None]
    s_min_ref = np.take_along_axis(s_ref, last, -1)[:, 0]
    with jax.enable_x64(True):
        dy_ref, da_ref = (
            np.asarray(v)
            for v in _reference(
                jnp.asarray(x, jnp.float64), mask, jnp.float64(alpha), jnp.asarray(dx, jnp.float64), rtol=rtol
            )
        )
    # rank <= 1: X̃ = X for every alpha, so ∂X̃/∂α = 0: its error is reported relative to ‖X̃‖ instead
    da_zero = bool(np.linalg.norm(da_ref) <= 1e-12 * np.linalg.norm(y_ref))
    out = {}
    for m in methods:
        y, dy, d_alpha, s = _runner(m)(jnp.asarray(x), mask, jnp.float32(alpha), jnp.asarray(dx))
        s_min = np.take_along_axis(np.asarray(s, np.float64), last, -1)[:, 0]
        out[m] = {
            "y": _rel(y, y_ref),
            "dy": _rel(dy, dy_ref),
            "dalpha": _rel(d_alpha, da_ref, y_ref if da_zero else None),
            "s_min": float(np.max(np.abs(s_min - s_min_ref) / s_min_ref)),
        }
    return {"kappa": float(np.max(s_ref[:, 0] / s_min_ref)), "dalpha_is_zero": da_zero, "methods": out}


# ---------------------------------------------------------------------------------------------------- speed
def time_methods(methods, shapes=SPEED_SHAPES, alpha: float = -0.6, repeats: int = 7) -> list[dict]:
    """Median ms of jitted value-and-grad (x and α) of ``Σ W ∘ soft_decay(X, α, method=m)`` for each shape and
    method, the methods of a shape interleaved after warm-up: ``[{"shape": [...], "ms": {method: ms}}]``."""
    rng = np.random.default_rng(0)
    results = []
    for shape in shapes:
        x = jax.device_put(rng.standard_normal(shape).astype(np.float32))
        w = jax.device_put(rng.standard_normal(shape).astype(np.float32))
        a = jnp.float32(alpha)
        steps = {}
        for m in methods:
            method = method_for(m)
            fn = jax.jit(
                jax.value_and_grad(lambda x, a, w, m=method: jnp.sum(w * soft_decay(x, a, method=m)), argnums=(0, 1))
            )
            steps[m] = lambda fn=fn: fn(x, a, w)
            median_ms(steps[m], warmup=1, repeats=1)  # compile and warm up
        times: dict[str, list[float]] = {m: [] for m in methods}
        for _ in range(repeats):
            for m, run in steps.items():
                times[m].append(median_ms(run, warmup=0, repeats=1))
        results.append({"shape": list(shape), "ms": {m: float(np.median(t)) for m, t in times.items()}})
    return results


# ---------------------------------------------------------------------------------------------------- report
def _sci(v: float) -> str:
    return f"{v:.1e}"


def error_tables(table: dict, methods) -> list[str]:
    sections = []
    for key, title in (
        ("y", "relative error of Y = soft_decay(X)"),
        ("dy", "relative error of the JVP in X along a random direction"),
        ("dalpha", "relative error of ∂X̃/∂α (‡: the reference is 0, error relative to ‖X̃‖)"),
        ("s_min", "relative error of the smallest live singular value (thin_svd)"),
    ):
        rows = [
            [
                entry["group"],
                case,
                _sci(entry["kappa"]),
                *(
                    _sci(entry["methods"][m][key]) + (" ‡" if key == "dalpha" and entry["dalpha_is_zero"] else "")
                    for m in methods
                ),
            ]
            for case, entry in table.items()
        ]
        sections.append(f"## Float32 inputs: {title}\n\n" + markdown_table(["set", "case", "κ", *methods], rows))
    return sections


def shape_label(shape) -> str:
    return f"{shape[0]} × [{shape[1]}, {shape[2]}]" if len(shape) == 3 else f"[{shape[0]}, {shape[1]}]"


def speed_table(speed: list[dict], methods, platform: str) -> str:
    rows = [
        [
            shape_label(r["shape"]),
            *(f"{r['ms'][m]:.1f} ({r['ms'][m] / r['ms']['svd']:.2f})" for m in methods),
            select_method("auto", r["shape"], platform),
        ]
        for r in speed
    ]
    return "## Forward + backward time, ms (ratio to svd), float32\n\n" + markdown_table(
        ["shape", *methods, "auto picks"], rows
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--methods",
        default=None,
        help="comma-separated names of STRATEGIES (default: all this backend lowers)",
    )
    ap.add_argument("--alpha", type=float, default=-0.6, help="SoftDecay alpha (the authors' STS value)")
    ap.add_argument("--repeats", type=int_at_least(1), default=7)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-real", action="store_true", help="leave out the default model's matrices")
    ap.add_argument("--out", default=None, help="results directory (default experiments/results)")
    args = ap.parse_args(argv)
    platform = current_platform()
    methods = args.methods.split(",") if args.methods else available_strategies(platform)
    for m in methods:
        method_for(m, platform)  # ValueError for an unknown or unsupported name
    prov = provenance("decompositions")
    prov["OPENBLAS_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"]
    rng = np.random.default_rng(0)
    cases = synthetic_cases(rng)
    if not args.skip_real:
        cases.update(real_cases())
    table = {}
    for name, (group, x, mask) in cases.items():
        table[name] = {
            "group": group,
            "shape": list(x.shape),
            **case_errors(methods, x, mask, args.alpha, np.random.default_rng(1)),
        }
        print(
            f"{name:<70} κ {table[name]['kappa']:8.1e}  "
            + "  ".join(f"{m} {v['y']:.1e}" for m, v in table[name]["methods"].items()),
            flush=True,
        )
    sections = [
        f"SoftDecay alpha = {args.alpha:g}. Strategies: "
        + "; ".join(
            f"`{m}` ({STRATEGIES[m].route}, {STRATEGIES[m].algorithm}, "
            f"{'float64 Gram' if STRATEGIES[m].float64 else 'working dtype'})"
            for m in methods
        )
        + ". Errors are relative to float64 references on the same float32 matrices (module docstring of "
        "experiments/benchmarks/decompositions.py). Where every strategy shows the same error (∂X̃/∂α at scales "
        "1e±6, where σ_max is far from |α|), it comes from evaluating eq. 2 and K in float32, not from the "
        "decomposition.",
        *error_tables(table, methods),
    ]
    payload = {"alpha": args.alpha, "platform": platform, "methods": methods, "errors": table}
    if not args.skip_speed:
        speed = time_methods(methods, alpha=args.alpha, repeats=args.repeats)
        print(speed)
        sections.append(speed_table(speed, methods, platform))
        payload["speed_ms"] = speed
    kwargs = {} if args.out is None else {"directory": args.out}
    print(
        write_result(
            "decompositions", "SVD strategies behind SoftDecay: accuracy and speed", sections, payload, prov, **kwargs
        )
    )


if __name__ == "__main__":
    main()
