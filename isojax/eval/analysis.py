"""Layer-wise anisotropy analysis of hidden states from any source (softdecay-token-uniformity.txt §3, Figures 1-2;
the measures since 2022 of REFERENCE.md), in one pass with memory independent of the corpus.

:func:`analyze_hidden_states` reads an iterable of batches ``(hidden_states, mask)`` -- ``hidden_states`` a
``[B, layers, L, d]`` array or a sequence of ``[B, L, d]`` arrays, one per layer (0 = the embedding output, as
Hugging Face's ``output_hidden_states``), ``mask [B, L]`` true = real token -- from an isojax model, a PyTorch model or
files. :func:`analyze_layers` is its producer for an isojax model and a list of texts.

For every layer l and every text s, with ``X`` the ``[n_s, d]`` matrix of its real token states and ``σ̃ = σ / σ_1``
its normalised singular values::

    TokenUni     mean cosine over pairs of distinct tokens          (metrics.token_uniformity)
    RBF_dis      log mean exp(-2 ||x̂_i - x̂_j||^2), unit rows        (metrics.rbf_uniformity)
    EV_1..EV_3   Σ_{i<=k} σ_i^2 / Σ σ_i^2                           (metrics.explained_variance, uncentered)
    median σ̃, skewness of σ̃                                       (metrics.singular_value_stats)
    massive_ratio  max |x| / median |x| of the text's states            (metrics.massive_activations)

These are averaged over the texts with at least 2 tokens (a one-token text, which GPT-2's tokenizer can give, has
no pair and is left out of every sentence column); the CDF of Figure 1 pools the σ̃ of all texts. Corpus-level
measures fold the *content* tokens of every text (a third element of a batch, ``content [B, L]``, default the
mask; the model producer leaves out the tokenizer's special tokens such as [CLS] and [SEP]) into streaming
statistics (:mod:`isojax.stats`), so all of them count, however many::

    isoscore                    IsoScore                                           (stats.isoscore)
    anisotropy, _centered       σ_1^2 / Σ σ_i^2 of all content tokens, raw and centred (stats.anisotropy)
    mean_cosine                 mean cosine over all pairs of content tokens       (stats.mean_cosine; Godey et al.
                                                                                    sample random pairs of it)
    rogue_top1_share, _top3     share of Σ|CC_k| of the top 1 / 3 dimensions       (stats.rogue_dimensions)
    max_abs, max_abs_dim,       the largest |x| of all content tokens, its dimension and its position in its
    max_abs_position            text (Sun et al.'s massive activations)            (stats.massive_activation)

With ``tokens_per_text=K`` only the first K content tokens of each text count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from isojax import metrics, stats
from isojax._files import write_json
from isojax._validate import check_texts
from isojax.eval.encode import encoded_batches, jit_once
from isojax.models.registry import model_kind

CDF_GRID = np.linspace(0.0, 1.0, 201)
SENTENCE_COLUMNS = ("token_uni", "rbf_dis", "ev1", "ev2", "ev3", "sv_median", "sv_skewness", "massive_ratio")
CORPUS_COLUMNS = (
    "isoscore",
    "anisotropy",
    "anisotropy_centered",
    "mean_cosine",
    "rogue_top1_share",
    "rogue_top3_share",
    "max_abs",
    "twonn",
)
SINK_COLUMNS = ("sink_alpha1", "sink_rate")
SINK_EPSILON = 0.3  # Gu et al.'s ε of Sink_ε
MAP_DIMENSIONS = 16  # the dimensions of the massive-activation map: those holding the largest |h| of any layer
LAYER_CURVES = ("token_uni", "ev1", "sv_median", "isoscore", "anisotropy", "anisotropy_centered")


class _Running(NamedTuple):
    """What :func:`_fold` carries besides the streaming statistics: a uniform sample of content tokens for TwoNN
    (``keys [n]``, the smallest uniform draws so far, +inf where empty; ``states [layers, n, d]``), and the largest
    ``|h|`` per layer and dimension over *all* real tokens, special tokens included, with its token's position."""

    keys: jax.Array
    states: jax.Array
    max_abs: jax.Array
    max_position: jax.Array


def _start(layers: int, d: int, sample: int) -> _Running:
    return _Running(
        keys=jnp.full((sample,), jnp.inf, jnp.float32),
        states=jnp.zeros((layers, sample, d), jnp.float32),
        max_abs=jnp.full((layers, d), -jnp.inf, jnp.float32),
        max_position=jnp.full((layers, d), -1, jnp.int32),
    )


def _fold(state, running, h, mask, content, first_attention, key, *, tokens_per_text: int | None):
    """One batch: the sums over its texts of 2 or more tokens of the per-text measures ``[layers]``, their number,
    the CDF counts ``[layers, grid]`` and valid singular values ``[layers]`` summed over its texts, the attention-
    sink sums ``[layers]`` (with ``first_attention``); ``state`` updated with its content tokens (the first
    ``tokens_per_text`` of each text when given) and ``running`` with its tokens (a reservoir sample: each content
    token draws a uniform key from ``key``, the smallest keys stay). Nothing it returns grows with the number of
    texts. Compiled once per batch shape and option."""
    h = h.astype(jnp.float32)
    m = jnp.broadcast_to(mask[:, None, :], h.shape[:-1])
    spectrum = metrics.singular_value_stats(h, mask=m)
    grid = jnp.asarray(CDF_GRID, spectrum.normalized.dtype)
    below = (spectrum.normalized[..., None, :] <= grid[:, None]) & spectrum.valid[..., None, :]
    if tokens_per_text is not None:
        content = content & (jnp.cumsum(content, axis=-1) <= tokens_per_text)
    per_text = dict(
        token_uni=metrics.token_uniformity(h, mask=m),
        rbf_dis=metrics.rbf_uniformity(h, mask=m),
        **{f"ev{k}": metrics.explained_variance(h, k, mask=m) for k in (1, 2, 3)},
        sv_median=spectrum.median,
        sv_skewness=spectrum.skewness,
        massive_ratio=metrics.massive_activations(h, mask=m).ratio,
    )
    paired = mask.sum(-1) >= 2  # [B]: the per-text measures need a pair of distinct tokens
    sums = {k: jnp.sum(jnp.where(paired[:, None], v, 0), axis=0) for k, v in per_text.items()}
    sums.update(paired=paired.sum(), cdf_counts=below.sum(-1).sum(0), n_valid=spectrum.valid.sum(-1).sum(0))
    if first_attention is not None:  # [B, layers, heads]: α at each text's first real token
        first = first_attention.astype(jnp.float32)
        sinks = jnp.where(jnp.isnan(first), jnp.nan, (first > SINK_EPSILON).astype(jnp.float32))
        sums.update(sink_alpha1=first.sum((0, 2)), sink_count=sinks.sum((0, 2)))
        sums.update(sink_entries=jnp.full(first.shape[1], first.shape[0] * first.shape[2]))
    # the reservoir: this batch's content tokens [B L] with fresh uniform keys, merged with the kept ones
    keys, states = running.keys, running.states
    if keys.shape[0]:
        flat = h.transpose(1, 0, 2, 3).reshape(h.shape[1], -1, h.shape[-1])  # [layers, B L, d]
        keys = jnp.concatenate(
            [keys, jnp.where(content.reshape(-1), jax.random.uniform(key, flat.shape[1:2]), jnp.inf)]
        )
        _, keep = jax.lax.top_k(-keys, running.keys.shape[0])
        keys, states = keys[keep], jnp.concatenate([states, flat], axis=1)[:, keep]
    magnitude = jnp.where(m[..., None], jnp.abs(h), -jnp.inf)  # [B, layers, L, d], every real token
    where = jnp.argmax(jnp.max(magnitude, axis=0), axis=-2)  # [layers, d]: the position of each largest |h|
    largest = jnp.max(magnitude, axis=(0, 2))
    running = _Running(
        keys=keys,
        states=states,
        max_abs=jnp.maximum(running.max_abs, largest),
        max_position=jnp.where(largest > running.max_abs, where, running.max_position).astype(jnp.int32),
    )
    return stats.update(state, h, content), running, sums


def _corpus_measures(state, running):
    """The corpus columns of a state and the TwoNN dimension of the sampled tokens per layer (NaN with fewer than 3
    sampled: one compiled function rather than op-by-op dispatch of each finaliser)."""
    rogue, top = stats.rogue_dimensions(state), stats.massive_activation(state)
    measures = dict(
        isoscore=stats.isoscore(state),
        anisotropy=stats.anisotropy(state),
        anisotropy_centered=stats.anisotropy(state, centered=True),
        mean_cosine=stats.mean_cosine(state),
        rogue_top1_share=rogue.top1_share,
        rogue_top3_share=rogue.top3_share,
        max_abs=top.value,
        max_abs_dim=top.dimension,
        max_abs_position=top.position,
    )
    if running.keys.shape[0]:  # the sample's TwoNN: NaN while fewer than 3 tokens are in it
        sampled = jnp.isfinite(running.keys)
        twonn = jnp.full(running.states.shape[0], jnp.nan)
        if running.keys.shape[0] >= 3:
            mask = jnp.broadcast_to(sampled, running.states.shape[:2])
            twonn = jnp.where(sampled.sum() >= 3, metrics.twonn_dimension(running.states, mask=mask), jnp.nan)
        measures["twonn"] = twonn
    return measures


def _layers_array(hidden_states):
    """``[B, layers, L, d]`` from an array of that shape or a sequence of ``[B, L, d]`` arrays (one per layer)."""
    if isinstance(hidden_states, (list, tuple)):
        if not hidden_states:
            raise ValueError("hidden_states must hold at least one layer, got an empty sequence")
        return jnp.stack([jnp.asarray(h) for h in hidden_states], axis=1)
    h = jnp.asarray(hidden_states)
    if h.ndim != 4:
        raise ValueError(f"hidden_states must be [B, layers, L, d] or a sequence of [B, L, d], got shape {h.shape}")
    return h


def _massive_map(running: _Running) -> dict:
    """The :data:`MAP_DIMENSIONS` dimensions whose largest ``|h|`` over all real tokens is largest in some layer, ranked
    by it, with every layer's largest ``|h|`` in them and its token's position."""
    largest = np.asarray(running.max_abs, np.float64)  # [layers, d]
    dims = np.argsort(-largest.max(axis=0), kind="stable")[:MAP_DIMENSIONS]
    return {
        "tokens": "all real tokens, special tokens included",
        "dims": dims.tolist(),
        "max_abs": largest[:, dims].tolist(),
        "position": np.asarray(running.max_position)[:, dims].tolist(),
    }


def _attention_first(batch, shape) -> jax.Array | None:
    """The optional 4th element of a batch: α at the first real token ``[B, layers, heads]`` (or None); with one
    layer fewer than the states (whose layer 0 is the embedding output), NaN is put in front for layer 0."""
    if len(batch) < 4 or batch[3] is None:
        return None
    first = jnp.asarray(batch[3])
    if first.ndim != 3 or first.shape[0] != shape[0] or first.shape[1] not in (shape[1], shape[1] - 1):
        raise ValueError(
            f"first_attention must be [B, layers, heads] with B = {shape[0]} and layers = {shape[1]} (or "
            f"{shape[1] - 1}: one per block, the states' layer 0 being the embedding output), as "
            f"metrics.attention_sinks(probs).first gives for probs [B, layers, heads, L, L]; got {list(first.shape)}"
        )
    if first.shape[1] < shape[1]:
        first = jnp.concatenate([jnp.full((shape[0], 1, first.shape[2]), jnp.nan, first.dtype), first], axis=1)
    return first


def analyze_hidden_states(
    batches: Iterable, *, tokens_per_text: int | None = None, twonn_tokens: int = 2000, seed: int = 0
) -> dict:
    """Per-layer table and pooled singular-value CDF of hidden states from any source (module docstring).

    Args:
      batches: an iterable of ``(hidden_states, mask[, content[, first_attention]])``: ``hidden_states``
        ``[B, layers, L, d]`` or a sequence of ``[B, L, d]`` (one per layer), ``mask`` ``[B, L]`` bool (true = real
        token), ``content`` ``[B, L]`` bool (the tokens the corpus measures count; None or absent: ``mask``),
        ``first_attention`` ``[B, layers, heads]`` float (α at each text's first real token, the ``first`` of
        :func:`isojax.metrics.attention_sinks` on the attention probabilities; one layer fewer when layer 0 of the
        states is the embedding output, whose sink columns are then NaN; None or absent: no sink columns).
        Consumed once, one batch at a time: memory does not grow with the number of batches.
      tokens_per_text: count only the first K content tokens of each text in the corpus measures (None: all).
      twonn_tokens: the size of the uniform sample of content tokens (the same tokens in every layer) whose TwoNN
        dimension is the ``twonn`` column; 0 leaves the column out.
      seed: the seed of that sample.

    Returns:
      A JSON-ready dict: ``layers`` (0, 1, ...), one list per column of ``SENTENCE_COLUMNS`` and ``CORPUS_COLUMNS``
      (one value per layer; ``twonn`` NaN with fewer than 3 tokens sampled), ``SINK_COLUMNS`` when the batches carry
      ``first_attention`` (mean α₁ and Sink_0.3, the share of (text, head) with α₁ > 0.3, per layer),
      ``max_abs_dim`` and ``max_abs_position``, ``massive_map`` (``dims``: the dimensions holding the largest ``|h|``
      over all real tokens, special ones included; ``max_abs`` and ``position`` ``[layers][dims]``), ``cdf_grid``,
      ``cdf`` (one list per layer), ``num_texts``, ``num_sentence_texts`` (the texts of 2 or more tokens, which the
      sentence columns average), ``num_tokens`` (the content tokens counted), ``twonn_tokens`` (those sampled).
      ``ValueError`` when no text has 2 tokens or fewer than 2 content tokens are counted.

    Examples:
      Two texts of three layers of 4-dimensional states, the second text one token shorter:

      >>> import numpy as np
      >>> h = np.random.default_rng(0).normal(size=(2, 3, 5, 4)).astype(np.float32)
      >>> mask = np.array([[True] * 5, [True] * 4 + [False]])
      >>> table = analyze_hidden_states([(h, mask)])
      >>> table["layers"], table["num_texts"], table["num_tokens"], table["twonn_tokens"]
      ([0, 1, 2], 2, 9, 9)
      >>> 0 <= table["isoscore"][0] <= 1
      True
    """
    if not isinstance(twonn_tokens, int) or isinstance(twonn_tokens, bool) or twonn_tokens < 0:
        raise ValueError(f"twonn_tokens must be a non-negative int, got {twonn_tokens!r}")
    state = running = None
    with_sinks = False
    totals: dict[str, np.ndarray] = {}
    num_texts = 0
    key = jax.random.key(seed)
    for index, batch in enumerate(batches):
        if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3, 4):
            raise TypeError(
                "batches must yield (hidden_states, mask), (hidden_states, mask, content) or "
                "(hidden_states, mask, content, first_attention) tuples"
            )
        h = _layers_array(batch[0])
        mask = jnp.asarray(batch[1])
        if mask.shape != h.shape[:1] + h.shape[2:3] or mask.dtype != jnp.bool_:
            raise ValueError(
                f"mask must be a bool array of shape [B, L] = {h.shape[:1] + h.shape[2:3]}, got "
                f"{mask.dtype}{list(mask.shape)}"
            )
        content = mask if len(batch) == 2 or batch[2] is None else jnp.asarray(batch[2]) & mask
        if content.shape != mask.shape:
            raise ValueError(f"content must have the mask's shape {mask.shape}, got {content.shape}")
        first = _attention_first(batch, h.shape)
        if index and (first is not None) != with_sinks:
            raise ValueError(f"batch {index}: first_attention must be given with every batch or with none")
        with_sinks = first is not None
        if state is None:
            state, running = stats.init(h.shape[-1], layers=h.shape[1]), _start(h.shape[1], h.shape[-1], twonn_tokens)
        state, running, sums = jit_once(_fold, ("tokens_per_text",))(
            state, running, h, mask, content, first, jax.random.fold_in(key, index), tokens_per_text=tokens_per_text
        )
        for k, v in jax.device_get(sums).items():  # float64 running sums on the host
            totals[k] = totals.get(k, 0) + np.asarray(v, np.float64)
        num_texts += h.shape[0]
    if state is None or running is None:
        raise ValueError("batches is empty")
    paired = int(totals["paired"])
    if not paired:
        raise ValueError("every text has fewer than 2 tokens; the per-sentence measures need a pair of tokens")
    layers = len(totals["ev1"])
    result = {"num_texts": num_texts, "num_sentence_texts": paired, "layers": list(range(layers))}
    for name in SENTENCE_COLUMNS:
        result[name] = (totals[name] / paired).tolist()
    count = int(np.min(np.asarray(state.tokens)))
    if count < 2:
        raise ValueError(f"only {count} content tokens in the texts; corpus measures need at least 2")
    result["num_tokens"] = count
    result.update({k: np.asarray(v).tolist() for k, v in jit_once(_corpus_measures)(state, running).items()})
    result["twonn_tokens"] = int(np.isfinite(np.asarray(running.keys)).sum())
    if with_sinks:
        result["sink_alpha1"] = (totals["sink_alpha1"] / totals["sink_entries"]).tolist()
        result["sink_rate"] = (totals["sink_count"] / totals["sink_entries"]).tolist()
    result["massive_map"] = _massive_map(running)
    result["cdf_grid"] = CDF_GRID.tolist()
    result["cdf"] = (totals["cdf_counts"] / totals["n_valid"][:, None]).tolist()
    return result


def _content(ids, mask, *, special: tuple[int, ...]):
    return mask & ~jnp.isin(ids, jnp.asarray(special, ids.dtype)) if special else mask


@dataclasses.dataclass(frozen=True)
class _HiddenStates:
    """``reduce`` for :func:`isojax.eval.encode.encoded_batches`: every layer's states ``[B, layers, L, d]`` and,
    when the output carries attention probabilities, α at each text's first real token ``[B, layers, heads]``
    (:func:`isojax.metrics.attention_sinks`; equal and hashed by value, so the compiled forward is reused)."""

    def __call__(self, output, mask):
        states = jnp.stack(output.hidden_states, axis=1)
        if output.attentions is None:
            return states, None
        return states, metrics.attention_sinks(jnp.stack(output.attentions, axis=1), mask=mask).first  # per block


def hidden_state_batches(
    module,
    params,
    tokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int = 128,
    progress: bool = False,
    attention_sinks: bool | None = None,
):
    """The batches ``(hidden_states [B, layers, L, d], mask [B, L], content [B, L], first_attention)`` of an isojax
    model on ``texts`` for :func:`analyze_hidden_states` (length-sorted; ``content`` leaves out the tokenizer's
    special tokens, e.g. [CLS] and [SEP]; ``first_attention`` ``[B, layers, heads]`` is α at each text's first real
    token, computed in the forward from the attention probabilities, or None). A generator: one batch is computed
    when the consumer asks for it.

    Args:
      module: an encoder or causal LM (as :func:`isojax.from_pretrained` returns it).
      params: its params.
      tokenizer: its Hugging Face tokenizer.
      texts: strings (a single ``str`` is a ``TypeError``).
      batch_size: texts per batch, as for :func:`isojax.eval.encode`.
      max_length: texts are truncated to this many tokens, as for :func:`isojax.eval.encode`.
      progress: show a progress bar.
      attention_sinks: compute ``first_attention`` (None: for a causal LM, whose sinks Gu et al. measure).

    Returns:
      A generator of ``(hidden_states, mask, content, first_attention)`` device arrays, one tuple per batch.

    Examples:
      >>> from isojax.models import from_pretrained
      >>> module, params, tokenizer = from_pretrained("default")
      >>> h, mask, content, first = next(hidden_state_batches(module, params, tokenizer, ["A cat sits."]))
      >>> h.shape  # 7 layers of a batch of 1 text padded to 16 tokens
      (1, 7, 16, 384)
      >>> mask[0, :7].tolist(), content[0, :7].tolist()  # [CLS] a cat sits . [SEP] <pad>
      ([True, True, True, True, True, True, False], [False, True, True, True, True, False, False])
    """
    special = tuple(sorted(int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ()))
    if attention_sinks is None:
        attention_sinks = model_kind(module.config) == "causal_lm"
    for _, ids, mask, (h, first) in encoded_batches(
        module,
        params,
        tokenizer,
        texts,
        reduce=_HiddenStates(),
        batch_size=batch_size,
        max_length=max_length,
        progress=progress,
        desc="analyzing layers",
        output_attentions=attention_sinks,
    ):
        yield h, mask, jit_once(_content, ("special",))(ids, mask, special=special), first


def analyze_layers(
    module,
    params,
    tokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int = 128,
    tokens_per_text: int | None = None,
    progress: bool = False,
    attention_sinks: bool | None = None,
    twonn_tokens: int = 2000,
) -> dict:
    """Per-layer table and pooled singular-value CDF of an isojax model on ``texts``: :func:`analyze_hidden_states`
    of :func:`hidden_state_batches` (see the module docstring).

    Args:
      module: an encoder or causal LM (as :func:`isojax.from_pretrained` returns it).
      params: its params.
      tokenizer: its Hugging Face tokenizer.
      texts: strings (a single ``str`` is a ``TypeError``).
      batch_size: texts per batch, as for :func:`isojax.eval.encode`.
      max_length: texts are truncated to this many tokens, as for :func:`isojax.eval.encode`.
      tokens_per_text: count only the first K content tokens of each text in the corpus measures (None: all).
      progress: show a progress bar.
      attention_sinks: the sink columns (None: for a causal LM), as :func:`hidden_state_batches`.
      twonn_tokens: content tokens sampled for the TwoNN column (0: none), as :func:`analyze_hidden_states`.

    Returns:
      The dict of :func:`analyze_hidden_states` (``num_texts`` = ``len(texts)``).

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
    if tokens_per_text is not None and (
        not isinstance(tokens_per_text, int) or isinstance(tokens_per_text, bool) or tokens_per_text < 1
    ):
        raise ValueError(f"tokens_per_text must be None or a positive int, got {tokens_per_text!r}")
    batches = hidden_state_batches(
        module,
        params,
        tokenizer,
        texts,
        batch_size=batch_size,
        max_length=max_length,
        progress=progress,
        attention_sinks=attention_sinks,
    )
    return analyze_hidden_states(batches, tokens_per_text=tokens_per_text, twonn_tokens=twonn_tokens)


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
    "massive_ratio": "max/med",
    "mean_cosine": "mean cos",
    "rogue_top1_share": "rogue1",
    "rogue_top3_share": "rogue3",
    "max_abs": "max |h|",
    "twonn": "TwoNN",
    "sink_alpha1": "α₁",
    "sink_rate": "Sink_0.3",
}


def format_table(result: dict) -> str:
    """The per-layer table of :func:`analyze_layers` as aligned text.

    Args:
      result: an :func:`analyze_layers` dict (or one with ``layers`` and any of its columns: one value per layer).

    Returns:
      a ``str``: a header row (``layer`` and the columns of ``SENTENCE_COLUMNS``, ``CORPUS_COLUMNS`` then
      ``SINK_COLUMNS`` that ``result`` holds, each right-aligned in 9 characters), a rule, and one row per layer with 4 decimals.

    Examples:
      >>> print(format_table({"layers": [0, 1], "ev1": [0.5, 0.25], "isoscore": [0.125, 1.0]}))
      layer      EV_1  IsoScore
      -------------------------
          0    0.5000    0.1250
          1    0.2500    1.0000
    """
    columns = [c for c in (*SENTENCE_COLUMNS, *CORPUS_COLUMNS, *SINK_COLUMNS) if c in result]
    head = f"{'layer':>5} " + " ".join(f"{_HEADERS[c]:>9}" for c in columns)
    rows = [head, "-" * len(head)]
    for i, layer in enumerate(result["layers"]):
        rows.append(f"{layer:>5} " + " ".join(f"{result[c][i]:>9.4f}" for c in columns))
    return "\n".join(rows)


def plot_layers(result: dict, path: str, *, title: str = "", columns: Sequence[str] = LAYER_CURVES) -> str:
    """Per-layer curves of the uniformity and isotropy measures, saved as a 780 × 540 PNG (6.5 × 4.5 in at 120 dpi).

    One line per measure of ``columns`` (default TokenUni, EV_1, median σ̃, IsoScore, raw and centered anisotropy)
    against the layer.

    Args:
      result: an :func:`analyze_layers` dict (``layers`` and the columns plotted).
      path: the PNG file to write (its directory must exist).
      title: the plot title; ``""``: "Uniformity and isotropy per layer".
      columns: the keys of ``result`` to plot, one value per layer each.

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
    for c in columns:
        ax.plot(result["layers"], result[c], marker="o", label=_HEADERS.get(c, c))
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


__all__ = [
    "analyze_hidden_states",
    "analyze_layers",
    "format_table",
    "hidden_state_batches",
    "plot_cdf",
    "plot_layers",
    "save_json",
]
