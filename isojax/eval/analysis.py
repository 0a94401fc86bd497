"""Layer-wise token-uniformity analysis of an encoder (softdecay-token-uniformity.txt §3, Figures 1-2).

For every layer l (0 = embedding output) and every sentence s, with ``X`` the ``[n_s, d]`` matrix of its real
token states and ``σ̃ = σ / σ_1`` its normalised singular values:

    TokenUni   mean cosine over pairs of distinct tokens          (metrics.token_uniformity)
    EV_1       σ_1^2 / Σ σ_i^2                                     (metrics.explained_variance, uncentered)
    median σ̃, skewness of σ̃                                       (metrics.singular_value_stats)

Per layer the table reports the mean over sentences; the CDF of Figure 1 pools the σ̃ of all sentences.
"""
from __future__ import annotations

import json
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from isojax import metrics
from isojax.eval.encode import encode

CDF_GRID = np.linspace(0.0, 1.0, 201)
COLUMNS = ("token_uni", "ev1", "sv_median", "sv_skewness")


def _per_sentence(output, mask):
    """``reduce`` for :func:`encode`: per sentence and layer, the statistics above and CDF counts on the grid."""
    h = jnp.stack(output.hidden_states, axis=1)  # [B, layers, L, H]
    m = jnp.broadcast_to(mask[:, None, :], h.shape[:-1])
    stats = metrics.singular_value_stats(h, mask=m)
    grid = jnp.asarray(CDF_GRID, stats.normalized.dtype)
    below = (stats.normalized[..., None, :] <= grid[:, None]) & stats.valid[..., None, :]
    return dict(
        token_uni=metrics.token_uniformity(h, mask=m),
        ev1=metrics.explained_variance(h, 1, mask=m),
        sv_median=stats.median,
        sv_skewness=stats.skewness,
        cdf_counts=below.sum(-1),  # [B, layers, grid]
        n_valid=stats.valid.sum(-1),  # [B, layers]
    )


def analyze_layers(module, params, tokenizer, texts: Sequence[str], *, batch_size: int = 32,
                   max_length: int = 128, progress: bool = False) -> dict:
    """Per-layer table and pooled singular-value CDF of ``texts``.

    Returns ``{"layers": [...], "token_uni": [...], "ev1": [...], "sv_median": [...], "sv_skewness": [...],
    "cdf_grid": [...], "cdf": [[...] per layer], "num_texts": N}`` (plain lists, JSON-ready).
    """
    per = encode(module, params, tokenizer, texts, reduce=_per_sentence, batch_size=batch_size,
                 max_length=max_length, progress=progress, desc="analyzing layers")
    result = {"num_texts": len(texts), "layers": list(range(per["ev1"].shape[1]))}
    for name in COLUMNS:
        result[name] = per[name].astype(np.float64).mean(0).tolist()
    result["cdf_grid"] = CDF_GRID.tolist()
    result["cdf"] = (per["cdf_counts"].sum(0) / per["n_valid"].sum(0)[:, None]).tolist()
    return result


def format_table(result: dict) -> str:
    """The per-layer table as aligned text."""
    head = f"{'layer':>5} {'TokenUni':>9} {'EV_1':>7} {'median σ̃':>9} {'skew σ̃':>8}"
    rows = [head, "-" * len(head)]
    for i, layer in enumerate(result["layers"]):
        rows.append(f"{layer:>5} {result['token_uni'][i]:>9.4f} {result['ev1'][i]:>7.4f} "
                    f"{result['sv_median'][i]:>9.4f} {result['sv_skewness'][i]:>8.3f}")
    return "\n".join(rows)


def plot_cdf(result: dict, path: str, *, title: str = "") -> str:
    """Figure 1 of the SoftDecay paper: per-layer empirical CDF of normalised singular values, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    colors = plt.cm.viridis(np.linspace(0, 1, len(result["layers"])))
    for layer, cdf, color in zip(result["layers"], result["cdf"], colors):
        ax.plot(result["cdf_grid"], cdf, color=color, label="embeddings" if layer == 0 else f"layer {layer}")
    ax.set_xlabel("normalised singular value σ / σ₁")
    ax.set_ylabel("empirical CDF")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"Singular-value CDF per layer ({result['num_texts']} texts)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def save_json(result: dict, path: str) -> str:
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return path


__all__ = ["analyze_layers", "format_table", "plot_cdf", "save_json"]
