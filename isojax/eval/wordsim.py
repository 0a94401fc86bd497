"""Word similarity on the input embedding matrix, and its isotropy (too-much-in-common-centering.txt §5).

The embedding of a word is its row of the input embedding matrix ``W [V, d]``; pairs with a word the tokenizer
splits into several tokens are skipped (the paper filters out "samples consisting of subword units"). A pair is
scored by cosine similarity or inner product, before and after post-processing the whole matrix:

    raw; center: W - mu; scaled_center: e(w) - ||e(w)|| mu_hat (mu_hat = mean of unit rows);
    abtt: all-but-the-top, eq. 11 (remove the mean and the ceil(d/100) top principal directions)
"""

from __future__ import annotations

import jax
import numpy as np

from isojax import calibrate, metrics
from isojax._validate import check_texts
from isojax.eval.sts import correlations
from isojax.models import word_embeddings

EMBEDDING_METHODS = ("raw", "center", "scaled_center", "abtt")
SIMILARITIES = ("cosine", "inner")


def input_embeddings(params) -> np.ndarray:
    """The input (token) embedding matrix ``W [V, d]`` of an encoder's params."""
    return np.asarray(word_embeddings(params), np.float32)


def transform_embeddings(w, method: str = "raw") -> np.ndarray:
    """Post-process the embedding matrix ``[V, d]`` by ``method`` (see the module docstring)."""
    if method == "raw":
        return np.asarray(w)
    if method == "center":
        return np.asarray(calibrate.center(w))
    if method == "scaled_center":
        return np.asarray(calibrate.scaled_center(w))
    if method == "abtt":
        return np.asarray(calibrate.all_but_the_top(w, mode="centered"))
    raise ValueError(f"unknown embedding method {method!r}; expected one of {EMBEDDING_METHODS}")


def single_token_ids(tokenizer, words) -> dict[str, int | None]:
    """Token id of each word the tokenizer keeps whole (no special tokens added); None for split words.
    ``words`` is a sequence of strings (a single ``str`` is a ``TypeError``)."""
    words = sorted(set(check_texts(words, "words")))
    ids = tokenizer(words, add_special_tokens=False)["input_ids"]
    return {w: (i[0] if len(i) == 1 else None) for w, i in zip(words, ids)}


def evaluate_wordsim(w, tokenizer, data, *, similarity: str = "cosine") -> dict:
    """Pearson and Spearman ×100 of ``similarity`` between the embeddings of the pairs of ``data``
    (an :class:`isojax.data.wordsim.WordSimData`) whose two words are single tokens."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    ids = single_token_ids(tokenizer, [x for pair in data.pairs for x in pair])
    keep = [i for i, (a, b) in enumerate(data.pairs) if ids[a] is not None and ids[b] is not None]
    if len(keep) < 3:
        raise ValueError(f"{data.name}: only {len(keep)} pairs have two single-token words; need at least 3")
    w = np.asarray(w, np.float64)
    ea = w[[ids[data.pairs[i][0]] for i in keep]]
    eb = w[[ids[data.pairs[i][1]] for i in keep]]
    sims = (ea * eb).sum(1)
    if similarity == "cosine":
        norms = np.linalg.norm(ea, axis=1) * np.linalg.norm(eb, axis=1)
        sims = np.divide(sims, norms, out=np.zeros_like(sims), where=norms > 0)
    return {
        "data": data.name,
        "similarity": similarity,
        "pairs_used": len(keep),
        "pairs_total": len(data),
        **correlations(sims, data.scores[keep]),
    }


def embedding_isotropy(w) -> dict[str, float]:
    """Table 1 of too-much-in-common: the partition-function isotropy (:func:`isojax.metrics.partition_isotropy`)
    ``I1`` (the paper's I(W)) and ``I2`` of the matrix ``W [V, d]`` raw, ``I1_centered`` / ``I2_centered`` (I(W_c))
    and ``I1_abtt`` / ``I2_abtt`` after all-but-the-top (I(W_r)); ``avg_norm`` avg ||e(w)||, ``mean_norm`` ||mu||,
    and their ratio ``mean_norm_ratio``."""
    w = np.asarray(w, np.float32)
    mu = w.mean(0)
    avg_norm = float(np.linalg.norm(w, axis=1).mean())
    out = {}
    for suffix, method in (("", "raw"), ("_centered", "center"), ("_abtt", "abtt")):
        i1, i2 = jax.jit(metrics.partition_isotropy)(transform_embeddings(w, method))  # one compilation per shape
        out[f"I1{suffix}"], out[f"I2{suffix}"] = float(i1), float(i2)
    out.update(
        {
            "avg_norm": avg_norm,
            "mean_norm": float(np.linalg.norm(mu)),
            "mean_norm_ratio": float(np.linalg.norm(mu)) / avg_norm,
        }
    )
    return out
