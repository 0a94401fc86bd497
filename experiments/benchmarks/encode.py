"""Sentences per second of ``isojax.eval.encode`` (mean pooling) against sentence-transformers-style PyTorch
mean pooling (transformers ``AutoModel``), both in this process, on the sentences of STS12–16.

    python -m experiments.benchmarks.encode [--models default,all-mpnet-base-v2] [--data-dir ../shared/data]
        [--limit 0] [--batch-size 64] [--repeats 3]

Both sides embed the same sentences with the same weights, batch size, truncation (``--max-length``) and thread
count (``torch.set_num_threads`` = the CPU count, which XLA's CPU client also uses), sorting the sentences by
length first as sentence-transformers' ``encode`` does. The PyTorch side pads each batch to its longest
sentence; isojax pads to a multiple of 16 (so only a few shapes compile; the one-off compile is in the warm-up
pass, not in the timing). Each repeat embeds every sentence once per side, the two sides alternating; the
median over repeats is reported with the ratio isojax / PyTorch (goal <= 1.0) and the largest difference of the
two sides' embeddings. MPNet is skipped with a note unless it has been fetched
(``python -m isojax.models.assets all-mpnet-base-v2``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from experiments.benchmarks.common import cpu_count, machine
from isojax.argtypes import int_at_least

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sts_sentences(data_dir: str) -> list[str]:
    """The distinct sentences of STS12–16 (every scored pair of every sub-corpus), in first-seen order."""
    from isojax.data.sts import load_sts

    texts = []
    for name in ("sts12", "sts13", "sts14", "sts15", "sts16"):
        data = load_sts(name, "test", data_dir=data_dir)
        texts += data.sentences1 + data.sentences2
    return list(dict.fromkeys(texts))


def torch_encode(model, tokenizer, texts, *, batch_size: int, max_length: int):
    """sentence-transformers-style mean pooling: length-sorted batches padded to their longest sentence."""
    import torch

    lengths = [len(t) for t in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
    order = np.argsort(lengths, kind="stable")
    out = np.empty((len(texts), model.config.hidden_size), np.float32)
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            enc = tokenizer(
                [texts[i] for i in idx], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            )
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out[idx] = ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)).numpy()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="default,all-mpnet-base-v2")
    ap.add_argument("--data-dir", default=os.path.join(os.path.dirname(ROOT), "shared", "data"))
    ap.add_argument("--limit", type=int_at_least(0), default=0, help="the first N sentences only (0 = all)")
    ap.add_argument("--batch-size", type=int_at_least(1), default=64)
    ap.add_argument("--max-length", type=int_at_least(2), default=128)
    ap.add_argument("--repeats", type=int_at_least(1), default=3)
    args = ap.parse_args(argv)

    import torch
    import transformers

    import isojax
    from isojax.eval.encode import encode
    from isojax.models import assets, resolve

    torch.set_num_threads(cpu_count())
    texts = sts_sentences(args.data_dir)
    texts = texts[: args.limit] if args.limit else texts
    print(machine())
    print(
        f"{len(texts)} distinct STS12-16 sentences, batch {args.batch_size}, max length {args.max_length}, "
        f"{cpu_count()} threads per side, median of {args.repeats} repeats"
    )
    print(f"{'model':<40} {'isojax sent/s':>14} {'torch sent/s':>13} {'ratio (time)':>13} {'max |diff|':>11}")
    for name in args.models.split(","):
        hub_id = assets.canonical_name(name)
        if hub_id and assets.local_path(hub_id) is None:
            print(f"{name:<40} skipped: not fetched ({assets.how_to_get(hub_id)})")
            continue
        module, params, tokenizer = isojax.from_pretrained(name)
        reference = transformers.AutoModel.from_pretrained(resolve(name)).eval()

        def ours():
            return encode(module, params, tokenizer, texts, batch_size=args.batch_size, max_length=args.max_length)

        def theirs():
            return torch_encode(reference, tokenizer, texts, batch_size=args.batch_size, max_length=args.max_length)

        a, b = ours(), theirs()  # warm-up: compiles every padded shape once
        times: dict[str, list[float]] = {"isojax": [], "torch": []}
        for _ in range(args.repeats):
            for side, fn in (("isojax", ours), ("torch", theirs)):
                start = time.perf_counter()
                fn()
                times[side].append(time.perf_counter() - start)
        t_ours, t_theirs = statistics.median(times["isojax"]), statistics.median(times["torch"])
        print(
            f"{name:<40} {len(texts) / t_ours:>14.1f} {len(texts) / t_theirs:>13.1f} {t_ours / t_theirs:>13.3f} "
            f"{np.abs(a - b).max():>11.2e}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
