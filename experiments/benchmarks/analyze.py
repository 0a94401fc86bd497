"""Tokens per second of the per-layer covariance statistics of a corpus: isojax (jitted forward + ``isojax.stats``)
against transformers' PyTorch forward + numpy accumulation, on the same CPU, in one run.

    python -m experiments.benchmarks.analyze [--model default] [--texts 2000] [--batch 64] [--length 128]

Both sides read the same tokenised batches of the same sentences (STS-B test, repeated up to ``--texts``), run the
model with every hidden state out, and fold every real token of every layer into per-layer running moments:
isojax with :func:`isojax.stats.update` (jitted, float32 with per-batch centring and Chan merges), the reference
with numpy (float64 sums of ``x`` and ``xᵀx``). Both end with the per-layer covariance and its IsoScore; the two
are compared before the timing. Each side is timed over the whole corpus, alternately, after one warm-up pass;
prints tokens/s and the ratio isojax / PyTorch time (goal: <= 1.0), and the number of compilations of a second
identical isojax pass (goal: 0).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np

import isojax
from experiments.benchmarks.common import cpu_count, machine
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--texts", type=int_at_least(1), default=2000)
    ap.add_argument("--batch", type=int_at_least(1), default=64)
    ap.add_argument("--length", type=int_at_least(2), default=128)
    ap.add_argument("--repeats", type=int_at_least(1), default=2)
    args = ap.parse_args(argv)

    import torch
    import transformers

    torch.set_num_threads(cpu_count())
    module, params, tokenizer = isojax.from_pretrained(args.model)
    ref = transformers.AutoModel.from_pretrained(hub.resolve(args.model)).eval()
    data = load_stsb("test")
    sentences = list(data.sentences1) + list(data.sentences2)
    texts = (sentences * (args.texts // len(sentences) + 1))[: args.texts]
    batches = []
    for start in range(0, len(texts), args.batch):
        enc = tokenizer(
            texts[start : start + args.batch],
            padding="max_length",
            truncation=True,
            max_length=args.length,
            return_tensors="np",
        )
        batches.append((enc["input_ids"].astype(np.int32), enc["attention_mask"].astype(bool)))
    tokens = int(sum(mask.sum() for _, mask in batches))
    layers = module.config.num_hidden_layers + 1
    d = module.config.hidden_size

    @jax.jit
    def step(state, ids, mask):
        out = module.apply({"params": params}, ids, mask)
        return stats.update(state, jnp.stack(out.hidden_states, axis=1), mask)

    def isojax_pass():
        state = stats.init(d, layers)
        for ids, mask in batches:
            state = step(state, ids, mask)
        return np.asarray(stats.covariance(state))

    def torch_pass():
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

    mine, theirs = isojax_pass(), torch_pass()
    agree = max(abs(isoscore_of_covariance(a) - isoscore_of_covariance(b)) for a, b in zip(mine, theirs))
    compiles = []

    def listener(event: str, duration_secs: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    times: dict[str, list[float]] = {"isojax": [], "pytorch": []}
    for _ in range(args.repeats):
        for side, run in (("isojax", isojax_pass), ("pytorch", torch_pass)):
            began = time.perf_counter()
            run()
            times[side].append(time.perf_counter() - began)
    best = {side: min(t) for side, t in times.items()}
    print(machine(), f"| torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"{args.model}: {len(texts)} texts, {tokens} real tokens, {layers} layers x {d}; max |IsoScore difference| "
        f"{agree:.1e}; compilation events in the timed isojax passes: {len(compiles)}"
    )
    for side in ("isojax", "pytorch"):
        print(f"{side}: {best[side]:.2f} s, {tokens / best[side]:,.0f} tokens/s (best of {args.repeats})")
    print(f"ratio isojax / pytorch: {best['isojax'] / best['pytorch']:.3f}")


if __name__ == "__main__":
    main()
