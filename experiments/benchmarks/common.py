"""Timing helpers shared by the benchmarks: medians after warm-up, both sides in one process."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import jax
import numpy as np

from isojax.argtypes import int_at_least
from isojax.host import reuse_freed_memory
from isojax.models import TransformerConfig


def cpu_count() -> int:
    """The machine's CPU cores (``os.cpu_count()``, 1 where it cannot tell): the threads each side of a CPU
    comparison gets."""
    return os.cpu_count() or 1


def median_ms(fn: Callable[[], object], *, warmup: int = 2, repeats: int = 10) -> float:
    """Median wall time of ``fn()`` in milliseconds; JAX results are waited for with ``block_until_ready``."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def interleaved_medians(fns: Mapping[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each function of :func:`interleaved_ms` (one warm-up call each, then alternating
    run by run, so that a change in the machine's load reaches both sides alike)."""
    return {name: float(np.median(t)) for name, t in interleaved_ms(fns, repeats).items()}


def interleaved_ms(fns: Mapping[str, Callable[[], object]], repeats: int) -> dict[str, np.ndarray]:
    """Milliseconds ``[repeats]`` of each ``fn()`` (results waited for) in ``repeats`` rounds that run every function
    once, after one warm-up call each (so that load drifting on a shared machine hits all of them alike)."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(median_ms(fn, warmup=0, repeats=1))
    return {name: np.array(t) for name, t in times.items()}


VECTOR_EXTENSIONS = ("fma", "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16")
"""The /proc/cpuinfo flags that decide which kernels XLA's and PyTorch's CPU backends run."""


def cpu_model() -> str:
    """The CPU's model name and which of :data:`VECTOR_EXTENSIONS` it has (from /proc/cpuinfo on Linux), e.g.
    ``AMD EPYC [fma avx2 avx512f avx512_vnni avx512_bf16]``; the platform's processor name elsewhere."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    return f"{fields.get('model name', platform.machine())} [{' '.join(f for f in VECTOR_EXTENSIONS if f in flags)}]"


def machine() -> str:
    """One line naming the JAX backend, device, CPU count, CPU model and its vector extensions: every figure a
    benchmark prints is for this machine class only."""
    dev = jax.devices()[0]
    return f"jax {jax.__version__} on {dev.platform} ({dev.device_kind}), {os.cpu_count()} CPU cores, {cpu_model()}"


def report(rows: list[tuple[str, float, float]], left: str = "isojax", right: str = "reference") -> None:
    """Print ``name | left ms | right ms | left/right`` rows."""
    print(f"{'case':<34} {left + ' ms':>12} {right + ' ms':>14} {'ratio':>8}")
    for name, a, b in rows:
        print(f"{name:<34} {a:>12.2f} {b:>14.2f} {a / b:>8.3f}")


def add_model_arguments(ap, *, repeats: int) -> None:
    """``--layers --hidden --heads --batch --length --repeats`` (defaults: the bundled model's shape, 6 x 384 with
    12 heads, batch 32 x 128)."""
    ap.add_argument("--layers", type=int_at_least(1), default=6)
    ap.add_argument("--hidden", type=int_at_least(1), default=384)
    ap.add_argument("--heads", type=int_at_least(1), default=12)
    ap.add_argument("--batch", type=int_at_least(1), default=32)
    ap.add_argument("--length", type=int_at_least(1), default=128)
    ap.add_argument("--repeats", type=int_at_least(1), default=repeats)


def bert_config(args) -> TransformerConfig:
    """The BERT config of :func:`add_model_arguments`' ``args`` (feed-forward 4x as wide as the hidden states)."""
    return TransformerConfig(
        num_hidden_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
    )


def sides_in_processes(child: list[str], rounds: int, sides=("isojax", "pytorch")) -> dict[str, list[dict]]:
    """Run ``child + ["--side", side]`` for each side, ``rounds`` times alternately, each in a process of its own
    (in one process the thread pool of the side that ran last holds the cores when the other starts); returns each
    side's JSON reports (the last line each child prints), in order."""
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side in sides:
            proc = subprocess.run([*child, "--side", side], capture_output=True, text=True, check=True)
            results[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


def side_report(run_side, args) -> None:
    """A child's job (``--side``): print ``run_side(args)`` as one JSON line, glibc's ``malloc`` set first as ``isojax``'s
    command line sets it (:func:`isojax.host.reuse_freed_memory`), for both sides alike."""
    reuse_freed_memory()
    print(json.dumps(run_side(args)))


def compare_sides(
    module: str, options: list[str], rounds: int, case: str, header, tokens=None
) -> tuple[dict, dict[str, float]]:
    """Run ``python -m module *options --side SIDE`` for isojax and PyTorch in :func:`sides_in_processes` (each child
    prints a JSON report with its time ``ms``); print the machine, ``header(results)``, each side's per-round times
    and the best rounds' ratio as row ``case``, and each side's tokens/s when ``tokens(results)`` gives the tokens of
    one timed pass. Returns ``(results, best ms per side)``."""
    results = sides_in_processes([sys.executable, "-m", module, *options], rounds)
    best = {side: min(r["ms"] for r in runs) for side, runs in results.items()}
    print(machine(), f"| {cpu_count()} threads a side, one process a side, {rounds} alternating rounds")
    print(header(results))
    for side, runs in results.items():
        print(f"{side}: ms per round " + ", ".join(f"{r['ms']:.1f}" for r in runs))
    report([(case, best["isojax"], best["pytorch"])], "isojax", "pytorch")
    if tokens is not None:
        n = tokens(results)
        print("tokens/s: " + ", ".join(f"{side} {n / (ms * 1e-3):,.0f}" for side, ms in best.items()))
    return results, best


def add_side_arguments(ap) -> None:
    """``--rounds`` (alternating rounds of the two sides, default 2) and ``--side`` (run one side in this process: a
    child's job) of the benchmarks that run each side in a process of its own (:func:`compare_sides`)."""
    ap.add_argument("--rounds", type=int_at_least(1), default=2)
    ap.add_argument("--side", choices=("isojax", "pytorch"), help="run one side in this process (a child's job)")
