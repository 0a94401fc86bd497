"""SoftDecay cost: (a) isojax vs a PyTorch reference, forward+backward; (b) overhead on a BERT-base training step.

    python -m experiments.benchmarks.softdecay [--batch 32 --length 128 --hidden 768 --repeats 10] [--quick]
                                               [--method auto,svd,gram_eigh_f64,... | all]
                                               [--torch-threads N] [--skip-encoder | --skip-reference]

(a) ``soft_decay`` forward + backward (gradients for x and alpha of ``sum(W * soft_decay(x, alpha))``) on
``[batch, length, hidden]`` under ``jit``, against PyTorch autograd through ``torch.linalg.svd`` per example (the
authors' approach, batched). A second PyTorch row decomposes the tall transpose ``xᵀ`` as isojax does (LAPACK's
SVD is much faster on tall than on wide matrices), so that the two sides differ only in the derivative, the
runtime and the LAPACK (PyTorch: MKL; jaxlib: scipy's OpenBLAS). Goal on CPU: ratio isojax/PyTorch < 1.
(b) One jitted training step (forward + backward for all parameters of a random-weight BERT-base, loss = mean
square of the last hidden state, batch x length tokens with padding) with and without ``SoftDecay`` as
``last_layer_transform``, timed interleaved; prints both times, the overhead and the cost of ``soft_decay`` alone.
Goal on GPU: < 15 %.
``--method`` names the SVD strategies (``experiments.benchmarks.decompositions.STRATEGIES``, ``auto`` or ``all`` that this backend
lowers; default ``auto``): (a) prints one row per strategy, (b) one SoftDecay step per strategy, all interleaved.
Both sides of each comparison run in this process after warm-up (``block_until_ready``), medians in ms.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

# jaxlib's CPU SVD calls scipy's OpenBLAS LAPACK from inside XLA's own thread pool; OpenBLAS threads on top of
# that oversubscribe the cores (measured 10x slower SVDs on 2 busy cores). Must be set before numpy/jax load.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.benchmarks.common import cpu_count, interleaved_ms, machine, report  # noqa: E402
from experiments.benchmarks.decompositions import available_strategies, method_for  # noqa: E402
from isojax.argtypes import int_at_least  # noqa: E402
from isojax.softdecay import SoftDecay, soft_decay  # noqa: E402
from isojax.spectral import select_method  # noqa: E402


def torch_soft_decay_step(x, w, alpha, transpose: bool):
    """PyTorch reference: Algorithm 1 with ``torch.linalg.svd`` per example, then autograd for x and alpha."""
    import torch

    x = x.detach().requires_grad_(True)
    alpha = alpha.detach().requires_grad_(True)
    if transpose:
        v, s, ut = torch.linalg.svd(x.mT, full_matrices=False)
        u, vt = ut.mT, v.mT
    else:
        u, s, vt = torch.linalg.svd(x, full_matrices=False)
    f = -torch.log(1 - alpha * (s + alpha)) / alpha
    k = s.amax(-1, keepdim=True) / f.amax(-1, keepdim=True)
    y = (u * (k * f).unsqueeze(-2)) @ vt
    loss = (y * w).sum()
    loss.backward()
    return loss.detach(), x.grad, alpha.grad


def bench_reference(args) -> None:
    import torch

    torch.set_num_threads(args.torch_threads)
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads, LAPACK: MKL); jax LAPACK: scipy OpenBLAS "
        f"(OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']})"
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.length, args.hidden)).astype(np.float32)
    w = rng.standard_normal(x.shape).astype(np.float32)
    alpha = np.float32(args.alpha)
    xj, wj, aj = jax.device_put(x), jax.device_put(w), jax.device_put(alpha)
    xt, wt, at = torch.from_numpy(x), torch.from_numpy(w), torch.tensor(alpha)

    t_value, t_gx, t_ga = torch_soft_decay_step(xt, wt, at, transpose=False)
    steps: dict[str, Callable[..., object]] = {}  # zero-argument calls; "..." lets mypy take lambdas with defaults
    for m in args.method:
        step = jax.jit(
            jax.value_and_grad(lambda x, a, w, m=m: jnp.sum(soft_decay(x, a, method=method_for(m)) * w), argnums=(0, 1))
        )
        (value, (gx, ga)) = step(xj, aj, wj)
        gx_err = float(np.abs(np.asarray(gx) - t_gx.numpy()).max() / np.abs(t_gx.numpy()).max())
        print(
            f"(a) {m}: soft_decay forward+backward on [{args.batch}, {args.length}, {args.hidden}], alpha="
            f"{args.alpha}: loss {float(value):.4f} vs torch {float(t_value):.4f}; max |dx diff|/max|dx| "
            f"{gx_err:.1e}; d alpha {float(ga):.4f} vs torch {float(t_ga):.4f}"
        )
        steps[m] = lambda step=step: step(xj, aj, wj)
    steps["torch [L, H]"] = lambda: torch_soft_decay_step(xt, wt, at, transpose=False)
    steps["torch [H, L]"] = lambda: torch_soft_decay_step(xt, wt, at, transpose=True)
    ms = {name: np.median(t) for name, t in interleaved_ms(steps, args.repeats).items()}
    rows = []
    for m in args.method:
        rows += [
            (f"{m} / torch [L, H] (authors')", ms[m], ms["torch [L, H]"]),
            (f"{m} / torch [H, L]", ms[m], ms["torch [H, L]"]),
        ]
    report(rows, "isojax", "pytorch")


def bench_encoder(args) -> None:
    from isojax.models import TransformerConfig, build_encoder

    cfg = TransformerConfig.bert_base(num_hidden_layers=args.layers)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (args.batch, args.length)), jnp.int32)
    lengths = rng.integers(args.length // 2, args.length + 1, (args.batch, 1))
    mask = jnp.asarray(np.arange(args.length)[None] < lengths)

    steps: dict[str, Callable[..., object]] = {}  # zero-argument calls; "..." lets mypy take lambdas with defaults
    transforms = [("without SoftDecay", None)] + [
        (f"with SoftDecay ({m})", SoftDecay(method=method_for(m))) for m in args.method
    ]
    for name, transform in transforms:
        model = build_encoder(cfg, last_layer_transform=transform)
        params = jax.jit(model.init)(jax.random.key(0), ids, mask)["params"]

        def loss(params, model=model):
            out = model.apply({"params": params}, ids, mask, deterministic=True).last_hidden_state
            return jnp.mean(jnp.where(mask[..., None], out, 0) ** 2)

        step = jax.jit(lambda params, loss=loss: jax.value_and_grad(loss)(params))
        steps[name] = lambda step=step, params=params: step(params)
    times = interleaved_ms(steps, args.repeats)  # overhead = median ratio of the pairs of a round
    base = times["without SoftDecay"]
    h = cfg.hidden_size
    x = jax.device_put(rng.standard_normal((args.batch, args.length, h)).astype(np.float32))
    alone = {
        m: jax.jit(
            jax.grad(lambda x, a, m=m: jnp.sum(soft_decay(x, a, mask=mask, method=method_for(m)) ** 2), argnums=(0, 1))
        )
        for m in args.method
    }
    alone_steps: dict[str, Callable[..., object]] = {
        m: lambda f=f: f(x, np.float32(args.alpha)) for m, f in alone.items()
    }
    alone_ms = {m: np.median(t) for m, t in interleaved_ms(alone_steps, args.repeats).items()}
    print(
        f"(b) BERT-base ({cfg.num_hidden_layers} layers) training step (forward + backward for all params), batch "
        f"{args.batch} x {args.length}, {args.repeats} interleaved repeats"
    )
    print(f"{'without SoftDecay':<40} {np.median(base):>10.1f} ms")
    for m in args.method:
        with_sd = times[f"with SoftDecay ({m})"]
        print(
            f"{'with SoftDecay (' + m + ')':<40} {np.median(with_sd):>10.1f} ms   overhead (median of pairs) "
            f"{100 * np.median(with_sd / base - 1):.1f} %  (pairs: "
            f"{', '.join(f'{100 * r:.1f}' for r in with_sd / base - 1)})"
        )
        print(
            f"{'  soft_decay alone, fwd+bwd [B,L,H]':<40} {alone_ms[m]:>10.1f} ms = "
            f"{100 * alone_ms[m] / np.median(base):.1f} % of the step without it"
        )


def methods(text: str) -> list[str]:
    """``--method``: comma-separated strategy names, ``auto`` (shown as the name it resolves to), or ``all``."""
    if text == "all":
        return available_strategies()
    return [m.strip() for m in text.split(",") if m.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int_at_least(1), default=32)
    ap.add_argument("--length", type=int_at_least(1), default=128)
    ap.add_argument("--hidden", type=int_at_least(1), default=768, help="hidden size for (a); (b) uses BERT-base's 768")
    ap.add_argument("--layers", type=int_at_least(1), default=12, help="encoder layers for (b)")
    ap.add_argument("--alpha", type=float, default=-0.2)
    ap.add_argument("--repeats", type=int_at_least(1), default=10)
    ap.add_argument("--torch-threads", type=int_at_least(1), default=cpu_count())
    ap.add_argument(
        "--method",
        type=methods,
        default=["auto"],
        help="SVD strategies, comma-separated names of experiments.benchmarks.decompositions.STRATEGIES, auto or all",
    )
    ap.add_argument("--skip-reference", action="store_true", help="skip (a)")
    ap.add_argument("--skip-encoder", action="store_true", help="skip (b)")
    ap.add_argument("--quick", action="store_true", help="smoke run: batch 4 x 32, 2 layers, 3 repeats")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.length, args.layers, args.repeats = 4, 32, 2, 3
    shape = (args.batch, args.length, args.hidden)
    args.method = list(dict.fromkeys(select_method(m, shape) if m == "auto" else m for m in args.method))
    for m in args.method:
        method_for(m)  # ValueError for an unknown name or one this backend does not lower
    print(machine())
    if not args.skip_reference:
        bench_reference(args)
    if not args.skip_encoder:
        bench_encoder(args)


if __name__ == "__main__":
    main()
