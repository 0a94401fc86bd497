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
from collections.abc import Callable
from typing import Any, NamedTuple

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

SCANNED_STACK = "layers"
"""Name of the scanned stack of blocks (``Encoder(scan_layers=True)``): its parameters are the block's, stacked on a
leading layer axis, under ``encoder/layers/block/...``."""

REMAT_POLICIES: dict[str, Callable | None] = {
    "full": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
"""``Encoder(remat=...)``: what the backward pass keeps of each block's forward (``"none"``, not listed: everything;
``"full"``: only the block's input, everything else recomputed; ``"dots"``: the matmul outputs)."""

# Megatron-style tensor parallelism over the mesh axis "model": query/key/value and the feed-forward input
# projection split by output features (whole heads per device), the two output projections by input
# features (each device adds its partial product; XLA inserts the reduction); everything else replicated.
# (regex searched in the "/"-joined parameter path, PartitionSpec); every parameter of these modules matches.
_BLOCK_RULES: tuple[tuple[str, P], ...] = (
    (r"attention/(query|key|value)/kernel", P(None, "model")),
    (r"attention/(query|key|value)/bias", P("model")),
    (r"attention/output/kernel", P("model", None)),
    (r"intermediate/kernel", P(None, "model")),
    (r"intermediate/bias", P("model")),
    (r"output/kernel", P("model", None)),
    (r"output/bias", P()),
    (r"(attention_norm|output_norm)/(scale|bias)", P()),
)
PARTITION_RULES: tuple[tuple[str, P], ...] = (
    # a scanned stack's blocks: the same layout after the leading layer axis (these rules come first)
    *((rf"(^|/){SCANNED_STACK}/block/{pattern}$", P(None, *spec)) for pattern, spec in _BLOCK_RULES),
    *((rf"{pattern}$", spec) for pattern, spec in _BLOCK_RULES),  # first match: attention/output before output
    (r"(embeddings/norm|final_norm)/(scale|bias)$", P()),
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

    Attributes:
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

    Attributes:
      logits: ``[B, L, vocab_size]`` float32 next-token scores: the LM head tied to the word embeddings
        (:func:`tied_logits`), plus BART's ``final_logits_bias``.
      last_hidden_state: as in :class:`EncoderOutput`, over the ``L`` new tokens.
      hidden_states: as in :class:`EncoderOutput`, over the ``L`` new tokens.
      attentions: as in :class:`EncoderOutput`; with a cache the attention probabilities run over its ``T`` slots.
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


def bernoulli_mask(key, keep_prob: float, shape: tuple[int, ...]) -> Array:
    """A bool mask of ``shape`` whose entries are independent Bernoulli(``keep_prob``) draws.

    Each entry compares one ``uint32`` word ``u`` with a threshold: ``u < round(keep_prob * 2**32)``, so ``P(True)``
    is ``keep_prob`` to 2^-32 (``jax.random.bernoulli`` compares a 23-bit uniform float). The words come from XLA's
    ``RngBitGenerator`` with the threefry-2x32 algorithm (``jax.lax.rng_bit_generator``), whose 128-bit state is
    drawn from ``key`` with ``jax.random.bits``: XLA expands it into one fused counter-mode kernel, where
    ``jax.random.bits``' threefry runs its rounds over the whole array. On CPU, dropout's forward + backward on one
    attention layer of a 32 x 128 batch (6.3 million words) takes 13.7 ms this way against 24.2 ms with 2^16-word
    chunks of ``jax.random.bits`` (the words are drawn in ``shape``: drawn flat and reshaped, 23.3 ms). As with any
    ``RngBitGenerator`` algorithm, XLA does not promise the same bits across versions; a mask is a pure function of
    ``key`` within one.
    """
    threshold = jnp.uint32(min(round(keep_prob * 2.0**32), 2**32 - 1))
    state = jax.random.bits(key, (4,), jnp.uint32)
    _, words = jax.lax.rng_bit_generator(state, shape, jnp.uint32, algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY)
    return words < threshold


class Dropout(nn.Module):
    """Inverted dropout, ``x * mask / (1 - rate)`` with ``mask ~ Bernoulli(1 - rate)`` i.i.d. per entry
    (:func:`bernoulli_mask`, drawn with the ``"dropout"`` PRNG stream); the identity when ``deterministic`` or
    ``rate == 0``. ``flax.linen.Dropout``'s semantics with a cheaper mask."""

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if deterministic or self.rate == 0.0:
            return x
        if self.rate == 1.0:
            return jnp.zeros_like(x)
        keep = 1.0 - self.rate
        mask = bernoulli_mask(self.make_rng("dropout"), keep, x.shape)
        return jnp.where(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros((), x.dtype))


def sinusoidal_init(key, shape: tuple[int, int], dtype: Any = jnp.float32) -> Array:
    """The fixed sinusoidal position table ``P [num, features]`` of Vaswani et al. (2017), DistilBERT's
    ``sinusoidal_pos_embds`` initialisation: ``P[p, 2i] = sin(p / 10000^(2i/d))``, ``P[p, 2i+1] = cos(p /
    10000^(2i/d))`` with ``d = features``. A flax initializer; ``key`` is unused."""
    num, features = shape
    angle = np.arange(num)[:, None] / np.power(10000.0, 2 * (np.arange(features) // 2) / features)
    return jnp.asarray(np.where(np.arange(features) % 2 == 0, np.sin(angle), np.cos(angle)), dtype)


class Embed(nn.Module):
    """An embedding table ``[num, features]`` whose lookup never clamps silently.

    JAX clamps out-of-range gather indices; here an out-of-range id yields NaN rows instead (under ``jit``,
    where the ids cannot be checked eagerly). Eager calls are checked by :func:`validate_inputs` first.
    """

    num_embeddings: int
    features: int
    init_std: float = 0.02
    dtype: Any = jnp.float32
    sinusoidal: bool = False  # initialise with :func:`sinusoidal_init` instead of N(0, init_std²)

    @nn.compact
    def __call__(self, ids: Array) -> Array:
        init = sinusoidal_init if self.sinusoidal else nn.initializers.normal(self.init_std)
        table = self.param("embedding", init, (self.num_embeddings, self.features))
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
    def __call__(
        self,
        input_ids: Array,
        token_type_ids: Array | None,
        deterministic: bool = True,
        *,
        position_ids: Array | None = None,
        word_vectors: Array | None = None,
    ) -> Array:
        """``position_ids`` default to :meth:`position_ids`; ``word_vectors [B, L, E]`` are token embeddings looked up
        in a table this module does not own (a :class:`WordEmbeddings` shared by two stacks), else its own
        ``word_embeddings`` table is used."""
        cfg = self.config
        table = functools.partial(Embed, features=cfg.embedding_size, init_std=cfg.initializer_range, dtype=self.dtype)
        x = table(cfg.vocab_size, name="word_embeddings")(input_ids) if word_vectors is None else word_vectors
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        positions = table(cfg.max_position_embeddings, sinusoidal=cfg.sinusoidal_pos_embds, name="position_embeddings")
        x = x + positions(position_ids)
        if cfg.type_vocab_size:
            x = x + table(cfg.type_vocab_size, name="token_type_embeddings")(token_type_ids)
        if cfg.embedding_norm:
            x = layer_norm(cfg, self.dtype, "norm")(x)
        x = Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
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
    def __call__(
        self,
        x: Array,
        allowed: Array,
        deterministic: bool,
        output_attentions: bool,
        bias=None,
        *,
        source: Array | None = None,
        cache: KVCache | None = None,
        write_index=None,
    ):
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
            # Heads moved ahead of positions before the two batched products ([B, heads, L, head_dim]): XLA's CPU
            # layouts then need no copies inside them (one layer's fwd + bwd at 32 x 128 x 384: 161 -> 144 ms).
            qh, kh, vh = (t.swapaxes(1, 2) for t in (q, k, v))
            scores = jnp.matmul(qh, kh.swapaxes(2, 3)).astype(jnp.float32) / np.sqrt(head_dim)
            if bias is not None:
                scores = scores + bias
            scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
            dropped = Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
            context = jnp.matmul(dropped, vh).swapaxes(1, 2)  # [B, L, heads, head_dim]
        else:
            probs = None
            context = jax.nn.dot_product_attention(
                q,
                k.astype(q.dtype),
                v.astype(q.dtype),
                bias=None if bias is None else bias.astype(q.dtype),
                mask=allowed,
            )
        out = dense(cfg.hidden_size, cfg, self.dtype, "output")(context.reshape(*x.shape[:-1], cfg.hidden_size))
        return out, (probs if output_attentions else None, KVCache(k, v))


class ScanSegment(NamedTuple):
    """One ``nn.scan`` loop of a scanned stack (see :meth:`Encoder.scan_segments`).

    name: the scanned module's name; iterations: per iteration, the names (in the unscanned layout) of the blocks it
    runs, in order; inside the loop they are ``block`` (``block_{j}`` for several). stacked: whether each iteration
    has its own parameters, stacked on a leading axis, or all iterations share (broadcast) the same blocks (ALBERT).
    """

    name: str
    iterations: list[tuple[str, ...]]
    stacked: bool


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
    def __call__(
        self,
        x: Array,
        context: AttentionContext,
        deterministic: bool = True,
        output_attentions: bool = False,
        output_transform: Callable | None = None,
        cache: LayerCache | None = None,
    ):
        cfg = self.config
        drop = Dropout(cfg.hidden_dropout_prob)

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
        x, (probs, self_kv) = sublayer(
            x,
            "attention_norm",
            cfg.attention_output_dropout,
            lambda h: attention(
                h,
                context.allowed,
                deterministic,
                output_attentions,
                context.bias,
                cache=None if cache is None else cache.attention,
                write_index=context.write_index,
            ),
        )
        cross_probs = cross_kv = None
        if self.cross_attention:
            cross = Attention(cfg, self.dtype, name="cross_attention")
            x, (cross_probs, cross_kv) = sublayer(
                x,
                "cross_attention_norm",
                True,
                lambda h: cross(
                    h,
                    context.memory_allowed,
                    deterministic,
                    output_attentions,
                    source=context.memory,
                    cache=None if cache is None else cache.cross_attention,
                ),
            )

        def feed_forward(h):
            h = ACTIVATIONS[cfg.hidden_act](dense(cfg.intermediate_size, cfg, self.dtype, "intermediate")(h))
            h = Dropout(cfg.activation_dropout)(h, deterministic=deterministic)
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

    ``scan_layers``: run the blocks as a ``nn.scan`` loop (one block traced and compiled once, so compile time stays
    flat in depth) instead of unrolled; the outputs are the same. The parameters are then laid out by
    :meth:`scan_segments`: a BERT-style stack's blocks stacked on a leading layer axis under ``layers/block``,
    ALBERT's shared blocks once per group under ``group_{g}/block``; :func:`to_scanned` / :func:`to_unscanned` convert
    between the two layouts (``from_pretrained`` / ``save_pretrained`` do, so checkpoints keep Hugging Face's names).
    Encoder stacks only: a causal or cross-attention stack (decoding with a cache) and a last-block transform are
    refused. ``remat``: ``"none"``, or a key of :data:`REMAT_POLICIES` to recompute each block's forward in the
    backward pass (``nn.remat``), scanned or not.
    """

    config: EncoderConfig
    dtype: Any = jnp.float32
    causal: bool = False
    cross_attention: bool = False
    scan_layers: bool = False
    remat: str = "none"

    def layout(self) -> tuple[list[str], list[int]]:
        """(block names, indices of the blocks in the order they run)."""
        n = self.config.num_hidden_layers
        return [f"layer_{i}" for i in range(n)], list(range(n))

    def scan_segments(self) -> list[ScanSegment]:
        """How the scanned stack runs: one :class:`ScanSegment` per ``nn.scan`` loop, in order; together their
        iterations run the blocks of :meth:`layout`. Here: one loop over the layers, their parameters stacked."""
        return [ScanSegment(SCANNED_STACK, [(f"layer_{i}",) for i in range(self.config.num_hidden_layers)], True)]

    def attention_bias(self, length: int) -> Array | None:
        """Additive attention bias ``[1, heads, L, L]`` shared by every block, or None (called inside
        ``__call__``, so it may create parameters)."""
        return None

    @nn.compact
    def __call__(
        self,
        x: Array,
        mask: Array,
        deterministic: bool = True,
        output_attentions: bool = False,
        last_block_transform: Callable | None = None,
        *,
        memory: Array | None = None,
        memory_mask: Array | None = None,
        cache: Cache | None = None,
    ) -> StackOutput:
        """``x [B, L, H]``, ``mask [B, L]``; ``last_block_transform`` is passed to the last block that runs as its
        ``output_transform``; ``memory [B, S, H]`` / ``memory_mask [B, S]`` (default all real): what
        cross-attention reads; ``cache``: the decoding :class:`Cache`, to which the ``L`` tokens are appended (a
        causal stack only)."""
        if self.cross_attention != (memory is not None):
            raise ValueError("memory (the encoder output) must be given exactly when the stack has cross-attention")
        if cache is not None and not self.causal:
            raise ValueError("a key/value cache needs a causal stack")
        if self.remat != "none" and self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be 'none' or one of {tuple(REMAT_POLICIES)}, got {self.remat!r}")
        if self.scan_layers and (self.causal or self.cross_attention or last_block_transform is not None):
            raise ValueError(
                "scan_layers supports encoder stacks only: not a causal or cross-attention stack "
                "(decoders, key/value caches) nor a last-block transform (use transform_placement="
                "'output')"
            )
        length = x.shape[1]
        key_mask, first = (
            (mask, 0)
            if cache is None
            else (jax.lax.dynamic_update_slice(cache.mask, mask, (0, cache.index)), cache.index)
        )
        allowed = key_mask[:, None, None, :]
        if self.causal:  # query i (at slot first + i) sees slots t <= first + i
            slots = jnp.arange(key_mask.shape[1])
            allowed = allowed & (slots[None, :] <= first + jnp.arange(length)[:, None])
        if memory is not None and memory_mask is None:
            memory_mask = jnp.ones(memory.shape[:2], bool)
        context = AttentionContext(
            mask,
            allowed,
            self.attention_bias(length),
            memory,
            None if memory is None else memory_mask[:, None, None, :],
            None if cache is None else cache.index,
        )
        hidden, attentions, cross_attentions, layer_caches = [x], [], [], []
        if self.scan_layers:
            for segment in self.scan_segments():
                x, states, probs = self._scan(segment, x, context, deterministic, output_attentions)
                hidden += states
                attentions += probs
        else:
            block_cls = (
                TransformerBlock
                if self.remat == "none"
                else nn.remat(TransformerBlock, static_argnums=(3, 4, 5), policy=REMAT_POLICIES[self.remat])
            )
            names, order = self.layout()
            blocks = [block_cls(self.config, self.dtype, self.cross_attention, name=name) for name in names]
            for step, index in enumerate(order):
                transform = last_block_transform if step == len(order) - 1 else None
                x, (probs, cross_probs), layer_cache = blocks[index](
                    x,
                    context,
                    deterministic,
                    output_attentions,
                    transform,
                    None if cache is None else cache.layers[step],
                )
                hidden.append(x)
                attentions.append(probs)
                cross_attentions.append(cross_probs)
                layer_caches.append(layer_cache)
        if self.config.pre_norm:
            hidden[-1] = layer_norm(self.config, self.dtype, "final_norm")(hidden[-1])
        new_cache = None if cache is None else Cache(tuple(layer_caches), key_mask, cache.index + length)
        return StackOutput(
            tuple(hidden),
            tuple(attentions) if output_attentions else None,
            tuple(cross_attentions) if output_attentions and self.cross_attention else None,
            new_cache,
        )

    def _scan(
        self, segment: ScanSegment, x: Array, context: AttentionContext, deterministic: bool, output_attentions: bool
    ):
        """Run one :class:`ScanSegment` as ``nn.scan``; returns ``(x, hidden states, attention probs)``, one per block
        run, in order (probs None unless asked for)."""
        body = (
            BlockSequence
            if self.remat == "none"
            else nn.remat(BlockSequence, policy=REMAT_POLICIES[self.remat], prevent_cse=False)
        )
        loop = nn.scan(
            body,
            variable_axes={"params": 0} if segment.stacked else {},
            variable_broadcast=False if segment.stacked else "params",
            split_rngs={"params": segment.stacked, "dropout": True},
            in_axes=nn.broadcast,
            length=len(segment.iterations),
        )
        x, (states, probs) = loop(
            self.config, self.dtype, len(segment.iterations[0]), deterministic, output_attentions, name=segment.name
        )(x, context)
        states = [s for step in states for s in step]  # [iterations, size, B, L, H] -> blocks in order
        probs = [p for step in probs for p in step] if output_attentions else [None] * len(states)
        return x, states, probs


def _block_name(j: int, size: int) -> str:
    """Name of the ``j``-th of ``size`` blocks in one iteration of a scanned stack."""
    return "block" if size == 1 else f"block_{j}"


class BlockSequence(nn.Module):
    """``size`` encoder blocks applied in order: the body of a scanned stack (see :attr:`Encoder.scan_layers`).

    ``(x [B, L, H], context) -> (x, (hidden states [size, B, L, H], attention probs [size, B, heads, L, L] or
    None))``.
    """

    config: EncoderConfig
    dtype: Any
    size: int
    deterministic: bool
    output_attentions: bool

    @nn.compact
    def __call__(self, x: Array, context: AttentionContext):
        states, probs = [], []
        for j in range(self.size):
            x, (p, _), _ = TransformerBlock(self.config, self.dtype, name=_block_name(j, self.size))(
                x, context, self.deterministic, self.output_attentions
            )
            states.append(x)
            probs.append(p)
        return x, (jnp.stack(states), jnp.stack(probs) if self.output_attentions else None)


def to_scanned(model: EncoderModel, params: dict) -> dict:
    """An encoder's params in the layout of ``model`` built with ``scan_layers=True``, from the unscanned layout
    (``encoder/layer_0/...``, the one Hugging Face's names map; see :meth:`Encoder.scan_segments`). Inverse of
    :func:`to_unscanned`; ``params`` may hold numpy or JAX arrays."""
    segments = model.encoder_cls(model.config).scan_segments()
    tree = params["encoder"]
    blocks = {b for segment in segments for step in segment.iterations for b in step}
    out = {k: v for k, v in tree.items() if k not in blocks}
    for name, iterations, stacked in segments:
        size = len(iterations[0])
        out[name] = {
            _block_name(j, size): jax.tree.map(
                lambda *a: np.stack(a) if isinstance(a[0], np.ndarray) else jnp.stack(a),
                *(tree[step[j]] for step in iterations),
            )
            if stacked
            else tree[iterations[0][j]]
            for j in range(size)
        }
    return {**params, "encoder": out}


def to_unscanned(model: EncoderModel, params: dict) -> dict:
    """An encoder's params in the unscanned layout (one subtree per block of :meth:`Encoder.layout`, the names Hugging
    Face's checkpoints map), from the layout of ``model`` built with ``scan_layers=True``; inverse of
    :func:`to_scanned`."""
    segments = model.encoder_cls(model.config).scan_segments()
    tree = params["encoder"]
    out = {k: v for k, v in tree.items() if k not in {segment.name for segment in segments}}
    for name, iterations, stacked in segments:
        for i, step in enumerate(iterations):
            for j, block in enumerate(step):
                block_params = tree[name][_block_name(j, len(step))]
                out[block] = jax.tree.map(lambda a, i=i: a[i], block_params) if stacked else block_params
    return {**params, "encoder": out}


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

    ``scan_layers``, ``remat``: how the block stack runs (see :class:`Encoder`); a scanned model's params are
    converted from and to the checkpoint layout by :func:`to_scanned` / :func:`to_unscanned`.
    """

    config: EncoderConfig
    dtype: Any = jnp.float32
    last_layer_transform: nn.Module | None = None
    add_pooling_layer: bool = True
    transform_placement: str = "output"
    scan_layers: bool = False
    remat: str = "none"

    embeddings_cls = Embeddings
    encoder_cls = Encoder
    has_pooler = True

    @nn.compact
    def __call__(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        *,
        deterministic: bool = True,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        if self.transform_placement not in TRANSFORM_PLACEMENTS:
            raise ValueError(
                f"transform_placement must be one of {TRANSFORM_PLACEMENTS}, got {self.transform_placement!r}"
            )
        ids, mask, types = validate_inputs(self.config, input_ids, attention_mask, token_type_ids)
        x = self.embeddings_cls(self.config, self.dtype, name="embeddings")(ids, types, deterministic)
        in_block = self.last_layer_transform is not None and self.transform_placement == "block"
        stack = self.encoder_cls(
            self.config, self.dtype, scan_layers=self.scan_layers, remat=self.remat, name="encoder"
        )(x, mask, deterministic, output_attentions, self.last_layer_transform if in_block else None)
        hidden = list(stack.hidden_states)
        if self.last_layer_transform is not None and not in_block:
            hidden[-1] = self.last_layer_transform(hidden[-1], mask).astype(hidden[-1].dtype)
        pooled = None
        if self.has_pooler and self.add_pooling_layer:
            pooled = Pooler(self.config, self.dtype, name="pooler")(hidden[-1])
        return EncoderOutput(hidden[-1], tuple(hidden), stack.attentions, pooled)
