"""Compile time of the train step against depth, with the block stack unrolled or scanned (``nn.scan``), with and
without rematerialisation (``nn.remat``).

    python -m experiments.benchmarks.compile_time [--layers 6,12,24 --hidden 384 --heads 12 --batch 32 --length 128]
                                       [--variants unrolled,unrolled+full,scan,scan+full,scan+dots] [--out DIR]

The step is ``experiments/benchmarks/train_step.py``'s (BERT of the given shape, 2-class head on [CLS], dropout on,
forward + backward + clipping + AdamW under ``jit``). For each depth and variant it records the seconds to trace and
lower the step (``jit(...).lower``), to compile it (``.compile()``; XLA's optimisation and code generation), and the
median time of a step once compiled (``--repeats`` runs after one warm-up), and writes
``experiments/results/compile_time.{md,json}``. Variants: ``unrolled`` (one copy of the block per layer in the
program), ``scan`` (one block in a loop), ``+full`` / ``+dots`` (``remat="full"`` / ``"dots"``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from experiments.benchmarks.throughput import random_batch
from experiments.benchmarks.train_step import isojax_step
from experiments.tooling.report import markdown_table, provenance, write_result
from isojax.argtypes import int_at_least
from isojax.models import TransformerConfig, build_encoder, to_scanned

VARIANTS = ("unrolled", "unrolled+full", "scan", "scan+full", "scan+dots")


def options(variant: str) -> dict:
    """``build_encoder`` options of a variant name (``scan`` or ``unrolled``, optionally ``+<remat policy>``)."""
    stack, _, remat = variant.partition("+")
    if stack not in ("unrolled", "scan"):
        raise ValueError(f"variant {variant!r} must start with 'unrolled' or 'scan'")
    return {"scan_layers": stack == "scan", "remat": remat or "none"}


def measure(cfg: TransformerConfig, variant: str, batch: dict, repeats: int) -> dict:
    """Trace+lower seconds, compile seconds and median step ms of the train step of ``cfg`` in ``variant``."""
    opts = options(variant)
    encoder = build_encoder(cfg, **opts)
    params = build_encoder(cfg).init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"]
    if opts["scan_layers"]:
        params = to_scanned(encoder, params)
    step, state = isojax_step(cfg, params, **opts)
    start = time.perf_counter()
    lowered = step.lower(state, batch)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics["loss"])
        if i:  # the first run is a warm-up
            times.append((time.perf_counter() - start) * 1e3)
    return {
        "layers": cfg.num_hidden_layers,
        "variant": variant,
        "lower_s": lower_s,
        "compile_s": compile_s,
        "step_ms": statistics.median(times) if times else None,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="6,12,24", help="comma-separated depths")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--hidden", type=int_at_least(1), default=384)
    ap.add_argument("--heads", type=int_at_least(1), default=12)
    ap.add_argument("--batch", type=int_at_least(1), default=32)
    ap.add_argument("--length", type=int_at_least(1), default=128)
    ap.add_argument("--repeats", type=int_at_least(0), default=3, help="timed steps after compiling (0: none)")
    ap.add_argument("--out", default=None, help="results directory (default experiments/results)")
    args = ap.parse_args(argv)
    depths = [int(n) for n in args.layers.split(",")]
    variants = args.variants.split(",")
    for v in variants:
        options(v)
    prov = provenance("compile_time")
    rows = []
    for depth in depths:
        cfg = TransformerConfig(
            num_hidden_layers=depth,
            hidden_size=args.hidden,
            num_attention_heads=args.heads,
            intermediate_size=4 * args.hidden,
        )
        batch = random_batch(cfg, args.batch, args.length)
        for variant in variants:
            rows.append(measure(cfg, variant, batch, args.repeats))
            print(rows[-1], flush=True)
    by = {(r["layers"], r["variant"]): r for r in rows}

    def table(key: str, header: str) -> str:
        return f"## {header}\n\n" + markdown_table(
            ["layers", *variants], [[d, *(by[d, v][key] for v in variants)] for d in depths]
        )

    sections = [
        f"Train step of BERT {args.hidden} wide, {args.heads} heads, batch {args.batch} x {args.length}, "
        "float32, dropout on (forward + backward + clipping + AdamW), on "
        f"{jax.devices()[0].platform}. `scan`: the blocks as one `nn.scan` loop (`scan_layers=True`); "
        '`+full` / `+dots`: `remat="full"` / `"dots"`. Seconds are wall time on a shared machine.',
        table("compile_s", "XLA compile, seconds"),
        table("lower_s", "Trace and lower, seconds"),
    ]
    if args.repeats:
        sections.append(table("step_ms", f"Step once compiled, median ms of {args.repeats}"))
    payload = {
        "shape": {"hidden": args.hidden, "heads": args.heads, "batch": args.batch, "length": args.length},
        "rows": rows,
    }
    kwargs = {} if args.out is None else {"directory": args.out}
    print(
        write_result(
            "compile_time",
            "Train-step compile time against depth: unrolled vs scanned layers",
            sections,
            payload,
            prov,
            **kwargs,
        )
    )


if __name__ == "__main__":
    main()
