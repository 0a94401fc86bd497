"""Per-layer anisotropy profiles of real models over a real corpus, with the measures since 2022, compared with the
papers' qualitative claims.

    python -m experiments.reproductions.anisotropy_profiles [--models default,all-mpnet-base-v2,gpt2-shaped,
        smollm2-135m-instruct] [--data-dir ../shared/data] [--max-texts 2000] [--sink-texts 256] [--twonn-tokens 2000]

**Corpus.** The sentences of GLUE's dev sets in the data directory (CoLA, SST-2, MRPC, RTE, WNLI; both sides of a
pair) and STS-B test, in that order, deduplicated, the first ``--max-texts``: real English sentences available
offline.

**Models.** all-MiniLM-L6-v2 and all-mpnet-base-v2 (sentence encoders), a GPT-2-small-shaped causal LM with random
weights (no GPT-2 weights are to be had offline; SmolLM2's tokenizer feeds it), and SmolLM2-135M-Instruct read from
its GGUF (a Llama-architecture decoder LLM).

**Measures.** :func:`isojax.eval.analysis.analyze_layers` over every content token of every text (special tokens
left out): IsoScore, the anisotropy σ₁²/Σσᵢ² raw and centred (Razzhigaev et al. 2023), the mean cosine of token pairs
(Godey et al. 2024), the rogue dimensions' share of the expected cosine (Timkey & van Schijndel 2021), the largest
|activation| with its dimension and position and, per text, its ratio to the median |activation| (Sun et al. 2024).
Beside it, from :func:`isojax.models.capture` on the first ``--sink-texts`` texts: the attention paid to the first
token, α₁, and Sink_0.3 per layer (Gu et al. 2025, causal LMs); and TwoNN intrinsic dimension (Facco et al. 2017) of
``--twonn-tokens`` content tokens per layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import isojax
from experiments.tooling.report import SHARED_DATA, markdown_table, provenance, write_result
from isojax import metrics
from isojax.data.glue import load_glue
from isojax.data.sts import load_stsb
from isojax.eval.analysis import analyze_layers
from isojax.models import TransformerConfig, build_model, capture, init_params, model_kind

GLUE_DEV = ("cola", "sst2", "mrpc", "rte", "wnli")
MODELS = ("default", "all-mpnet-base-v2", "gpt2-shaped", "smollm2-135m-instruct")


def corpus(data_dir: str, max_texts: int) -> list[str]:
    """Deduplicated sentences of the GLUE dev sets in ``data_dir`` and STS-B test, in order, the first ``max_texts``."""
    texts: list[str] = []
    for task in GLUE_DEV:
        data = load_glue(task, "dev", data_dir=data_dir)
        texts += data.texts_a + (data.texts_b or [])
    stsb = load_stsb("test")
    texts += list(stsb.sentences1) + list(stsb.sentences2)
    unique = list(dict.fromkeys(t.strip() for t in texts if t.strip()))
    return unique[:max_texts]


def load(name: str):
    """``(module, params, tokenizer, label)``; ``gpt2-shaped`` is GPT-2 small's shape with random weights."""
    if name != "gpt2-shaped":
        module, params, tokenizer = isojax.from_pretrained(name)
        return module, params, tokenizer, name
    _, _, tokenizer = isojax.from_pretrained("smollm2-135m-instruct")
    config = TransformerConfig(
        model_type="gpt2",
        vocab_size=len(tokenizer),
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=1024,
        hidden_act="gelu_new",
        type_vocab_size=0,
        pre_norm=True,
        embedding_norm=False,
        layer_norm_eps=1e-5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    module = build_model(config)
    return module, init_params(module, jax.random.key(0)), tokenizer, "GPT-2-small shape, random weights"


@dataclasses.dataclass
class Extra:
    """Per layer: TwoNN dimension of sampled content tokens; for causal LMs, mean α₁ and Sink_0.3."""

    twonn: list[float]
    alpha_first: list[float] | None
    sink_rate: list[float] | None


def extra_measures(module, params, tokenizer, texts, *, sink_texts: int, twonn_tokens: int, batch: int = 16) -> Extra:
    """TwoNN per layer on ``twonn_tokens`` content tokens and, for a causal LM, the attention sinks on the first
    ``sink_texts`` texts, from :func:`isojax.models.capture` (one forward per batch)."""
    causal = model_kind(module.config) == "causal_lm"
    run = jax.jit(capture, static_argnums=0, static_argnames="points")
    points = ("embeddings", "residual", "attention_probs") if causal else ("embeddings", "residual")
    pools: list[list[np.ndarray]] = []
    alphas, rates = [], []
    special = set(tokenizer.all_special_ids)
    for start in range(0, sink_texts, batch):
        chunk = texts[start : start + batch]
        enc = tokenizer(chunk, padding=True, truncation=True, max_length=128, return_tensors="np")
        ids, mask = enc["input_ids"], enc["attention_mask"].astype(bool)
        out = run(module, params, ids, mask, points=points)
        states = np.concatenate([np.asarray(out["embeddings"])[None], np.asarray(out["residual"])])
        content = mask & ~np.isin(ids, list(special))
        if not pools:
            pools = [[] for _ in range(states.shape[0])]
        for layer, h in enumerate(states):
            pools[layer].append(h[content])
        if causal:
            probs = jnp.moveaxis(out["attention_probs"], 0, 1)  # [B, layers, heads, L, L]
            sinks = metrics.attention_sinks(probs, mask=mask)
            alphas.append(np.asarray(sinks.first))  # [B, layers, heads]
            rates.append((np.asarray(sinks.first) > 0.3).astype(np.float32))
    rng = np.random.default_rng(0)
    twonn = []
    for layer_pool in pools:
        tokens = np.concatenate(layer_pool)
        pick = rng.choice(len(tokens), size=min(twonn_tokens, len(tokens)), replace=False)
        twonn.append(float(metrics.twonn_dimension(jnp.asarray(tokens[pick], jnp.float32))))
    if not causal:
        return Extra(twonn, None, None)
    first, rate = np.concatenate(alphas), np.concatenate(rates)
    return Extra(twonn, first.mean(axis=(0, 2)).tolist(), rate.mean(axis=(0, 2)).tolist())


def claims(label: str, result: dict, extra: Extra, causal: bool) -> list[str]:
    """The papers' qualitative claims checked on one model, each line saying what was seen."""
    layers = result["layers"]
    centred = np.asarray(result["anisotropy_centered"])
    peak = int(np.argmax(centred[1:])) + 1  # blocks, not the embedding layer
    depth = layers[-1]
    where = (
        "the middle third"
        if depth / 3 <= peak <= 2 * depth / 3
        else ("the first third" if peak < depth / 3 else "the last third")
    )
    out = [
        f"- Centred anisotropy (Razzhigaev et al.: peaks mid-depth in decoders) peaks at layer {peak} of {depth}, in "
        f"{where} ({centred[peak]:.3f}; embeddings {centred[0]:.3f}, last layer {centred[-1]:.3f})."
    ]
    ratio = np.asarray(result["massive_ratio"])
    big = [i for i, r in enumerate(ratio) if r >= 100]
    positions = result["max_abs_position"]
    out.append(
        "- Massive activations (Sun et al.: ~10³–10⁴ x the median, from early layers on, at the first token): "
        + (
            f"the largest |h| exceeds 100 x the median from layer {big[0]} on "
            f"(largest ratio {ratio.max():.0f} at layer {int(np.argmax(ratio))}; the corpus maximum sits at position "
            f"{positions[int(np.argmax(result['max_abs']))]} in its text, dimension "
            f"{result['max_abs_dim'][int(np.argmax(result['max_abs']))]})."
            if big
            else f"none: the per-text max/median ratio stays below 100 (largest {ratio.max():.1f})."
        )
    )
    cosine = np.asarray(result["mean_cosine"])
    out.append(
        f"- Mean cosine of token pairs (Godey et al.: anisotropy inherent to self-attention models) ranges "
        f"{cosine[1:].min():.3f}–{cosine[1:].max():.3f} over the blocks."
    )
    if causal and extra.sink_rate is not None and extra.alpha_first is not None:
        rate = np.asarray(extra.sink_rate)
        out.append(
            f"- Attention sinks (Gu et al.: widespread in trained LMs): Sink_0.3 is {rate.mean():.2f} over layers "
            f"and heads (per layer {rate.min():.2f}–{rate.max():.2f}); mean α₁ {np.mean(extra.alpha_first):.2f}."
        )
    return [f"**{label}**\n\n" + "\n".join(out)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--data-dir", default=SHARED_DATA)
    parser.add_argument("--max-texts", type=int, default=2000)
    parser.add_argument("--sink-texts", type=int, default=256)
    parser.add_argument("--twonn-tokens", type=int, default=2000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    prov = provenance("anisotropy_profiles")
    texts = corpus(args.data_dir, args.max_texts)
    sections, payload = [f"Corpus: {len(texts)} distinct sentences (GLUE dev sets and STS-B test)."], {}
    summary = ["## What the papers claim, and what these models show"]
    for name in args.models.split(","):
        start = time.perf_counter()
        module, params, tokenizer, label = load(name)
        result = analyze_layers(module, params, tokenizer, texts, batch_size=32, max_length=128)
        extra = extra_measures(
            module,
            params,
            tokenizer,
            texts,
            sink_texts=min(args.sink_texts, len(texts)),
            twonn_tokens=args.twonn_tokens,
        )
        causal = model_kind(module.config) == "causal_lm"
        seconds = time.perf_counter() - start
        headers = ["layer", "IsoScore", "aniso raw", "aniso centred", "mean cos", "rogue top1", "rogue top3"]
        headers += ["max |h|", "dim", "pos", "max/median", "TwoNN"] + (["α₁", "Sink_0.3"] if causal else [])
        rows = []
        for i, layer in enumerate(result["layers"]):
            row = [layer, result["isoscore"][i], result["anisotropy"][i], result["anisotropy_centered"][i]]
            row += [result["mean_cosine"][i], result["rogue_top1_share"][i], result["rogue_top3_share"][i]]
            row += [result["max_abs"][i], result["max_abs_dim"][i], result["max_abs_position"][i]]
            row += [result["massive_ratio"][i], extra.twonn[i]]
            if extra.alpha_first is not None and extra.sink_rate is not None:
                row += [extra.alpha_first[i - 1] if i else None, extra.sink_rate[i - 1] if i else None]
            rows.append(row)
        sections += [
            f"## {label}",
            f"{result['num_tokens']} content tokens; {seconds:.0f} s.",
            markdown_table(headers, rows),
        ]
        summary += claims(label, result, extra, causal)
        payload[name] = {"result": result, "extra": dataclasses.asdict(extra), "seconds": seconds}
        print(f"{name}: {seconds:.0f} s")
    kwargs = {} if args.out is None else {"directory": args.out}
    path = write_result(
        "anisotropy_profiles",
        "Per-layer anisotropy profiles of real models over GLUE and STS sentences",
        summary + sections,
        payload,
        prov,
        **kwargs,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
