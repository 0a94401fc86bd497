"""The transformer parts every isojax model shares, written once.

One block, for hidden states ``x`` of shape ``[B, L, H]``. Each sublayer ``f`` (self-attention; cross-attention to
an encoder's output in a decoder; feed-forward) is wrapped post-LayerNorm (Devlin et al. 2019; BERT, BART) or
pre-LayerNorm (GPT-2, mBART; ``config.pre_norm``)::

    post-LN:  x = LayerNorm(x + Dropout(f(x)))
    pre-LN:   x = x + Dropout(f(LayerNorm(x)))        (the stack then ends with a LayerNorm, "final_norm")

    self-attention   softmax(q kᵀ / sqrt(H/heads) + bias + mask) v, projected   "attention", "attention_norm"
    cross-attention  the same, keys and values from the encoder output         "cross_attention", "cross_attention_norm"
    feed-forward     W_out Dropout(act(W_in x))                                 "intermediate", "output", "output_norm"

The mask says which keys a query sees: the real tokens (an encoder), the real tokens at or before its own position
(a ``causal`` stack, a decoder), the encoder's real tokens (cross-attention). Incremental decoding appends each new
token's keys and values to a :class:`Cache` instead of recomputing the prefix.

Parameter names are canonical across architectures; each architecture file maps them to its Hugging Face names.
:data:`PARTITION_RULES` says how each of these parameters is laid out over a ``("data", "model")`` mesh.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from isojax.models.config import EncoderConfig

Array = jax.Array

WORD_EMBEDDINGS = ("embeddings", "word_embeddings", "embedding")
"""Path of the word (input, and tied output) embedding matrix ``[vocab_size, embedding_size]`` in the params of every
architecture (BART's table shared by encoder and decoder included)."""

TRANSFORM = "last_layer_transform"
"""Params key of the optional last-layer transform (e.g. SoftDecay's ``theta``)."""

TRANSFORM_PLACEMENTS = ("output", "block")
"""Where the last-layer transform acts: on the last layer's output, or inside the last block (see EncoderModel)."""

# Megatron-style tensor parallelism over the mesh axis "model": query/key/value and the feed-forward input
# projection split by output features (whole heads per device), the two output projections by input
# features (each device adds its partial product; XLA inserts the reduction); everything else replicated.
# (regex searched in the "/"-joined parameter path, PartitionSpec); every parameter of these modules matches.
PARTITION_RULES: tuple[tuple[str, P], ...] = (
    (r"attention/(query|key|value)/kernel$", P(None, "model")),
    (r"attention/(query|key|value)/bias$", P("model")),
    (r"attention/output/kernel$", P("model", None)),
    (r"intermediate/kernel$", P(None, "model")),
    (r"intermediate/bias$", P("model")),
    (r"(?<!attention/)output/kernel$", P("model", None)),
    (r"(^|/)output/bias$", P()),
    (r"(attention_norm|output_norm|embeddings/norm|final_norm)/(scale|bias)$", P()),
    (r"embeddings/\w+_embeddings/embedding$", P()),
    (r"embeddings/projection/(kernel|bias)$", P()),
    (r"pooler/dense/(kernel|bias)$", P()),
    (rf"(^|/){TRANSFORM}/", P()),
)

ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_fast": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}


@flax.struct.dataclass
class EncoderOutput:
    """What an encoder returns.

    last_hidden_state: ``[B, L, H]`` output of the last layer (after the optional last-layer transform; after
      the final LayerNorm in a pre-LN stack).
    hidden_states: arrays ``[B, L, H]``: the embedding output, then the output of every block that ran
      (``num_hidden_layers + 1`` of them; ALBERT with ``inner_group_num > 1`` records each inner block, as
      Hugging Face does).
    attentions: per layer ``[B, heads, L, L]`` attention probabilities, or None unless asked for.
    pooler_output: ``[B, H]`` = tanh(W h_[CLS] + b) where the architecture has a pooler, else None.
    """

    last_hidden_state: Array
    hidden_states: tuple[Array, ...]
    attentions: tuple[Array, ...] | None = None
    pooler_output: Array | None = None


@flax.struct.dataclass
class DecoderOutput:
    """What a decoder returns (GPT-2; the decoder of BART / mBART).

    logits: ``[B, L, vocab_size]`` float32 next-token scores: the LM head tied to the word embeddings
      (:func:`tied_logits`), plus BART's ``final_logits_bias``.
    last_hidden_state, hidden_states, attentions: as in :class:`EncoderOutput` (``L`` new tokens; with a cache the
      attention probabilities run over its ``T`` slots).
    cross_attentions: per layer ``[B, heads, L, S]`` attention probabilities over the encoder output
      (encoder-decoder, when asked for), else None.
    cache: the updated :class:`Cache` when one was given, else None.
    """

    logits: Array
    last_hidden_state: Array
    hidden_states: tuple[Array, ...]
    attentions: tuple[Array, ...] | None = None
    cross_attentions: tuple[Array, ...] | None = None
    cache: Any = None


@flax.struct.dataclass
class Seq2SeqOutput:
    """What an encoder-decoder returns: the encoder's :class:`EncoderOutput` and the decoder's :class:`DecoderOutput`."""

    encoder: EncoderOutput
    decoder: DecoderOutput

    @property
    def logits(self) -> Array:
        """The decoder's ``[B, L, vocab_size]`` logits."""
        return self.decoder.logits


@flax.struct.dataclass
class KVCache:
    """Keys and values of one attention layer, each ``[B, T, heads, head_dim]``."""

    key: Array
    value: Array


@flax.struct.dataclass
class LayerCache:
    """What one decoder block keeps between decoding steps: its self-attention keys and values over the cache's
    ``T`` slots, and (encoder-decoder) the keys and values of the encoder output, computed on the first call."""

    attention: KVCache
    cross_attention: KVCache | None = None


@flax.struct.dataclass
class Cache:
    """Key/value cache of a decoder stack for incremental decoding (an explicit pytree, passed in and returned).

    layers: one :class:`LayerCache` per layer.
    mask: ``[B, T]`` bool, whether a slot holds a real token (a prompt's padding stays False).
    index: int32 scalar; slots ``[0, index)`` are written, the next ``L`` tokens go to ``[index, index + L)``.
    """

    layers: tuple[LayerCache, ...]
    mask: Array
    index: Array


def init_cache(config: EncoderConfig, batch_size: int, length: int, dtype: Any = jnp.float32) -> Cache:
    """An empty :class:`Cache` of ``length`` slots for the stack of ``config`` (keys/values in ``dtype``, the
    compute dtype of the model that fills it)."""
    heads = config.num_attention_heads
    shape = (batch_size, length, heads, config.hidden_size // heads)
    layer = LayerCache(KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)))
    return Cache((layer,) * config.num_hidden_layers, jnp.zeros((batch_size, length), bool), jnp.zeros((), jnp.int32))


def dense(features: int, config: EncoderConfig, dtype, name: str) -> nn.Dense:
    """A Dense layer with BERT's initialisation N(0, initializer_range^2)."""
    return nn.Dense(features, dtype=dtype, kernel_init=nn.initializers.normal(config.initializer_range), name=name)


def layer_norm(config: EncoderConfig, dtype, name: str) -> nn.LayerNorm:
    """LayerNorm with the checkpoint's epsilon; statistics are always computed in float32."""
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=dtype, name=name)


def word_embeddings(params):
    """The word (input = tied output) embedding matrix ``[vocab_size, embedding_size]`` of a model's params."""
    for key in WORD_EMBEDDINGS:
        params = params[key]
    return params


def tied_logits(params, h: Array) -> Array:
    """The language-model head tied to the word embeddings: ``h Wᵀ``, ``[..., H] -> [..., vocab_size]`` float32
    (``W`` = :func:`word_embeddings` of ``params``, cast to the compute dtype of ``h``)."""
    w = word_embeddings(params)
    return jnp.einsum("...h,vh->...v", h, w.astype(h.dtype), preferred_element_type=jnp.float32)


class Embed(nn.Module):
    """An embedding table ``[num, features]`` whose lookup never clamps silently.

    JAX clamps out-of-range gather indices; here an out-of-range id yields NaN rows instead (under ``jit``,
    where the ids cannot be checked eagerly). Eager calls are checked by :func:`validate_inputs` first.
    """

    num_embeddings: int
    features: int
    init_std: float = 0.02
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, ids: Array) -> Array:
        table = self.param("embedding", nn.initializers.normal(self.init_std), (self.num_embeddings, self.features))
        return jnp.take(table, ids, axis=0, mode="fill", fill_value=jnp.nan).astype(self.dtype)


class WordEmbeddings(nn.Module):
    """A word-embedding table on its own, ``word_embeddings`` (BART's, shared by its encoder and decoder):
    ``ids [B, L] -> [B, L, H]``, times ``sqrt(hidden_size)`` when ``config.scale_embedding``."""

    config: EncoderConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, ids: Array) -> Array:
        cfg = self.config
        x = Embed(cfg.vocab_size, cfg.hidden_size, cfg.initializer_range, self.dtype, name="word_embeddings")(ids)
        return x * float(np.sqrt(cfg.hidden_size)) if cfg.scale_embedding else x


class Embeddings(nn.Module):
    """Token + position (+ token-type) embeddings, LayerNorm, dropout: ``ids [B, L] -> [B, L, H]``.

    Tables are ``embedding_size`` wide; ALBERT (``config.embedding_projection``) then projects to ``hidden_size``.
    GPT-2 (``config.embedding_norm`` False) has no LayerNorm here. Subclasses override :meth:`position_ids`
    (RoBERTa counts positions after the padding index).
    """

    config: EncoderConfig
    dtype: Any = jnp.float32

    def position_ids(self, input_ids: Array) -> Array:
        """``position_offset + 0, 1, ..., L-1`` for every sequence (BART's positions start at 2)."""
        return jnp.broadcast_to(jnp.arange(input_ids.shape[1]) + self.config.position_offset, input_ids.shape)

    @nn.compact
    def __call__(self, input_ids: Array, token_type_ids: Array | None, deterministic: bool = True, *,
                 position_ids: Array | None = None, word_vectors: Array | None = None) -> Array:
        """``position_ids`` default to :meth:`position_ids`; ``word_vectors [B, L, E]`` are token embeddings looked up
        in a table this module does not own (a :class:`WordEmbeddings` shared by two stacks), else its own
        ``word_embeddings`` table is used."""
        cfg = self.config
        table = functools.partial(Embed, features=cfg.embedding_size, init_std=cfg.initializer_range, dtype=self.dtype)
        x = table(cfg.vocab_size, name="word_embeddings")(input_ids) if word_vectors is None else word_vectors
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        x = x + table(cfg.max_position_embeddings, name="position_embeddings")(position_ids)
        if cfg.type_vocab_size:
            x = x + table(cfg.type_vocab_size, name="token_type_embeddings")(token_type_ids)
        if cfg.embedding_norm:
            x = layer_norm(cfg, self.dtype, "norm")(x)
        x = nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
        if cfg.embedding_projection:
            x = dense(cfg.hidden_size, cfg, self.dtype, "projection")(x)
        return x


class Attention(nn.Module):
    """Multi-head scaled dot-product attention with output projection.

    ``softmax(q kᵀ / sqrt(H/heads) + bias + mask) v``: queries from ``x [B, L, H]``, keys and values from
    ``source`` (default ``x``; the encoder output ``[B, S, H]`` for cross-attention). ``allowed`` (bool, broadcastable
    to ``[B, heads, L, S]``) says which keys each query sees; the optional additive ``bias`` (broadcastable to the
    same shape) is MPNet's relative position bias.

    With a ``cache`` (:class:`KVCache` of ``T`` slots): given ``write_index``, the new keys and values are written
    to slots ``[write_index, write_index + L)`` and the queries attend over all ``T`` slots (decoder self-attention);
    without it, the cached keys and values are used as they are and ``source`` is not read (cross-attention after
    the first decoding step).

    Returns ``(out [B, L, H], (probs [B, heads, L, S] or None, KVCache of the keys and values attended to))``.
    """

    config: EncoderConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array, allowed: Array, deterministic: bool, output_attentions: bool, bias=None, *,
                 source: Array | None = None, cache: KVCache | None = None, write_index=None):
        cfg = self.config
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads

        def project(name, t):  # [B, L, H] -> [B, L, heads, head_dim]
            t = dense(cfg.hidden_size, cfg, self.dtype, name)(t)
            return t.reshape(*t.shape[:-1], heads, head_dim)

        q = project("query", x)
        if cache is not None and write_index is None:
            k, v = cache.key, cache.value
        else:
            kv_input = x if source is None else source
            k, v = project("key", kv_input), project("value", kv_input)
            if cache is not None:
                k = jax.lax.dynamic_update_slice(cache.key, k.astype(cache.key.dtype), (0, write_index, 0, 0))
                v = jax.lax.dynamic_update_slice(cache.value, v.astype(cache.value.dtype), (0, write_index, 0, 0))
        needs_probs = output_attentions or (not deterministic and cfg.attention_probs_dropout_prob > 0)
        if needs_probs:
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(head_dim)
            if bias is not None:
                scores = scores + bias
            scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
            dropped = nn.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
            context = jnp.einsum("bhqk,bkhd->bqhd", dropped, v)
        else:
            probs = None
            context = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype),
                                                   bias=None if bias is None else bias.astype(q.dtype), mask=allowed)
        out = dense(cfg.hidden_size, cfg, self.dtype, "output")(context.reshape(*x.shape[:-1], cfg.hidden_size))
        return out, (probs if output_attentions else None, KVCache(k, v))


class AttentionContext(NamedTuple):
    """What every block of a stack attends with, computed once per call by :class:`Encoder`.

    mask ``[B, L]`` (the input's real tokens; a last-layer transform reads it); allowed ``[B, 1, L, T]`` (the keys
    each query sees in self-attention); bias (additive self-attention bias or None); memory ``[B, S, H]`` and
    memory_allowed ``[B, 1, 1, S]`` (the encoder output and its real tokens, for cross-attention, or None);
    write_index (the cache slot of the first input token, or None without a cache).
    """

    mask: Array
    allowed: Array
    bias: Array | None = None
    memory: Array | None = None
    memory_allowed: Array | None = None
    write_index: Array | None = None


class TransformerBlock(nn.Module):
    """One transformer block (see the module docstring): self-attention, cross-attention to ``context.memory``
    when ``cross_attention``, feed-forward; each sublayer post- or pre-LayerNorm by ``config.pre_norm``.

    ``output_transform(y, mask)``, when given, replaces the feed-forward sublayer's sum ``y = x + h`` by
    ``output_transform(x + h, mask) + x`` (before ``output_norm`` in a post-LN block: the SoftDecay authors'
    placement, which adds the residual a second time); it is a callable bound to the module that owns the
    transform's parameters.

    Returns ``(x [B, L, H], (self-attention probs, cross-attention probs), LayerCache or None)``.
    """

    config: EncoderConfig
    dtype: Any = jnp.float32
    cross_attention: bool = False

    @nn.compact
    def __call__(self, x: Array, context: AttentionContext, deterministic: bool = True, output_attentions: bool = False,
                 output_transform: Callable | None = None, cache: LayerCache | None = None):
        cfg = self.config
        drop = nn.Dropout(cfg.hidden_dropout_prob)

        def sublayer(x, norm_name: str, dropout: bool, f: Callable, transform: Callable | None = None):
            """Post-LN ``norm(x + Dropout(f(x)))`` or pre-LN ``x + Dropout(f(norm(x)))``; ``f`` returns (h, extra)."""
            norm = layer_norm(cfg, self.dtype, norm_name)
            h, extra = f(norm(x) if cfg.pre_norm else x)
            if dropout:
                h = drop(h, deterministic=deterministic)
            y = x + h
            if transform is not None:
                y = transform(y, context.mask).astype(y.dtype) + x
            return (y if cfg.pre_norm else norm(y)), extra

        attention = Attention(cfg, self.dtype, name="attention")
        x, (probs, self_kv) = sublayer(x, "attention_norm", cfg.attention_output_dropout, lambda h: attention(
            h, context.allowed, deterministic, output_attentions, context.bias,
            cache=None if cache is None else cache.attention, write_index=context.write_index))
        cross_probs = cross_kv = None
        if self.cross_attention:
            cross = Attention(cfg, self.dtype, name="cross_attention")
            x, (cross_probs, cross_kv) = sublayer(x, "cross_attention_norm", True, lambda h: cross(
                h, context.memory_allowed, deterministic, output_attentions, source=context.memory,
                cache=None if cache is None else cache.cross_attention))

        def feed_forward(h):
            h = ACTIVATIONS[cfg.hidden_act](dense(cfg.intermediate_size, cfg, self.dtype, "intermediate")(h))
            h = nn.Dropout(cfg.activation_dropout)(h, deterministic=deterministic)
            return dense(cfg.hidden_size, cfg, self.dtype, "output")(h), None

        x, _ = sublayer(x, "output_norm", cfg.ffn_output_dropout, feed_forward, output_transform)
        return x, (probs, cross_probs), (None if cache is None else LayerCache(self_kv, cross_kv))


@flax.struct.dataclass
class StackOutput:
    """What :class:`Encoder` returns: ``hidden_states`` (embedding output, then every block's; the last after
    ``final_norm`` in a pre-LN stack), per-layer ``attentions`` / ``cross_attentions`` (or None), the updated
    ``cache`` (or None)."""

    hidden_states: tuple[Array, ...]
    attentions: tuple[Array, ...] | None = None
    cross_attentions: tuple[Array, ...] | None = None
    cache: Cache | None = None


class Encoder(nn.Module):
    """A stack of blocks (an encoder's, or a decoder's); ``layout`` says which blocks exist and the order they run in.

    BERT-style: block ``layer_i`` runs i-th. ALBERT overrides ``layout`` to run shared blocks repeatedly;
    MPNet overrides ``attention_bias`` to add one relative-position bias, shared by every block, to the
    attention scores. ``causal``: a token sees only real tokens at or before its own position (a decoder).
    ``cross_attention``: every block also attends to ``memory``, an encoder's output. A pre-LN stack
    (``config.pre_norm``) ends with the LayerNorm ``final_norm``, which the last hidden state includes (as in
    Hugging Face's GPT-2 and mBART). A hidden state is recorded after the embeddings and after every block that runs.
    """

    config: EncoderConfig
    dtype: Any = jnp.float32
    causal: bool = False
    cross_attention: bool = False

    def layout(self) -> tuple[list[str], list[int]]:
        """(block names, indices of the blocks in the order they run)."""
        n = self.config.num_hidden_layers
        return [f"layer_{i}" for i in range(n)], list(range(n))

    def attention_bias(self, length: int) -> Array | None:
        """Additive attention bias ``[1, heads, L, L]`` shared by every block, or None (called inside
        ``__call__``, so it may create parameters)."""
        return None

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool = True, output_attentions: bool = False,
                 last_block_transform: Callable | None = None, *, memory: Array | None = None,
                 memory_mask: Array | None = None, cache: Cache | None = None) -> StackOutput:
        """``x [B, L, H]``, ``mask [B, L]``; ``last_block_transform`` is passed to the last block that runs as its
        ``output_transform``; ``memory [B, S, H]`` / ``memory_mask [B, S]`` (default all real): what
        cross-attention reads; ``cache``: the decoding :class:`Cache`, to which the ``L`` tokens are appended (a
        causal stack only)."""
        if self.cross_attention != (memory is not None):
            raise ValueError("memory (the encoder output) must be given exactly when the stack has cross-attention")
        if cache is not None and not self.causal:
            raise ValueError("a key/value cache needs a causal stack")
        names, order = self.layout()
        blocks = [TransformerBlock(self.config, self.dtype, self.cross_attention, name=name) for name in names]
        length = x.shape[1]
        key_mask, first = (mask, 0) if cache is None else (
            jax.lax.dynamic_update_slice(cache.mask, mask, (0, cache.index)), cache.index)
        allowed = key_mask[:, None, None, :]
        if self.causal:  # query i (at slot first + i) sees slots t <= first + i
            slots = jnp.arange(key_mask.shape[1])
            allowed = allowed & (slots[None, :] <= first + jnp.arange(length)[:, None])
        if memory is not None and memory_mask is None:
            memory_mask = jnp.ones(memory.shape[:2], bool)
        context = AttentionContext(mask, allowed, self.attention_bias(length), memory,
                                   None if memory is None else memory_mask[:, None, None, :],
                                   None if cache is None else cache.index)
        hidden, attentions, cross_attentions, layer_caches = [x], [], [], []
        for step, index in enumerate(order):
            transform = last_block_transform if step == len(order) - 1 else None
            x, (probs, cross_probs), layer_cache = blocks[index](
                x, context, deterministic, output_attentions, transform, None if cache is None else cache.layers[step])
            hidden.append(x)
            attentions.append(probs)
            cross_attentions.append(cross_probs)
            layer_caches.append(layer_cache)
        if self.config.pre_norm:
            hidden[-1] = layer_norm(self.config, self.dtype, "final_norm")(hidden[-1])
        new_cache = None if cache is None else Cache(tuple(layer_caches), key_mask, cache.index + length)
        return StackOutput(tuple(hidden), tuple(attentions) if output_attentions else None,
                           tuple(cross_attentions) if output_attentions and self.cross_attention else None, new_cache)


class Pooler(nn.Module):
    """BERT's pooler: ``tanh(W h[:, 0] + b)`` on the first ([CLS]) token, ``[B, L, H] -> [B, H]``."""

    config: EncoderConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        return jnp.tanh(dense(self.config.hidden_size, self.config, self.dtype, "dense")(x[:, 0]))


def validate_inputs(config: EncoderConfig, input_ids, attention_mask, token_type_ids, *, prefix: str = ""):
    """Check shapes (always) and id ranges (when the values are concrete); return (ids, bool mask, type ids).

    Raises ``ValueError`` naming the argument (``prefix`` + ``input_ids`` / ``attention_mask``, e.g. BART's
    ``decoder_input_ids``): ids not ``[batch, length]`` integers, a sequence longer than the position embeddings,
    ids outside the vocabulary, a mask or token-type ids whose shape differs from the ids.
    """
    ids_name, mask_name = f"{prefix}input_ids", f"{prefix}attention_mask"
    input_ids = jnp.asarray(input_ids)
    if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
        raise ValueError(f"{ids_name} must be integer [batch, length], got {input_ids.dtype} {input_ids.shape}")
    length = input_ids.shape[1]
    if length > config.max_sequence_length:
        raise ValueError(
            f"{ids_name} has length {length}, longer than the {config.max_sequence_length} positions "
            f"of this {config.model_type} model (max_position_embeddings={config.max_position_embeddings})"
        )
    if attention_mask is None:
        attention_mask = jnp.ones(input_ids.shape, bool)
    attention_mask = jnp.asarray(attention_mask)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"{mask_name} has shape {attention_mask.shape}, {ids_name} {input_ids.shape}")
    if config.type_vocab_size == 0:
        if token_type_ids is not None:
            raise ValueError(f"{config.model_type} has no token types; token_type_ids must be None")
    elif token_type_ids is None:
        token_type_ids = jnp.zeros(input_ids.shape, jnp.int32)
    else:
        token_type_ids = jnp.asarray(token_type_ids)
        if token_type_ids.shape != input_ids.shape:
            raise ValueError(f"token_type_ids has shape {token_type_ids.shape}, input_ids {input_ids.shape}")
    _check_range(input_ids, config.vocab_size, ids_name, "vocab_size")
    if token_type_ids is not None:
        _check_range(token_type_ids, config.type_vocab_size, "token_type_ids", "type_vocab_size")
    return input_ids, attention_mask.astype(bool), token_type_ids


def _check_range(ids, size: int, name: str, size_name: str) -> None:
    if isinstance(ids, jax.core.Tracer):
        return  # traced: out-of-range ids give NaN embeddings instead (see Embed)
    values = np.asarray(ids)
    if values.size and (values.min() < 0 or values.max() >= size):
        bad = values[(values < 0) | (values >= size)]
        raise ValueError(f"{name} holds {bad[:5].tolist()} outside [0, {size}) ({size_name}={size})")


class EncoderModel(nn.Module):
    """Embeddings -> :class:`Encoder` -> optional last-layer transform -> optional pooler.

    Architectures subclass it and override ``embeddings_cls`` / ``encoder_cls`` / ``has_pooler`` where they differ.

    Args (``__call__``): input_ids ``[B, L]`` int; attention_mask ``[B, L]`` (true/1 = real token, default all);
    token_type_ids ``[B, L]`` (default zeros; must be None for DistilBERT); deterministic (False turns on dropout,
    which needs a ``"dropout"`` PRNG key in ``apply(..., rngs=...)``); output_attentions.

    ``last_layer_transform``: an optional Linen module called as ``transform(h [B, L, H], mask [B, L])``
    (e.g. :class:`isojax.SoftDecay`); its parameters appear under ``params["last_layer_transform"]``. Where it
    acts is ``transform_placement``:

    - ``"output"`` (the SoftDecay paper): on the last layer's output, ``h_L <- T(h_L)``;
    - ``"block"`` (the SoftDecay authors' code): inside the last block, on the feed-forward output plus its
      residual before the final LayerNorm, with the residual added a second time:
      ``h_L = LayerNorm(T(x + Dropout(W_out act(W_in x))) + x)`` (``x``: the block's attention output). The
      authors' code runs T without a padding mask; here T still receives the attention mask.

    Either way the transformed states are ``last_hidden_state`` and ``hidden_states[-1]``; the pooler reads them.
    """

    config: EncoderConfig
    dtype: Any = jnp.float32
    last_layer_transform: nn.Module | None = None
    add_pooling_layer: bool = True
    transform_placement: str = "output"

    embeddings_cls = Embeddings
    encoder_cls = Encoder
    has_pooler = True

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
                 output_attentions: bool = False) -> EncoderOutput:
        if self.transform_placement not in TRANSFORM_PLACEMENTS:
            raise ValueError(f"transform_placement must be one of {TRANSFORM_PLACEMENTS}, "
                             f"got {self.transform_placement!r}")
        ids, mask, types = validate_inputs(self.config, input_ids, attention_mask, token_type_ids)
        x = self.embeddings_cls(self.config, self.dtype, name="embeddings")(ids, types, deterministic)
        in_block = self.last_layer_transform is not None and self.transform_placement == "block"
        stack = self.encoder_cls(self.config, self.dtype, name="encoder")(
            x, mask, deterministic, output_attentions, self.last_layer_transform if in_block else None)
        hidden = list(stack.hidden_states)
        if self.last_layer_transform is not None and not in_block:
            hidden[-1] = self.last_layer_transform(hidden[-1], mask).astype(hidden[-1].dtype)
        pooled = None
        if self.has_pooler and self.add_pooling_layer:
            pooled = Pooler(self.config, self.dtype, name="pooler")(hidden[-1])
        return EncoderOutput(hidden[-1], tuple(hidden), stack.attentions, pooled)
