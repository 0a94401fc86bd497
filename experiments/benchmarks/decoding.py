"""Greedy and beam decoding of a random-weight GPT-2: isojax (jit, key/value cache) vs transformers' ``generate``,
and vs isojax without a cache (the whole prefix recomputed at every step), all in this process.

    python -m experiments.benchmarks.decoding [--layers 6 --width 512 --batch 8 --prompt 32 --new 64] [--quick]

Same weights on both sides (PyTorch's random init, saved and loaded by isojax), left-padded prompts of random
lengths, the same ``max_length``; the tokens of all three are checked to be equal before timing. Prints median
milliseconds per call and the ratios.
"""

from __future__ import annotations

import argparse
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

import isojax
from experiments.benchmarks.common import cpu_count, machine, median_ms, report
from isojax.argtypes import int_at_least
from isojax.models.generate import generate, left_align


def uncached_greedy(module, max_length: int):
    """Greedy decoding that re-runs the full forward over the ``[B, max_length]`` buffer at every step (no cache)."""

    @jax.jit
    def run(params, ids, mask):
        ids, mask = left_align(ids, mask)
        batch, start = ids.shape
        seq = jnp.zeros((batch, max_length), ids.dtype).at[:, :start].set(ids)
        seq_mask = jnp.zeros((batch, max_length), bool).at[:, :start].set(mask)

        def step(t, state):
            seq, seq_mask = state
            logits = module.apply({"params": params}, seq, seq_mask).logits[:, t - 1]
            return seq.at[:, t].set(jnp.argmax(logits, -1).astype(seq.dtype)), seq_mask.at[:, t].set(True)

        return jax.lax.fori_loop(start, max_length, step, (seq, seq_mask))[0]

    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int_at_least(1), default=6)
    ap.add_argument("--width", type=int_at_least(1), default=512)
    ap.add_argument("--vocab", type=int_at_least(1), default=8192)
    ap.add_argument("--batch", type=int_at_least(1), default=8)
    ap.add_argument("--prompt", type=int_at_least(1), default=32)
    ap.add_argument("--new", type=int_at_least(1), default=64, help="tokens generated after the prompt")
    ap.add_argument("--beams", type=int_at_least(1), default=4)
    ap.add_argument("--repeats", type=int_at_least(1), default=5)
    ap.add_argument("--quick", action="store_true", help="2 layers, 128 wide, batch 2, 8 + 16 tokens, 3 repeats")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.width, args.vocab, args.batch, args.prompt, args.new, args.repeats = 2, 128, 1024, 2, 8, 16, 3

    import torch
    import transformers

    torch.set_num_threads(cpu_count())
    max_length = args.prompt + args.new
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=args.vocab,
            n_embd=args.width,
            n_layer=args.layers,
            n_head=args.width // 64,
            n_positions=max_length,
            bos_token_id=0,
            eos_token_id=args.vocab - 1,
        )
    ).eval()
    with tempfile.TemporaryDirectory() as path:
        ref.save_pretrained(path)
        module, params, _ = isojax.from_pretrained(path)

    rng = np.random.default_rng(0)
    lengths = rng.integers(args.prompt // 2, args.prompt + 1, args.batch)
    mask = np.arange(args.prompt)[None, :] >= args.prompt - lengths[:, None]  # left padding
    ids = np.where(mask, rng.integers(1, args.vocab - 1, mask.shape), args.vocab - 1).astype(np.int32)
    t_ids, t_mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)
    no_cache = uncached_greedy(module, max_length)

    def hf(beams):
        with torch.inference_mode():
            return ref.generate(
                input_ids=t_ids,
                attention_mask=t_mask,
                max_length=max_length,
                num_beams=beams,
                do_sample=False,
                pad_token_id=args.vocab - 1,
            )

    def mine(beams):
        return generate(module, params, ids, mask, max_length=max_length, num_beams=beams).sequences

    greedy = np.asarray(mine(1))
    same = [
        np.array_equal(greedy[:, : hf(1).shape[1]], hf(1).numpy()),
        np.array_equal(greedy, np.asarray(no_cache(params, ids, mask))),
    ]
    print(machine(), f"| torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"GPT-2 {args.layers} layers x {args.width}, vocab {args.vocab}; batch {args.batch}, prompts of "
        f"{lengths.min()}-{lengths.max()} tokens (left-padded to {args.prompt}) + {args.new} new; same greedy "
        f"tokens as transformers: {same[0]}, as the uncached loop: {same[1]}"
    )
    rows = [
        ("greedy", median_ms(lambda: mine(1), repeats=args.repeats), median_ms(lambda: hf(1), repeats=args.repeats)),
        (
            f"beam search, {args.beams} beams",
            median_ms(lambda: mine(args.beams), repeats=args.repeats),
            median_ms(lambda: hf(args.beams), repeats=args.repeats),
        ),
    ]
    report(rows, "isojax", "transformers")
    cached = rows[0][1]
    report(
        [("greedy: no cache / KV cache", median_ms(lambda: no_cache(params, ids, mask), repeats=args.repeats), cached)],
        "no cache",
        "KV cache",
    )


if __name__ == "__main__":
    main()
