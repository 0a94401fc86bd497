"""Greedy and beam-search decoding under ``jit``, with a key/value cache, for GPT-2 and BART / mBART.

The decoding loop is a ``jax.lax.while_loop`` over fixed-size arrays, so :func:`generate` compiles once per input
shape and settings and never retraces per step. The cache is an explicit pytree (:class:`~isojax.models.cache.Cache`)
of ``max_length`` slots: the prompt (GPT-2) or the decoder start token (BART) fills the first slots, each step appends
one token's keys and values and attends over all slots, the unwritten ones masked. BART's cross-attention keys and
values are computed from the encoder output once. Beam search reorders the self-attention cache by the surviving
beams' parents (the cross-attention cache is the same for every beam of an input and is left as it is).

The results are those of transformers' ``generate`` (checked against it for GPT-2, BART and mBART) with these
settings, whose defaults come from the model's ``config.json`` as transformers reads them
(``generation_config.json`` is not read)::

    max_length            length of the returned sequences, prompt (GPT-2) or decoder start token (BART) included
    num_beams             1: greedy; > 1: beam search (transformers' vectorised beam search, 2 * num_beams
                          candidates per step, finished hypotheses kept apart)
    length_penalty        a finished hypothesis scores  sum log p / (generated length) ** length_penalty
    early_stopping        False (transformers' heuristic), True (stop once num_beams hypotheses finished), "never"
    eos_token_id          ends a sequence; later positions hold pad_token_id (default: eos_token_id)
    decoder_start_token_id  BART's first decoder token (default: bos_token_id, as transformers)
    forced_bos_token_id   forced as the token after the first one (mBART's target language code)
    forced_eos_token_id   forced as the last token when max_length is reached (BART's config: 2)

Not implemented: sampling, min_length, no_repeat_ngram_size, repetition penalties, num_return_sequences > 1.

GPT-2 prompts are a padded batch ``[B, P]`` with their attention mask. transformers needs them left-padded; here
any padding (right, left, or holes) is first moved to the left, keeping each prompt's tokens in order, and position
ids follow the mask (``cumsum(mask) - 1``), as transformers makes them for left-padded prompts. The returned
sequences hold the left-padded prompt, then the generated tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, cast

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from isojax.models.cache import Cache, init_cache
from isojax.models.config import TransformerConfig
from isojax.models.inputs import validate_inputs
from isojax.models.registry import model_kind, require_kind

Array = jax.Array
EARLY_STOPPING = (False, True, "never")
_NEG = -1.0e9  # transformers' "impossible" score for beams


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Decoding settings (see the module docstring); :func:`generation_config` fills them for a model and checks them.

    Attributes:
      max_length: length of the returned sequences, the prompt (GPT-2) or the decoder start token (BART) included.
      num_beams: 1: greedy; > 1: beam search with that many beams.
      length_penalty: a finished hypothesis scores ``sum log p / (generated length) ** length_penalty``.
      early_stopping: one of :data:`EARLY_STOPPING`: ``False`` (transformers' heuristic), ``True`` (stop once
        ``num_beams`` hypotheses finished) or ``"never"``.
      eos_token_id: the token that ends a sequence; ``None``: none does (decoding runs to ``max_length``).
      pad_token_id: fills the positions after a sequence's end.
      decoder_start_token_id: an encoder-decoder's first decoder token.
      forced_bos_token_id: forced as the token after the first one (mBART's target language code); ``None``: none.
      forced_eos_token_id: forced as the last token when ``max_length`` is reached; ``None``: none.
    """

    max_length: int = 20
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    decoder_start_token_id: int | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None


@flax.struct.dataclass
class GenerateOutput:
    """What :func:`generate` returns (a pytree).

    Attributes:
      sequences: ``[B, max_length]`` int32: the left-aligned prompt (GPT-2) or the decoder start token (BART), then the
        generated tokens; positions after a sequence's end hold ``pad_token_id``.
      scores: ``[B]`` float32, beam search only (else ``None``): the best hypothesis's length-penalised
        log-probability (transformers' ``sequences_scores``).
    """

    sequences: Array
    scores: Array | None = None


def generation_config(config: TransformerConfig, **overrides) -> GenerationConfig:
    """The decoding settings for the model of ``config``, checked.

    The special token ids come from ``config`` (``pad_token_id`` defaults to ``eos_token_id``,
    ``decoder_start_token_id`` to ``bos_token_id``, as in transformers), then ``overrides`` replace any field.

    Args:
      config: the model's config (a causal LM or an encoder-decoder).
      overrides: :class:`GenerationConfig` fields; an unknown name is a ``TypeError``.

    Returns:
      a :class:`GenerationConfig`. A setting out of range raises ``ValueError`` naming it: a token id outside
      ``[0, vocab_size)``, ``num_beams < 1``, an ``early_stopping`` not in :data:`EARLY_STOPPING`, a ``max_length``
      outside ``[2, decoder positions]``, no pad token, or no decoder start token for an encoder-decoder.

    Examples:
      A config without a pad token pads with its end token:

      >>> config = TransformerConfig(model_type="gpt2", vocab_size=10, max_position_embeddings=32, eos_token_id=2,
      ...                            pad_token_id=None)
      >>> gen = generation_config(config, num_beams=4)
      >>> gen.max_length, gen.num_beams, gen.eos_token_id, gen.pad_token_id
      (20, 4, 2, 2)
      >>> generation_config(config, max_length=33)
      Traceback (most recent call last):
      ValueError: max_length=33 must lie in [2, 32], the positions of this gpt2 model's decoder
      >>> generation_config(config, eos_token_id=10)
      Traceback (most recent call last):
      ValueError: eos_token_id=10 must be a token id in [0, 10) (one id; lists of end tokens are not supported)
    """
    fields = {f.name for f in dataclasses.fields(GenerationConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"unknown generation settings {unknown}; expected some of {sorted(fields)}")
    settings: dict[str, Any] = dict(
        eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        forced_bos_token_id=config.forced_bos_token_id,
        forced_eos_token_id=config.forced_eos_token_id,
    )
    settings.update(overrides)
    if settings.get("pad_token_id") is None:
        settings["pad_token_id"] = config.pad_token_id if config.pad_token_id is not None else settings["eos_token_id"]
    if settings["decoder_start_token_id"] is None:
        settings["decoder_start_token_id"] = config.bos_token_id
    out = GenerationConfig(**settings)
    for name in (
        "eos_token_id",
        "pad_token_id",
        "decoder_start_token_id",
        "forced_bos_token_id",
        "forced_eos_token_id",
    ):
        value = getattr(out, name)
        if value is not None and not (isinstance(value, (int, np.integer)) and 0 <= value < config.vocab_size):
            raise ValueError(
                f"{name}={value!r} must be a token id in [0, {config.vocab_size}) (one id; lists of "
                "end tokens are not supported)"
            )
    if not (isinstance(out.num_beams, int) and out.num_beams >= 1):
        raise ValueError(f"num_beams must be an integer >= 1, got {out.num_beams!r}")
    if out.early_stopping not in EARLY_STOPPING:
        raise ValueError(f"early_stopping must be one of {EARLY_STOPPING}, got {out.early_stopping!r}")
    decoder = config.decoder_config() if config.decoder_layers else config
    if not 2 <= out.max_length <= decoder.max_sequence_length:
        raise ValueError(
            f"max_length={out.max_length} must lie in [2, {decoder.max_sequence_length}], the positions "
            f"of this {config.model_type} model's decoder"
        )
    if out.pad_token_id is None:
        raise ValueError("pad_token_id is needed (the model config has neither pad_token_id nor eos_token_id)")
    if config.decoder_layers and out.decoder_start_token_id is None:
        raise ValueError(
            "decoder_start_token_id is needed for an encoder-decoder (the model config has neither "
            "decoder_start_token_id nor bos_token_id)"
        )
    return out


def generate(module, params, input_ids, attention_mask=None, *, collections=None, **settings) -> GenerateOutput:
    """Decode from a GPT-2 prompt or a BART / mBART source batch, greedily or with beam search (jit-compiled).

    Args:
      module: a causal LM or encoder-decoder from :func:`isojax.from_pretrained`, or a module that wraps one with
        the same ``config``, ``dtype`` and ``encode`` / ``decode`` methods (a flow-calibrated
        :class:`isojax.train.tasks.seq2seq.Seq2SeqModel`).
      params: the module's params.
      input_ids: ``[B, P]`` prompt (GPT-2, any padding) or source (BART) token ids.
      attention_mask: optional ``[B, P]`` (true = real token; default all).
      collections: the module's variable collections besides ``params`` (the wrapper's flow ``constants``).
      settings: :class:`GenerationConfig` fields (``max_length``, ``num_beams``, ``length_penalty``, ...); the
        rest come from :func:`generation_config`.

    Returns:
      :class:`GenerateOutput` with ``sequences [B, max_length]`` int32 (and ``scores [B]`` under beam search).
      A model that is not a causal LM or an encoder-decoder, a bad setting (see :func:`generation_config`), a row
      without real tokens or a prompt as long as ``max_length`` is a ``ValueError``.

    Examples:
      Greedy decoding from a tiny random GPT-2 (weights scaled up so that its choices vary): each generated token
      is the argmax of the uncached forward pass over the tokens before it:

      >>> from isojax.models import TransformerConfig, build_model, init_params
      >>> config = TransformerConfig(model_type="gpt2", vocab_size=10, hidden_size=8, num_hidden_layers=1,
      ...                            num_attention_heads=2, intermediate_size=16, max_position_embeddings=16,
      ...                            type_vocab_size=0, pre_norm=True, embedding_norm=False)
      >>> module = build_model(config)
      >>> params = jax.tree.map(lambda w: 8 * w, init_params(module, jax.random.key(1)))
      >>> out = generate(module, params, jnp.array([[1, 2], [3, 4]]), max_length=6)
      >>> out.sequences.tolist()
      [[1, 2, 9, 8, 1, 1], [3, 4, 1, 7, 7, 7]]
      >>> logits = jax.jit(module.apply)({"params": params}, out.sequences).logits  # [2, 6, 10]
      >>> bool((logits[:, 1:-1].argmax(-1) == out.sequences[:, 2:]).all())
      True
    """
    config = module.config
    require_kind(config, ("causal_lm", "encoder_decoder"), "generate")
    gen = generation_config(config, **settings)
    ids, mask, _ = validate_inputs(config, input_ids, attention_mask, None)
    if not isinstance(mask, jax.core.Tracer) and not bool(jnp.all(mask.any(-1))):
        raise ValueError("every input sequence needs at least one real token (attention_mask row of zeros)")
    if model_kind(config) == "causal_lm" and ids.shape[1] >= gen.max_length:
        raise ValueError(f"max_length={gen.max_length} leaves no room after the prompt of length {ids.shape[1]}")
    return jax.jit(_decode, static_argnums=(0, 1))(module, gen, {"params": params, **(collections or {})}, ids, mask)


def left_align(ids: Array, mask: Array) -> tuple[Array, Array]:
    """Move each row's padding to its left, keeping the real tokens in order (a stable sort of the mask).

    Args:
      ids: ``[B, P]`` token ids.
      mask: ``[B, P]`` bool, true at real tokens (padding anywhere: right, left or holes).

    Returns:
      ``(ids, mask)``, both ``[B, P]`` with the dtypes of the inputs: each row's padded positions first, then its real
      tokens in their original order.

    Examples:
      >>> ids = jnp.array([[5, 6, 0, 0], [0, 7, 0, 8]])
      >>> aligned, mask = left_align(ids, ids > 0)
      >>> aligned.tolist(), mask.astype(int).tolist()
      ([[0, 0, 5, 6], [0, 0, 7, 8]], [[0, 0, 1, 1], [0, 0, 1, 1]])
    """
    order = jnp.argsort(mask, axis=1, stable=True)  # False (padding) first
    return jnp.take_along_axis(ids, order, axis=1), jnp.take_along_axis(mask, order, axis=1)


def _decode(module, gen: GenerationConfig, variables, ids, mask) -> GenerateOutput:
    """Prefill, then the greedy or beam loop; ``module`` and ``gen`` are static (jitted by :func:`generate`: one compilation per shape)."""
    apply = functools.partial(module.apply, variables)
    batch, length = ids.shape[0], gen.max_length
    if model_kind(module.config) == "causal_lm":
        prompt, mask = left_align(ids, mask)
        out = apply(prompt, mask, cache=init_cache(module.config, batch, length, module.dtype))
        context = (None, None)

        def step(tokens, cache, memory, memory_mask):
            return apply(tokens[:, None], cache=cache)
    else:
        memory = apply(ids, mask, method="encode").last_hidden_state
        prompt = jnp.full((batch, 1), cast(int, gen.decoder_start_token_id), jnp.int32)  # generation_config checks it
        cache = init_cache(module.config.decoder_config(), batch, length, module.dtype)
        out = apply(prompt, memory, mask, cache=cache, method="decode")
        context = (memory, mask)

        def step(tokens, cache, memory, memory_mask):
            return apply(tokens[:, None], memory, memory_mask, cache=cache, method="decode")

    search = _greedy if gen.num_beams == 1 else _beam_search
    return search(gen, step, prompt, out.logits[:, -1], out.cache, context)


def _process(gen: GenerationConfig, scores: Array, cur_len) -> Array:
    """transformers' forced-token logits processors: every score -inf but the forced token's 0, for
    ``forced_bos_token_id`` at length 1 and ``forced_eos_token_id`` at length ``max_length - 1`` (applied in
    that order)."""
    for token, at in ((gen.forced_bos_token_id, 1), (gen.forced_eos_token_id, gen.max_length - 1)):
        if token is not None:
            forced = jnp.full(scores.shape[-1], -jnp.inf, scores.dtype).at[token].set(0.0)
            scores = jnp.where(cur_len == at, forced, scores)
    return scores


def _write(sequences: Array, tokens: Array, cur_len) -> Array:
    """``sequences[..., cur_len] = tokens``."""
    return jnp.where(jnp.arange(sequences.shape[-1]) == cur_len, tokens[..., None], sequences)


def _greedy(gen, step, prompt, logits, cache, context) -> GenerateOutput:
    batch, start = prompt.shape
    sequences = jnp.full((batch, gen.max_length), gen.pad_token_id, jnp.int32).at[:, :start].set(prompt)

    def body(state):
        cur_len, sequences, unfinished, logits, cache = state
        tokens = jnp.argmax(_process(gen, logits, cur_len), axis=-1).astype(jnp.int32)
        if gen.eos_token_id is not None:
            tokens = jnp.where(unfinished, tokens, gen.pad_token_id)
            unfinished = unfinished & (tokens != gen.eos_token_id)
        out = step(tokens, cache, *context)
        return cur_len + 1, _write(sequences, tokens, cur_len), unfinished, out.logits[:, -1], out.cache

    def cond(state):
        cur_len, _, unfinished, _, _ = state
        return (cur_len < gen.max_length) & jnp.any(unfinished)

    state = (jnp.asarray(start, jnp.int32), sequences, jnp.ones(batch, bool), logits, cache)
    return GenerateOutput(jax.lax.while_loop(cond, body, state)[1])


@flax.struct.dataclass
class _Beams:
    """Beam-search state, ``B`` inputs x ``K`` beams (transformers' names)."""

    cur_len: Array
    running_sequences: Array  # [B, K, T]
    running_scores: Array  # [B, K] summed log-probabilities of the live beams
    sequences: Array  # [B, K, T] finished hypotheses
    scores: Array  # [B, K] their length-penalised scores
    is_finished: Array  # [B, K]
    improvable: Array  # [B, 1] the live beams may still beat a finished one
    hits_stop: Array  # [B, 2K] the last step's candidates that ended (EOS or max_length)
    logits: Array  # [B * K, V] next-token logits of the live beams
    cache: Cache


def _beam_search(gen, step, prompt, logits, cache, context) -> GenerateOutput:
    batch, start = prompt.shape
    k, length, penalty = gen.num_beams, gen.max_length, gen.length_penalty
    keep = 2 * k  # candidates per step: enough live ones even when the best k all end

    def per_beam(x):
        return jnp.repeat(x, k, axis=0)

    cache = cache.replace(layers=jax.tree.map(per_beam, cache.layers), mask=per_beam(cache.mask))
    context = tuple(None if x is None else per_beam(x) for x in context)
    running = jnp.full((batch, k, length), gen.pad_token_id, jnp.int32).at[:, :, :start].set(prompt[:, None])

    def gather(x, index):  # x [B, N, ...], index [B, M] -> [B, M, ...]
        return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)

    def body(s: _Beams) -> _Beams:
        log_probs = _process(gen, jax.nn.log_softmax(s.logits.astype(jnp.float32), axis=-1), s.cur_len)
        vocab = log_probs.shape[-1]
        totals = (log_probs.reshape(batch, k, vocab) + s.running_scores[:, :, None]).reshape(batch, k * vocab)
        top_scores, top_index = jax.lax.top_k(totals, keep)
        parents, tokens = top_index // vocab, (top_index % vocab).astype(jnp.int32)
        candidates = _write(gather(s.running_sequences, parents), tokens, s.cur_len)  # [B, 2K, T]
        hits = s.cur_len + 1 >= length
        if gen.eos_token_id is not None:
            hits = hits | (tokens == gen.eos_token_id)
        hits = jnp.broadcast_to(hits, tokens.shape)
        # the best k candidates that did not end live on
        live_scores = top_scores + hits * _NEG
        live = jax.lax.top_k(live_scores, k)[1]
        running_sequences, running_scores = gather(candidates, live), gather(live_scores, live)
        # candidates among the best k that ended compete with the finished hypotheses
        ended = hits & (jnp.arange(keep) < k)
        finished_scores = top_scores / (s.cur_len + 1 - start).astype(jnp.float32) ** penalty
        if gen.early_stopping is True:
            finished_scores += jnp.all(s.is_finished, axis=-1, keepdims=True) * _NEG
        finished_scores += ~s.improvable * _NEG + ~ended * _NEG
        merged_scores = jnp.concatenate([s.scores, finished_scores], axis=1)
        best = jax.lax.top_k(merged_scores, k)[1]
        sequences = gather(jnp.concatenate([s.sequences, candidates], axis=1), best)
        is_finished = gather(jnp.concatenate([s.is_finished, ended], axis=1), best)
        scores = gather(merged_scores, best)
        # the live beams' cache rows follow their parents; then one step on their new tokens
        rows = (gather(parents, live) + jnp.arange(batch)[:, None] * k).reshape(-1)
        cache = dataclasses.replace(
            s.cache,
            layers=tuple(
                dataclasses.replace(layer, attention=jax.tree.map(lambda a: a[rows], layer.attention))
                for layer in s.cache.layers
            ),
        )
        out = step(running_sequences[:, :, s.cur_len].reshape(-1), cache, *context)
        cur_len = s.cur_len + 1
        best_length = length - start if gen.early_stopping == "never" and penalty > 0 else cur_len - start
        best_possible = running_scores[:, :1] / jnp.asarray(best_length, jnp.float32) ** penalty
        worst_finished = jnp.where(is_finished, jnp.min(scores, axis=1, keepdims=True), _NEG)
        improvable = s.improvable & jnp.any(best_possible > worst_finished, axis=-1, keepdims=True)
        return _Beams(
            cur_len,
            running_sequences,
            running_scores,
            sequences,
            scores,
            is_finished,
            improvable,
            hits,
            out.logits[:, -1],
            out.cache,
        )

    def cond(s: _Beams):
        go_on = jnp.any(s.improvable) & ~jnp.all(s.hits_stop) & (s.cur_len < length)
        if gen.early_stopping is True:
            go_on = go_on & ~jnp.all(s.is_finished)
        return go_on

    state = _Beams(
        cur_len=jnp.asarray(start, jnp.int32),
        running_sequences=running,
        running_scores=jnp.zeros((batch, k), jnp.float32).at[:, 1:].set(_NEG),
        sequences=running,
        scores=jnp.full((batch, k), _NEG, jnp.float32),
        is_finished=jnp.zeros((batch, k), bool),
        improvable=jnp.ones((batch, 1), bool),
        hits_stop=jnp.zeros((batch, keep), bool),
        logits=per_beam(logits),
        cache=cache,
    )
    final = jax.lax.while_loop(cond, body, state)
    return GenerateOutput(final.sequences[:, 0], final.scores[:, 0])


__all__ = ["EARLY_STOPPING", "GenerateOutput", "GenerationConfig", "generate", "generation_config", "left_align"]
