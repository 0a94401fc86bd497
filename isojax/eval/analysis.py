"""Layer-wise token-uniformity analysis of an encoder (softdecay-token-uniformity.txt §3, Figures 1-2).

For every layer l (0 = embedding output) and every sentence s, with ``X`` the ``[n_s, d]`` matrix of its real
token states and ``σ̃ = σ / σ_1`` its normalised singular values:

    TokenUni     mean cosine over pairs of distinct tokens          (metrics.token_uniformity)
    RBF_dis      log mean exp(-2 ||x̂_i - x̂_j||^2), unit rows        (metrics.rbf_uniformity)
    EV_1..EV_3   Σ_{i<=k} σ_i^2 / Σ σ_i^2                           (metrics.explained_variance, uncentered)
    median σ̃, skewness of σ̃                                       (metrics.singular_value_stats)

These are averaged over the sentences with at least 2 tokens (a pair of distinct tokens; a one-token text, which
GPT-2's tokenizer can give, has no TokenUni or RBF_dis and is left out of every sentence column); the CDF of
Figure 1 pools the σ̃ of all sentences. Corpus-level measures use the token states of up to ``tokens_per_text``
content tokens (positions 1, 2, ...; [CLS]/[SEP] excluded) of every sentence, pooled into one ``[T, d]`` matrix
per layer:

    IsoScore                                                     (metrics.isoscore)
    anisotropy   σ_1^2 / Σ σ_i^2 of the pooled matrix, raw and centered   (metrics.anisotropy)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from isojax import metrics
from isojax._files import write_json
from isojax._validate import check_texts
from isojax.eval.encode import encode

CDF_GRID = np.linspace(0.0, 1.0, 201)
SENTENCE_COLUMNS = ("token_uni", "rbf_dis", "ev1", "ev2", "ev3", "sv_median", "sv_skewness")
CORPUS_COLUMNS = ("isoscore", "anisotropy", "anisotropy_centered")


def _per_sentence(output, mask, tokens_per_text: int):
    """``reduce`` for :func:`encode`: per sentence and layer, the statistics above, CDF counts on the grid, and
    the states of the first ``tokens_per_text`` content tokens with their validity."""
    h = jnp.stack(output.hidden_states, axis=1).astype(jnp.float32)  # [B, layers, L, H]
    m = jnp.broadcast_to(mask[:, None, :], h.shape[:-1])
    stats = metrics.singular_value_stats(h, mask=m)
    grid = jnp.asarray(CDF_GRID, stats.normalized.dtype)
    below = (stats.normalized[..., None, :] <= grid[:, None]) & stats.valid[..., None, :]
    positions = jnp.arange(1, tokens_per_text + 1)
    content = positions[None, :] < mask.sum(-1, keepdims=True) - 1  # [B, K]: not [CLS], not the final [SEP]
    width = h.shape[2]
    samples = h[:, :, jnp.minimum(positions, width - 1)]  # [B, layers, K, H]
    return dict(
        token_uni=metrics.token_uniformity(h, mask=m),
        rbf_dis=metrics.rbf_uniformity(h, mask=m),
        **{f"ev{k}": metrics.explained_variance(h, k, mask=m) for k in (1, 2, 3)},
        sv_median=stats.median,
        sv_skewness=stats.skewness,
        cdf_counts=below.sum(-1),  # [B, layers, grid]
        n_valid=stats.valid.sum(-1),  # [B, layers]
        n_tokens=mask.sum(-1),  # [B]
        samples=samples,
        sample_valid=content,
    )


def analyze_layers(
    module,
    params,
    tokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int = 128,
    tokens_per_text: int = 8,
    progress: bool = False,
) -> dict:
    """Per-layer table and pooled singular-value CDF of ``texts`` (see the module docstring).

    Args:
      module: an encoder (as :func:`isojax.from_pretrained` returns it).
      params: its params.
      tokenizer: its Hugging Face tokenizer.
      texts: strings (a single ``str`` is a ``TypeError``).
      batch_size: texts per batch, as for :func:`isojax.eval.encode`.
      max_length: texts are truncated to this many tokens, as for :func:`isojax.eval.encode`.
      tokens_per_text: content tokens per text pooled into the corpus-level measures.
      progress: show a progress bar.

    Returns:
      A JSON-ready dict: ``layers`` (0 = the embedding output, then one per block), one list per column of
      ``SENTENCE_COLUMNS`` and ``CORPUS_COLUMNS`` (one value per layer), ``cdf_grid``, ``cdf`` (one list per layer),
      ``num_texts``, ``num_sentence_texts`` (the texts of 2 or more tokens, which the sentence columns average),
      ``num_tokens``. ``ValueError`` when no text has 2 tokens or the texts hold fewer than 2 content tokens.

    Examples:
      all-MiniLM-L6-v2 has 6 blocks, so 7 layers; the variance the top 1, 2, 3 directions explain grows with k:

      >>> from isojax.models import from_pretrained
      >>> module, params, tokenizer = from_pretrained("default")
      >>> table = analyze_layers(module, params, tokenizer, ["A cat sits on the mat.", "Stocks fell sharply today."])
      >>> table["layers"], table["num_texts"], table["num_tokens"]  # 7 + 5 content tokens
      ([0, 1, 2, 3, 4, 5, 6], 2, 12)
      >>> all(0 < a <= b <= c <= 1 for a, b, c in zip(table["ev1"], table["ev2"], table["ev3"]))
      True
    """
    texts = check_texts(texts)
    per = encode(
        module,
        params,
        tokenizer,
        texts,
        batch_size=batch_size,
        max_length=max_length,
        reduce=lambda out, mask: _per_sentence(out, mask, tokens_per_text),
        progress=progress,
        desc="analyzing layers",
    )
    layers = per["ev1"].shape[1]
    paired = per["n_tokens"] >= 2  # the sentence measures need a pair of distinct tokens
    if not paired.any():
        raise ValueError("every text has fewer than 2 tokens; the per-sentence measures need a pair of tokens")
    result = {"num_texts": len(texts), "num_sentence_texts": int(paired.sum()), "layers": list(range(layers))}
    for name in SENTENCE_COLUMNS:
        result[name] = per[name][paired].astype(np.float64).mean(0).tolist()
    tokens = np.swapaxes(per["samples"], 1, 2)[per["sample_valid"]]  # [T, layers, H]
    if len(tokens) < 2:
        raise ValueError(f"only {len(tokens)} content tokens in the texts; corpus measures need at least 2")
    result["num_tokens"] = len(tokens)
    by_layer = jnp.asarray(np.swapaxes(tokens, 0, 1))  # [layers, T, H]
    result["isoscore"] = np.asarray(metrics.isoscore(by_layer)).tolist()
    result["anisotropy"] = np.asarray(metrics.anisotropy(by_layer)).tolist()
    result["anisotropy_centered"] = np.asarray(metrics.anisotropy(by_layer, center=True)).tolist()
    result["cdf_grid"] = CDF_GRID.tolist()
    result["cdf"] = (per["cdf_counts"].sum(0) / per["n_valid"].sum(0)[:, None]).tolist()
    return result


_HEADERS = {
    "token_uni": "TokenUni",
    "rbf_dis": "RBF_dis",
    "ev1": "EV_1",
    "ev2": "EV_2",
    "ev3": "EV_3",
    "sv_median": "med σ̃",
    "sv_skewness": "skew σ̃",
    "isoscore": "IsoScore",
    "anisotropy": "aniso",
    "anisotropy_centered": "aniso_c",
}


def format_table(result: dict) -> str:
    """The per-layer table of :func:`analyze_layers` as aligned text.

    Args:
      result: an :func:`analyze_layers` dict (or one with ``layers`` and any of its columns: one value per layer).

    Returns:
      a ``str``: a header row (``layer`` and the columns of ``SENTENCE_COLUMNS`` then ``CORPUS_COLUMNS`` that
      ``result`` holds, each right-aligned in 9 characters), a rule, and one row per layer with 4 decimals.

    Examples:
      >>> print(format_table({"layers": [0, 1], "ev1": [0.5, 0.25], "isoscore": [0.125, 1.0]}))
      layer      EV_1  IsoScore
      -------------------------
          0    0.5000    0.1250
          1    0.2500    1.0000
    """
    columns = [c for c in (*SENTENCE_COLUMNS, *CORPUS_COLUMNS) if c in result]
    head = f"{'layer':>5} " + " ".join(f"{_HEADERS[c]:>9}" for c in columns)
    rows = [head, "-" * len(head)]
    for i, layer in enumerate(result["layers"]):
        rows.append(f"{layer:>5} " + " ".join(f"{result[c][i]:>9.4f}" for c in columns))
    return "\n".join(rows)


def plot_layers(result: dict, path: str, *, title: str = "") -> str:
    """Per-layer curves of the uniformity and isotropy measures, saved as a 780 × 540 PNG (6.5 × 4.5 in at 120 dpi).

    One line per measure (TokenUni, EV_1, median σ̃, IsoScore, raw and centered anisotropy) against the layer.

    Args:
      result: an :func:`analyze_layers` dict (``layers`` and those six columns).
      path: the PNG file to write (its directory must exist).
      title: the plot title; ``""``: "Uniformity and isotropy per layer".

    Returns:
      ``path``.

    Examples:
      >>> import struct, tempfile, os.path
      >>> columns = ("token_uni", "ev1", "sv_median", "isoscore", "anisotropy", "anisotropy_centered")
      >>> result = {"layers": [0, 1, 2], **{c: [0.2, 0.5, 0.4] for c in columns}}
      >>> path = plot_layers(result, os.path.join(tempfile.mkdtemp(), "layers.png"))
      >>> png = open(path, "rb").read()
      >>> png[:8] == b"\\x89PNG\\r\\n\\x1a\\n", struct.unpack(">II", png[16:24])  # signature; IHDR width, height
      (True, (780, 540))
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for c in ("token_uni", "ev1", "sv_median", "isoscore", "anisotropy", "anisotropy_centered"):
        ax.plot(result["layers"], result[c], marker="o", label=_HEADERS[c])
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel("value")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "Uniformity and isotropy per layer")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cdf(result: dict, path: str, *, title: str = "") -> str:
    """Figure 1 of the SoftDecay paper: per-layer empirical CDF of normalised singular values, saved as PNG.

    One curve per layer (viridis colours, layer 0 labelled "embeddings") of ``result["cdf"]`` against
    ``result["cdf_grid"]``, on a 720 × 540 canvas (6 × 4.5 in at 120 dpi).

    Args:
      result: an :func:`analyze_layers` dict (``layers``, ``cdf_grid``, ``cdf``, ``num_texts``).
      path: the PNG file to write (its directory must exist).
      title: the plot title; ``""``: "Singular-value CDF per layer (N texts)".

    Returns:
      ``path``.

    Examples:
      >>> import struct, tempfile, os.path
      >>> result = {"layers": [0, 1], "cdf_grid": [0.0, 0.5, 1.0], "cdf": [[0, 0.5, 1], [0, 0.9, 1]], "num_texts": 2}
      >>> path = plot_cdf(result, os.path.join(tempfile.mkdtemp(), "cdf.png"))
      >>> png = open(path, "rb").read()
      >>> png[:8] == b"\\x89PNG\\r\\n\\x1a\\n", struct.unpack(">II", png[16:24])  # signature; IHDR width, height
      (True, (720, 540))
    """
    plt = _pyplot()
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
    """Write ``result`` to ``path`` as indented JSON, whole or not at all (a ``.part`` file renamed onto it).

    Args:
      result: a JSON-serialisable dict, e.g. an :func:`analyze_layers` result.
      path: the file to write (overwritten; missing directories are created).

    Returns:
      ``path``.

    Examples:
      >>> import json, os.path, tempfile
      >>> path = save_json({"layers": [0, 1], "ev1": [0.5, 0.25]}, os.path.join(tempfile.mkdtemp(), "t.json"))
      >>> json.load(open(path))
      {'layers': [0, 1], 'ev1': [0.5, 0.25]}
    """
    write_json(Path(path), result)
    return path


__all__ = ["analyze_layers", "format_table", "plot_cdf", "plot_layers", "save_json"]
