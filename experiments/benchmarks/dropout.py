"""isojax's dropout (:class:`isojax.models.dropout.Dropout`) against ``flax.linen.Dropout``, interleaved in one process.

    python -m experiments.benchmarks.dropout [--layers 6 --hidden 384 --heads 12 --batch 32 --length 128]
                                             [--repeats 7] [--skip-step]

1. The mask alone: forward + backward of dropout (rate 0.1) on one attention layer's probabilities
   ``[batch, heads, length, length]`` (6.3 million entries at the defaults).
2. The whole train step of ``experiments/benchmarks/train_step.py`` (random weights), built once with each dropout
   class in isojax's layers.
Both sides alternate run by run after warm-up; prints medians, [min, max] and the ratio isojax / flax.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.common import add_model_arguments, bert_config, interleaved_ms, machine
from experiments.benchmarks.throughput import random_batch
from experiments.benchmarks.train_step import isojax_step, step_runner
from isojax.models import TransformerConfig, attention, block, build_encoder, dropout, embeddings

CLASSES = {"flax.linen.Dropout": nn.Dropout, "isojax Dropout": dropout.Dropout}
USERS = (embeddings, attention, block)  # the modules whose layers build a Dropout, looked up when traced


def print_times(title: str, times: dict[str, np.ndarray]) -> None:
    medians = {name: float(np.median(t)) for name, t in times.items()}
    print(title)
    for name, t in times.items():
        print(f"  {name:<20} median {medians[name]:9.1f} ms  [{min(t):.1f}, {max(t):.1f}]")
    print(f"  ratio isojax / flax: {medians['isojax Dropout'] / medians['flax.linen.Dropout']:.3f}")


def mask_fns(shape: tuple[int, ...]) -> dict[str, Callable[..., object]]:
    x = jnp.ones(shape, jnp.float32)
    keys = iter(jax.random.split(jax.random.key(0), 10_000))
    fns: dict[str, Callable[..., object]] = {}  # zero-argument calls; "..." lets mypy take lambdas with defaults
    for name, cls in CLASSES.items():
        grad = jax.jit(
            jax.grad(lambda x, k, cls=cls: cls(0.1).apply({}, x, deterministic=False, rngs={"dropout": k}).sum())
        )
        fns[name] = lambda grad=grad: grad(x, next(keys))
    return fns


def step_fns(cfg: TransformerConfig, batch: dict) -> dict[str, Callable[[], object]]:
    params = build_encoder(cfg).init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"]
    fns: dict[str, Callable[[], object]] = {}
    for name, cls in CLASSES.items():
        with contextlib.ExitStack() as patched:
            for module in USERS:
                patched.enter_context(mock.patch.object(module, "Dropout", cls))
            run = step_runner(*isojax_step(cfg, jax.tree.map(jnp.copy, params)), batch)  # the step donates its state
            jax.block_until_ready(run())  # traced now, with this class
        fns[name] = run
    return fns


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap, repeats=7)
    ap.add_argument("--skip-step", action="store_true", help="time the mask only")
    args = ap.parse_args(argv)
    print(machine(), f"| load average {os.getloadavg()[0]:.1f}")
    shape = (args.batch, args.heads, args.length, args.length)
    print_times(f"dropout fwd+bwd on {shape}", interleaved_ms(mask_fns(shape), args.repeats))
    if not args.skip_step:
        cfg = bert_config(args)
        batch = random_batch(cfg, args.batch, args.length)
        print_times(
            f"train step, BERT {args.layers} x {args.hidden}, batch {args.batch} x {args.length}",
            interleaved_ms(step_fns(cfg, batch), args.repeats),
        )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
