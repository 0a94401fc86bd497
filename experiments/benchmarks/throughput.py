"""Throughput of a BERT encoder on the device JAX sees: the isojax train step, the forward, SoftDecay's share.

Used by ``python -m experiments.accelerator`` (its command line). Every figure is a median of ``repeats`` timed
calls after warm-up (``block_until_ready``); compile time is that of ``jit(...).lower(...).compile()``.

- :func:`train_step`: the real isojax step (:func:`experiments.benchmarks.train_step.isojax_step`: ``TaskModel``
  with a 2-class head on [CLS], ``Objective``, AdamW with clipping, dropout on, ``make_train_step`` under ``jit``
  with the state donated) on random token ids, every token real. FLOPs are counted two ways: analytic,
  ``3 × forward`` = ``6·N·T + 12·n·B·L²·H`` (``N = n·(4H² + 2HI)`` weights in the layers' matrix products,
  ``T = B·L`` tokens, the second term QKᵀ and AV forward and backward; embeddings, layer norms, softmax and the head
  left out), and XLA's ``cost_analysis()`` of the compiled step (every HLO operation, the optimizer's included).
- :func:`forward`: ``module.apply`` of the encoder (dropout off), FLOPs ``n·(2T(4H² + 2HI) + 4BL²H)``.
- :func:`softdecay_share`: the same train step with ``SoftDecay(method=m)`` as the encoder's
  ``last_layer_transform``, timed interleaved with the step without it; share = median over rounds of
  ``(with − without) / without``.
"""

from __future__ import annotations

import time
from typing import cast

import jax
import numpy as np

from experiments.benchmarks.common import interleaved_ms, median_ms
from experiments.benchmarks.decompositions import method_for
from experiments.benchmarks.encoder_forward import forward_flops
from experiments.benchmarks.train_step import isojax_step, step_runner
from isojax.models import EncoderOutput, TransformerConfig, build_encoder
from isojax.softdecay import SoftDecay


def random_batch(cfg: TransformerConfig, batch: int, length: int, seed: int = 0) -> dict:
    """Random token ids ``[batch, length]`` (every token real) and 2-class labels, on the device."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, (batch, length)).astype(np.int32)
    return jax.device_put(
        {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
            "labels": rng.integers(0, 2, batch).astype(np.int32),
        }
    )


def xla_flops(compiled) -> float | None:
    """FLOPs of a compiled computation by XLA's cost analysis, or None where the backend gives none."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = (cost or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


def _rates(ms: float, tokens: int, flops: float, xla: float | None) -> dict:
    return {
        "ms": ms,
        "tokens_per_s": tokens / (ms * 1e-3),
        "analytic_flops": float(flops),
        "analytic_tflops_per_s": flops / (ms * 1e-3) / 1e12,
        "xla_flops": xla,
        "xla_tflops_per_s": None if xla is None else xla / (ms * 1e-3) / 1e12,
    }


def _compile(fn, *args):
    """``(compiled, seconds)`` of ``fn`` (a ``jax.jit`` function) for ``args``."""
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    return compiled, time.perf_counter() - start


def build_step(cfg: TransformerConfig, dtype, batch: dict, transform=None):
    """``(run, info)``: ``run()`` takes one train step (its state carried between calls), ``info`` has the compile
    seconds and XLA's FLOP count."""
    ids, mask = batch["input_ids"][:1], batch["attention_mask"][:1]
    params = jax.jit(build_encoder(cfg, last_layer_transform=transform).init)(jax.random.key(0), ids, mask)["params"]
    step, state = isojax_step(cfg, params, dtype, transform)
    compiled, seconds = _compile(step, state, batch)
    return step_runner(compiled, state, batch), {"compile_s": seconds, "xla_flops": xla_flops(compiled)}


def train_step(cfg: TransformerConfig, dtype, batch: dict, repeats: int):
    """``(figures, run)``: median step time, tokens/s and TFLOP/s (analytic and XLA's) of the isojax train step in
    ``dtype``, and ``run`` (one more step) for timing it against others (:func:`softdecay_share`)."""
    b, n = batch["input_ids"].shape
    run, info = build_step(cfg, dtype, batch)
    ms = median_ms(run, repeats=repeats)
    return {**_rates(ms, b * n, 3 * forward_flops(cfg, b, n), info["xla_flops"]), "compile_s": info["compile_s"]}, run


def forward(cfg: TransformerConfig, dtype, batch: dict, repeats: int) -> dict:
    """Median forward time, tokens/s and TFLOP/s of the encoder in ``dtype`` (float32 params, dropout off)."""
    b, n = batch["input_ids"].shape
    module = build_encoder(cfg, dtype=dtype)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    params = jax.jit(module.init)(jax.random.key(0), ids[:1], mask[:1])["params"]
    fwd = jax.jit(lambda p, i, m: cast(EncoderOutput, module.apply({"params": p}, i, m)).last_hidden_state)
    compiled, seconds = _compile(fwd, params, ids, mask)
    ms = median_ms(lambda: compiled(params, ids, mask), repeats=repeats)
    return {**_rates(ms, b * n, forward_flops(cfg, b, n), xla_flops(compiled)), "compile_s": seconds}


def softdecay_share(cfg: TransformerConfig, dtype, batch: dict, methods, repeats: int, base, log=print) -> dict:
    """For each decomposition ``method`` (a name of :data:`experiments.benchmarks.decompositions.STRATEGIES` or
    ``auto``): the train step with ``SoftDecay(method=m)`` on the last layer against
    ``base`` (the step without it, from :func:`train_step`), interleaved over ``repeats`` rounds (module
    docstring). One SoftDecay step is alive at a time (BERT-base states are large). A strategy that fails to
    compile or run on this backend is recorded as ``{"error": ...}`` and the others still run."""
    out: dict[str, dict] = {}
    for m in methods:
        try:
            with_sd, info = build_step(cfg, dtype, batch, SoftDecay(method=method_for(m)))
            times = interleaved_ms({"base": base, "with": with_sd}, repeats)
        except Exception as e:  # noqa: BLE001 - a validation run reports what breaks and goes on
            out[m] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
            log(f"SoftDecay ({m}): {out[m]['error']}")
            continue
        ratios = times["with"] / times["base"] - 1
        out[m] = {
            "base_ms": float(np.median(times["base"])),
            "with_ms": float(np.median(times["with"])),
            "share": float(np.median(ratios)),
            "rounds": [float(r) for r in ratios],
            "compile_s": info["compile_s"],
        }
        log(
            f"SoftDecay ({m}): {out[m]['with_ms']:.1f} ms vs {out[m]['base_ms']:.1f} ms without, share "
            f"{100 * out[m]['share']:.1f} %"
        )
        del with_sd
    return out
