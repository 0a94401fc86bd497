"""Where the train step's time goes: a ``jax.profiler`` trace of the isojax step, summed per model module.

    python -m experiments.benchmarks.profile_step [--layers 6 --hidden 384 --heads 12 --batch 32 --length 128]
                                                  [--repeats 3] [--top 30] [--by module|op]

Traces ``--repeats`` steps of ``experiments/benchmarks/train_step.py``'s step (random weights, dropout on) with
``jax.profiler.trace``, reads the Perfetto trace, and names every XLA operation it timed by the ``op_name`` of the
compiled HLO: the Flax module path with layer numbers folded together (``encoder/L/attention/...``), ``fwd`` or
``bwd`` (an op under ``transpose(...)``), and the kind of XLA kernel (``ynn_fusion``: a matmul fusion on CPU, ``dot``,
``*_fusion``: elementwise). Prints milliseconds per step, largest first. ``--by op`` keeps the operation under
the module (``attention/Dropout_0/rng_bit_generator``), ``--by module`` stops at the module.

Timings add the two CPU threads' work, so their sum can exceed the wall time of a step; shares within one trace
are what to compare. Made for XLA's CPU backend (the thunk names are HLO instruction names); on GPUs, kernel
names are not HLO names and fall under their own name.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile

import jax
import jax.numpy as jnp

from experiments.benchmarks.common import add_model_arguments, bert_config, machine, median_ms
from experiments.benchmarks.throughput import random_batch
from experiments.benchmarks.train_step import isojax_step, step_runner
from isojax.argtypes import int_at_least
from isojax.models import build_encoder

_RUNTIME_EVENTS = ("ThunkExecutor", "$", "PjitFunction", "end:", "SlinkyThreadPool", "CommonPjRt")
_CONTROL_FLOW = ("call", "while", "conditional")  # their time is that of the operations inside, traced on their own


def op_names(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> the ``op_name`` metadata JAX attached to it (the traced function's call path)."""
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]+)\"", hlo_text, re.M)
    }


def label(op_name: str, kernel: str, depth: int) -> str:
    """``fwd|bwd  module/path [kernel]`` with layer indices folded (``layer_3`` -> ``L``), ``depth`` path parts."""
    direction = "bwd" if "transpose(" in op_name else "fwd"
    path = re.sub(r"^jit\([^)]*\)/", "", op_name)
    path = re.sub(r"(transpose|jvp)\(", "", path).replace(")", "")
    path = re.sub(r"layers?_\d+", "L", path)
    path = re.sub(r"/while/body.*", "/while", path)
    parts = [p for p in path.split("/") if p][1:]  # drop the top-level module's name
    return f"{direction} {'/'.join(parts[:depth])} [{kernel}]"


def per_module_ms(trace_dir: str, names: dict[str, str], steps: int, depth: int) -> collections.Counter:
    """Milliseconds per step of every :func:`label` in the Perfetto trace under ``trace_dir``."""
    [path] = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
    with gzip.open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    totals: collections.Counter[str] = collections.Counter()
    for event in events:
        name = event["name"]
        if name.startswith(_RUNTIME_EVENTS):
            continue
        kernel = re.sub(r"\.\d+$", "", name)
        if kernel in _CONTROL_FLOW:
            continue
        key = label(names[name], kernel, depth) if name in names else f"?   {kernel}"
        totals[key] += event["dur"] / 1e3 / steps
    return totals


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap, repeats=3)
    ap.add_argument("--top", type=int_at_least(1), default=30, help="rows to print")
    ap.add_argument("--by", choices=("module", "op"), default="module")
    args = ap.parse_args(argv)
    cfg = bert_config(args)
    params = build_encoder(cfg).init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"]
    step, state = isojax_step(cfg, params)
    batch = random_batch(cfg, args.batch, args.length)
    hlo = step.lower(state, batch).compile().as_text()
    if hlo is None:
        raise RuntimeError("this backend gives no text of the compiled step, where the per-op names come from")
    names = op_names(hlo)
    run = step_runner(step, state, batch)

    wall = median_ms(run, repeats=args.repeats)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(args.repeats):
                jax.block_until_ready(run())
        totals = per_module_ms(trace_dir, names, args.repeats, depth=5 if args.by == "module" else 8)
    print(machine())
    print(
        f"BERT {args.layers} x {args.hidden}, batch {args.batch} x {args.length}: step {wall:.0f} ms (median, "
        f"untraced); traced operations sum to {sum(totals.values()):.0f} ms per step"
    )
    for key, ms in totals.most_common(args.top):
        print(f"{ms:9.1f} ms  {100 * ms / sum(totals.values()):5.1f}%  {key}")


if __name__ == "__main__":
    main()
