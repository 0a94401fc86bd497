"""Tokens per second of the per-layer covariance statistics of a corpus: isojax (jitted forward + ``isojax.stats``)
against transformers' PyTorch forward + numpy accumulation, on the same CPU, in one run.

    python -m experiments.benchmarks.analyze [--model default] [--texts 2000] [--batch 64] [--length 128]
                                             [--fixed-length]

Both sides read the same tokenised batches of the same sentences (STS-B test, repeated up to ``--texts``; sorted by
length and padded to multiples of 16 tokens, as ``isojax analyze`` batches them; ``--fixed-length``: unsorted and
padded to ``--length``), run the model with every hidden
state out, and fold every real token of every layer into per-layer running moments:
isojax with :func:`isojax.stats.update` (jitted, float32 with per-batch centring and Chan merges), the reference
with numpy (float64 sums of ``x`` and ``xᵀx``). Both end with the per-layer covariance, whose IsoScores are compared.
Each side runs in a child process of its own (``--side``; in one process the other side's thread pool holds the
cores), ``--rounds`` times alternately, timed over the whole corpus after one warm-up pass; prints tokens/s, the
ratio isojax / PyTorch time (goal: <= 1.0), and the compilations of the repeated isojax passes (goal: 0).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np

import isojax
from experiments.benchmarks.common import add_side_arguments, compare_sides, cpu_count, side_report
from isojax import stats
from isojax.argtypes import int_at_least
from isojax.data.sts import load_stsb
from isojax.models import hub


def isoscore_of_covariance(cov: np.ndarray) -> float:
    """IsoScore (Rudman et al. 2022) from a covariance: its eigenvalues are the PCA variances."""
    d = cov.shape[0]
    v = np.linalg.eigvalsh(cov)
    v = np.sqrt(d) * v / np.linalg.norm(v)
    defect = np.linalg.norm(v - 1) / np.sqrt(2 * (d - np.sqrt(d)))
    k = (d - defect**2 * (d - np.sqrt(d))) ** 2 / d
    return float((k - 1) / (d - 1))


def corpus_batches(args, tokenizer) -> list[tuple[np.ndarray, np.ndarray]]:
    """The tokenised batches both sides read, as ``isojax analyze`` makes them: STS-B test sentences repeated to
    ``--texts``, sorted by length, each batch padded to its longest text rounded up to a multiple of 16 tokens
    (at most ``--length``); with ``--fixed-length``, in their order, every batch padded to ``--length``."""
    data = load_stsb("test")
    sentences = list(data.sentences1) + list(data.sentences2)
    texts = (sentences * (args.texts // len(sentences) + 1))[: args.texts]
    if not args.fixed_length:
        lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=args.length)["input_ids"]]
        texts = [texts[i] for i in np.argsort(lengths, kind="stable")]
    out = []
    for start in range(0, len(texts), args.batch):
        enc = tokenizer(
            texts[start : start + args.batch],
            padding="max_length" if args.fixed_length else "longest",
            pad_to_multiple_of=None if args.fixed_length else 16,
            truncation=True,
            max_length=args.length,
            return_tensors="np",
        )
        out.append((enc["input_ids"].astype(np.int32), enc["attention_mask"].astype(bool)))
    return out


def run_side(args) -> dict:
    """One side, in this process: a warm-up pass, then ``--repeats`` timed passes over the corpus; the per-layer
    IsoScores of the covariance, the best pass in ms, and (isojax) the compilations of the timed passes."""
    module, params, tokenizer = isojax.from_pretrained(args.model)
    batches = corpus_batches(args, tokenizer)
    layers, d = module.config.num_hidden_layers + 1, module.config.hidden_size
    compiles: list[str] = []
    if args.side == "isojax":

        @jax.jit
        def step(state, ids, mask):
            out = module.apply({"params": params}, ids, mask)
            return stats.update(state, jnp.stack(out.hidden_states, axis=1), mask)

        def run():
            state = stats.init(d, layers)
            for ids, mask in batches:
                state = step(state, ids, mask)
            return np.asarray(stats.covariance(state))

        def listener(event: str, duration_secs: float, **kwargs) -> None:
            if event == "/jax/core/compile/backend_compile_duration":
                compiles.append(event)

    else:
        import torch
        import transformers

        torch.set_num_threads(cpu_count())
        ref = transformers.AutoModel.from_pretrained(hub.resolve(args.model)).eval()

        def run():
            sums, grams, count = np.zeros((layers, d)), np.zeros((layers, d, d)), 0
            with torch.inference_mode():
                for ids, mask in batches:
                    out = ref(
                        input_ids=torch.tensor(ids),
                        attention_mask=torch.tensor(mask.astype(np.int64)),
                        output_hidden_states=True,
                    )
                    real = torch.tensor(mask)
                    for layer, h in enumerate(out.hidden_states):
                        x = h[real].double().numpy()
                        sums[layer] += x.sum(0)
                        grams[layer] += x.T @ x
                    count += int(mask.sum())
            mean = sums / count
            return (grams - count * mean[:, :, None] * mean[:, None, :]) / (count - 1)

    cov = run()
    if args.side == "isojax":
        jax.monitoring.register_event_duration_secs_listener(listener)
    seconds = []
    for _ in range(args.repeats):
        began = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - began)
    return {
        "ms": min(seconds) * 1e3,
        "isoscore": [isoscore_of_covariance(c) for c in cov],
        "tokens": int(sum(mask.sum() for _, mask in batches)),
        "compiles": len(compiles),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--texts", type=int_at_least(1), default=2000)
    ap.add_argument("--batch", type=int_at_least(1), default=64)
    ap.add_argument("--length", type=int_at_least(2), default=128)
    ap.add_argument("--fixed-length", action="store_true", help="pad every batch to --length, texts unsorted")
    ap.add_argument("--repeats", type=int_at_least(1), default=2)
    add_side_arguments(ap)
    args = ap.parse_args(argv)
    if args.side:
        side_report(run_side, args)
        return
    options = ["--model", args.model, "--texts", str(args.texts), "--batch", str(args.batch)]
    options += ["--length", str(args.length), "--repeats", str(args.repeats)]
    compare_sides(
        "experiments.benchmarks.analyze",
        options + (["--fixed-length"] if args.fixed_length else []),
        args.rounds,
        "corpus covariance statistics, best round",
        lambda results: (
            f"{args.model}: {args.texts} texts, {results['isojax'][0]['tokens']} real tokens; max "
            f"|per-layer IsoScore difference| {isoscore_gap(results):.1e}; compilations in the timed isojax passes: "
            f"{[r['compiles'] for r in results['isojax']]}"
        ),
        tokens=lambda results: results["isojax"][0]["tokens"],
    )


def isoscore_gap(results: dict) -> float:
    """The largest |difference| of the two sides' per-layer IsoScores (first rounds)."""
    return max(abs(a - b) for a, b in zip(results["isojax"][0]["isoscore"], results["pytorch"][0]["isoscore"]))


if __name__ == "__main__":
    main()
