"""Unsupervised STS evaluation: sentence embeddings, a post-hoc transform, cosine similarity vs gold scores.

Protocol (BERT-flow / BERT-whitening / SoftDecay papers): embed both sides of every pair; fit the transform on
all ``2N`` sentence embeddings of the evaluated set and apply it to them (``softdecay`` is applied to each side's
``[N, d]`` matrix separately, as in the SoftDecay authors' code); score each pair by the cosine of its two
transformed embeddings; report Spearman's and Pearson's correlation with the gold scores, ×100.

Transforms (``METHODS``): ``raw``; ``center``; ``scaled_center``; ``whiten`` (k dims, BERT-whitening);
``abtt`` (all-but-the-top, D directions, centered or raw projection); ``flow`` (Glow fitted by maximum
likelihood); ``softdecay`` (fixed α, over the whole matrix).

Several sets at once (the SoftDecay paper's Table 1): :func:`embed_sets` encodes each distinct sentence of all
the sets once, and :func:`evaluate_sets` applies every transform to every set, with one SoftDecay α chosen on
a dev set, and averages over the sets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from isojax import calibrate, metrics
from isojax.eval.encode import Pooled, encode
from isojax.softdecay import soft_decay

METHODS = ("raw", "center", "scaled_center", "whiten", "abtt", "flow", "softdecay")
DEFAULT_ALPHAS = (-0.2, -0.4, -0.6, -0.8, -1.0)


@dataclasses.dataclass(frozen=True)
class Transform:
    """A post-hoc transform and its options: ``whiten_k``, ``abtt_D``/``abtt_mode``, ``alpha``, flow settings."""

    method: str = "raw"
    whiten_k: int | None = None
    abtt_D: int | None = None
    abtt_mode: str = "centered"
    alpha: float = -0.6
    flow_steps: int = 300
    seed: int = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown STS method {self.method!r}; expected one of {METHODS}")

    @property
    def label(self) -> str:
        extra = {
            "whiten": f"k={self.whiten_k}" if self.whiten_k else "",
            "abtt": f"D={'d/100' if self.abtt_D is None else self.abtt_D}, {self.abtt_mode}",
            "softdecay": f"alpha={self.alpha:g}",
        }.get(self.method, "")
        return f"{self.method} ({extra})" if extra else self.method

    def __call__(self, a: np.ndarray, b: np.ndarray) -> tuple[jax.Array, jax.Array]:
        """Transform the two sides ``[N, d]`` of the pairs; returns ``([N, d'], [N, d'])``."""
        if self.method == "softdecay":
            return soft_decay(jnp.asarray(a), self.alpha), soft_decay(jnp.asarray(b), self.alpha)
        both = jnp.concatenate([jnp.asarray(a), jnp.asarray(b)])
        out = self.apply_joint(both)
        return out[: len(a)], out[len(a) :]

    def apply_joint(self, x: jax.Array) -> jax.Array:
        """The transform fitted on and applied to the rows of ``x [M, d]`` (not used for softdecay)."""
        if self.method == "raw":
            return x
        if self.method == "center":
            return calibrate.center(x)
        if self.method == "scaled_center":
            return calibrate.scaled_center(x)
        if self.method == "whiten":
            return calibrate.apply_whitening(calibrate.fit_whitening(x, k=self.whiten_k), x)
        if self.method == "abtt":
            return calibrate.all_but_the_top(x, D=self.abtt_D, mode=self.abtt_mode)
        if self.method == "flow":
            state = calibrate.fit_flow(x, jax.random.key(self.seed), steps=self.flow_steps)
            return calibrate.apply_flow(state, x)[0]
        return soft_decay(x, self.alpha)


def embed_sets(
    module,
    params,
    tokenizer,
    sets: Sequence,
    *,
    poolings: Sequence[str] = ("mean",),
    max_length: int = 128,
    batch_size: int = 64,
    progress: bool = False,
) -> dict[str, list]:
    """Sentence embeddings of both sides of several :class:`isojax.data.sts.StsData` in one pass.

    Every distinct sentence of all the sets is encoded once, and every pooling in ``poolings`` comes from that
    same forward pass. Returns ``{pooling: [(a [N_k, d], b [N_k, d]) for each set k]}``.
    """
    texts = list(dict.fromkeys(t for data in sets for t in (*data.sentences1, *data.sentences2)))
    emb = encode(
        module,
        params,
        tokenizer,
        texts,
        reduce=Pooled(tuple(poolings)),
        max_length=max_length,
        batch_size=batch_size,
        progress=progress,
        desc=f"embedding {len(texts)} sentences of {len(sets)} set(s)",
    )
    row = {t: i for i, t in enumerate(texts)}
    index = [([row[t] for t in data.sentences1], [row[t] for t in data.sentences2]) for data in sets]
    return {p: [(emb[p][i1], emb[p][i2]) for i1, i2 in index] for p in poolings}


def embed_pairs(
    module,
    params,
    tokenizer,
    data,
    *,
    pooling: str = "mean",
    max_length: int = 128,
    batch_size: int = 64,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Sentence embeddings ``([N, d], [N, d])`` of both sides of an :class:`isojax.data.sts.StsData`."""
    return embed_sets(
        module,
        params,
        tokenizer,
        [data],
        poolings=(pooling,),
        max_length=max_length,
        batch_size=batch_size,
        progress=progress,
    )[pooling][0]


def cosine_scores(a, b) -> np.ndarray:
    """Row-wise cosine similarity of two ``[N, d]`` arrays (0 where a row is zero)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.divide((a * b).sum(1), norms, out=np.zeros(len(a)), where=norms > 0)


def correlations(predicted, gold) -> dict[str, float]:
    """Spearman and Pearson correlation ×100 of ``[N]`` predicted and gold scores, ``N >= 2``.

    ``ValueError`` for other shapes (scipy's own message names neither array). A constant side has no correlation:
    NaN, with scipy's ``ConstantInputWarning``.
    """
    predicted, gold = np.asarray(predicted, np.float64), np.asarray(gold, np.float64)
    if predicted.ndim != 1 or predicted.shape != gold.shape or len(gold) < 2:
        raise ValueError(
            f"correlations: predicted and gold must be [N] scores with N >= 2 pairs, got {predicted.shape} and "
            f"{gold.shape}"
        )
    return {
        "spearman": 100 * float(scipy.stats.spearmanr(predicted, gold).statistic),
        "pearson": 100 * float(scipy.stats.pearsonr(predicted, gold).statistic),
    }


def sentence_isotropy(raw: np.ndarray, transformed: np.ndarray, *, lsds_k: int = 12) -> dict[str, float]:
    """Figure-4 metrics of the SoftDecay paper on sentence embeddings ``[M, d]``: TokenUni (mean cosine of
    distinct pairs), log RBF_dis (t=2), EV_1, IsoScore, and LSDS of ``raw -> transformed`` (k neighbours).

    ``ValueError`` when there are no more embeddings than ``lsds_k`` (LSDS needs ``lsds_k`` neighbours per point)."""
    if len(raw) <= lsds_k:
        raise ValueError(
            f"sentence_isotropy: LSDS's lsds_k={lsds_k} neighbours per embedding need at least {lsds_k + 1} "
            f"embeddings, got {len(raw)}; evaluate more pairs or skip the isotropy columns (isojax sts --no-isotropy)"
        )
    measures = jax.jit(_sentence_isotropy, static_argnums=2)(
        jnp.asarray(raw, jnp.float32), jnp.asarray(transformed, jnp.float32), lsds_k
    )
    return {name: float(value) for name, value in measures.items()}


def _sentence_isotropy(raw, x, lsds_k: int):
    """The measures, jitted by the caller as one call (isojax's metrics are plain functions; op by op they are slower)."""
    return {
        "token_uni": metrics.token_uniformity(x),
        "rbf_dis": metrics.rbf_uniformity(x),
        "ev1": metrics.explained_variance(x, 1),
        "isoscore": metrics.isoscore(x),
        "lsds": metrics.lsds(raw, x, k=lsds_k),
    }


def evaluate_pairs(a: np.ndarray, b: np.ndarray, gold, transform: Transform, *, isotropy: bool = False) -> dict:
    """Spearman/Pearson ×100 of ``transform`` on embedded pairs (and, with ``isotropy``, the Figure-4 metrics
    of all ``2N`` transformed embeddings)."""
    ta, tb = transform(a, b)
    result = {"method": transform.label, **correlations(cosine_scores(ta, tb), gold)}
    if isotropy:
        result.update(sentence_isotropy(np.concatenate([a, b]), np.concatenate([np.asarray(ta), np.asarray(tb)])))
    return result


def search_alpha(a, b, gold, alphas: Sequence[float] = DEFAULT_ALPHAS) -> tuple[float, dict[float, float]]:
    """The SoftDecay α with the best Spearman on a (dev) set; returns ``(best alpha, {alpha: spearman})``."""
    scores = {alpha: evaluate_pairs(a, b, gold, Transform("softdecay", alpha=alpha))["spearman"] for alpha in alphas}
    return max(scores, key=scores.__getitem__), scores


def evaluate_sets(
    pairs: dict[str, tuple],
    transforms: Sequence[Transform],
    *,
    dev: tuple[Any, Any, Any] | None = None,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    isotropy: bool = False,
) -> dict:
    """Every transform on every set, as the SoftDecay paper's Table 1 (one α for all sets, chosen on a dev set).

    Args:
      pairs: ``{set label: (a [N, d], b [N, d], gold [N])}``, the embedded pairs of each set.
      transforms: the transforms to apply (a table row each).
      dev: ``(a, b, gold)`` of the set on which SoftDecay's α is searched over ``alphas`` (the paper: STS-B
        dev); the best α then replaces the ``alpha`` of every ``softdecay`` transform. ``None``: keep them.
      isotropy: add the Figure-4 measures of each set's transformed embeddings to its rows.

    Returns:
      ``{"sets": {label: [evaluate_pairs row per transform]}, "average": {transform label: mean Spearman over
      the sets}, "alpha_search": {"spearman": {α: Spearman on dev}, "best": α}}`` (the last only with ``dev``).
    """
    out: dict[str, Any] = {}
    if dev is not None and any(t.method == "softdecay" for t in transforms):
        best, scores = search_alpha(*dev, alphas)
        transforms = [dataclasses.replace(t, alpha=best) if t.method == "softdecay" else t for t in transforms]
        out["alpha_search"] = {"spearman": {str(k): v for k, v in scores.items()}, "best": best}
    out["sets"] = {
        label: [evaluate_pairs(a, b, gold, t, isotropy=isotropy) for t in transforms]
        for label, (a, b, gold) in pairs.items()
    }
    out["average"] = {
        t.label: float(np.mean([rows[i]["spearman"] for rows in out["sets"].values()]))
        for i, t in enumerate(transforms)
    }
    return out
