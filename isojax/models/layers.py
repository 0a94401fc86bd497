"""The transformer parts every BERT-family encoder shares, written once.

Post-LayerNorm block (Devlin et al. 2019), for hidden states ``x`` of shape ``[B, L, H]``::

    a = Attention(x)                                   # softmax(q k^T / sqrt(H/heads) + mask) v, projected
    x = LayerNorm(x + Dropout(a))                      # "attention_norm"
    x = LayerNorm(x + Dropout(W_out act(W_in x)))      # "intermediate", "output", "output_norm"

Parameter names are canonical across architectures (``attention/query``, ``attention_norm``,
``intermediate``, ``output``, ``output_norm``); each architecture file maps them to its Hugging Face names.
:data:`PARTITION_RULES` says how each of these parameters is laid out over a ``("data", "model")`` mesh.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from isojax.models.config import EncoderConfig

Array = jax.Array

WORD_EMBEDDINGS = ("embeddings", "word_embeddings", "embedding")
"""Path of the word (input, and tied output) embedding matrix ``[vocab_size, embedding_size]`` in the params."""

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
    (r"(attention_norm|output_norm|embeddings/norm)/(scale|bias)$", P()),
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

    last_hidden_state: ``[B, L, H]`` output of the last layer (after the optional last-layer transform).
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


def dense(features: int, config: EncoderConfig, dtype, name: str) -> nn.Dense:
    """A Dense layer with BERT's initialisation N(0, initializer_range^2)."""
    return nn.Dense(features, dtype=dtype, kernel_init=nn.initializers.normal(config.initializer_range), name=name)


def layer_norm(config: EncoderConfig, dtype, name: str) -> nn.LayerNorm:
    """LayerNorm with the checkpoint's epsilon; statistics are always computed in float32."""
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=dtype, name=name)


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


class Embeddings(nn.Module):
    """Token + position (+ token-type) embeddings, LayerNorm, dropout: ``ids [B, L] -> [B, L, H]``.

    Tables are ``embedding_size`` wide; ALBERT (``config.embedding_projection``) then projects to ``hidden_size``.
    Subclasses override :meth:`position_ids` (RoBERTa counts positions after the padding index).
    """

    config: EncoderConfig
    dtype: Any = jnp.float32

    def position_ids(self, input_ids: Array) -> Array:
        """0, 1, ..., L-1 for every sequence."""
        return jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)

    @nn.compact
    def __call__(self, input_ids: Array, token_type_ids: Array | None, deterministic: bool = True) -> Array:
        cfg = self.config
        table = functools.partial(Embed, features=cfg.embedding_size, init_std=cfg.initializer_range, dtype=self.dtype)
        x = table(cfg.vocab_size, name="word_embeddings")(input_ids)
        x = x + table(cfg.max_position_embeddings, name="position_embeddings")(self.position_ids(input_ids))
        if cfg.type_vocab_size:
            x = x + table(cfg.type_vocab_size, name="token_type_embeddings")(token_type_ids)
        x = layer_norm(cfg, self.dtype, "norm")(x)
        x = nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
        if cfg.embedding_projection:
            x = dense(cfg.hidden_size, cfg, self.dtype, "projection")(x)
        return x


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention with output projection.

    ``softmax(q kᵀ / sqrt(H/heads) + bias + mask) v``: ``x [B, L, H]``, ``mask [B, L]`` (true = real token),
    optional additive ``bias`` broadcastable to ``[B, heads, L, L]`` (MPNet's relative position bias)
    -> ``([B, L, H], probs [B, heads, L, L] or None)``.
    """

    config: EncoderConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool, output_attentions: bool, bias=None):
        cfg = self.config
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads
        split = lambda t: t.reshape(*t.shape[:-1], heads, head_dim)  # noqa: E731  [B, L, heads, head_dim]
        q, k, v = (split(dense(cfg.hidden_size, cfg, self.dtype, n)(x)) for n in ("query", "key", "value"))
        key_mask = mask[:, None, None, :]  # [B, 1, 1, L]: every query may attend to every real key
        needs_probs = output_attentions or (not deterministic and cfg.attention_probs_dropout_prob > 0)
        if needs_probs:
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(head_dim)
            if bias is not None:
                scores = scores + bias
            scores = jnp.where(key_mask, scores, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
            dropped = nn.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
            context = jnp.einsum("bhqk,bkhd->bqhd", dropped, v)
        else:
            probs = None
            context = jax.nn.dot_product_attention(q, k, v, bias=None if bias is None else bias.astype(q.dtype),
                                                   mask=key_mask)
        out = dense(cfg.hidden_size, cfg, self.dtype, "output")(context.reshape(x.shape))
        return out, (probs if output_attentions else None)


class TransformerBlock(nn.Module):
    """One post-LayerNorm transformer block (see the module docstring).

    ``output_transform(y, mask)``, when given, replaces the block's last sum ``y = x + h`` by
    ``output_transform(x + h, mask) + x`` before ``output_norm`` (the SoftDecay authors' placement, which adds
    the residual a second time); it is a callable bound to the module that owns the transform's parameters.
    """

    config: EncoderConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool = True, output_attentions: bool = False,
                 bias=None, output_transform: Callable | None = None):
        cfg = self.config
        drop = nn.Dropout(cfg.hidden_dropout_prob)
        a, probs = SelfAttention(cfg, self.dtype, name="attention")(x, mask, deterministic, output_attentions, bias)
        if cfg.attention_output_dropout:
            a = drop(a, deterministic=deterministic)
        x = layer_norm(cfg, self.dtype, "attention_norm")(x + a)
        h = ACTIVATIONS[cfg.hidden_act](dense(cfg.intermediate_size, cfg, self.dtype, "intermediate")(x))
        h = dense(cfg.hidden_size, cfg, self.dtype, "output")(h)
        if cfg.ffn_output_dropout:
            h = drop(h, deterministic=deterministic)
        y = x + h
        if output_transform is not None:
            y = output_transform(y, mask).astype(y.dtype) + x
        return layer_norm(cfg, self.dtype, "output_norm")(y), probs


class Encoder(nn.Module):
    """The stack of blocks. ``layout`` says which blocks exist and the order in which they run.

    BERT-style: block ``layer_i`` runs i-th. ALBERT overrides ``layout`` to run shared blocks repeatedly;
    MPNet overrides ``attention_bias`` to add one relative-position bias, shared by every block, to the
    attention scores. A hidden state is recorded after every block that runs.
    """

    config: EncoderConfig
    dtype: Any = jnp.float32

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
                 last_block_transform: Callable | None = None):
        """``last_block_transform`` is passed to the last block that runs as its ``output_transform``."""
        names, order = self.layout()
        blocks = [TransformerBlock(self.config, self.dtype, name=name) for name in names]
        bias = self.attention_bias(x.shape[1])
        hidden, attentions = [x], []
        for step, index in enumerate(order):
            transform = last_block_transform if step == len(order) - 1 else None
            x, probs = blocks[index](x, mask, deterministic, output_attentions, bias, transform)
            hidden.append(x)
            attentions.append(probs)
        return hidden, (tuple(attentions) if output_attentions else None)


class Pooler(nn.Module):
    """BERT's pooler: ``tanh(W h[:, 0] + b)`` on the first ([CLS]) token, ``[B, L, H] -> [B, H]``."""

    config: EncoderConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        return jnp.tanh(dense(self.config.hidden_size, self.config, self.dtype, "dense")(x[:, 0]))


def validate_inputs(config: EncoderConfig, input_ids, attention_mask, token_type_ids):
    """Check shapes (always) and id ranges (when the values are concrete); return (ids, bool mask, type ids).

    Raises ``ValueError`` naming the argument: ids not ``[batch, length]`` integers, a sequence longer than the
    position embeddings, ids outside the vocabulary, a mask or token-type ids whose shape differs from the ids.
    """
    input_ids = jnp.asarray(input_ids)
    if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
        raise ValueError(f"input_ids must be integer [batch, length], got {input_ids.dtype} {input_ids.shape}")
    length = input_ids.shape[1]
    if length > config.max_sequence_length:
        raise ValueError(
            f"input_ids has length {length}, longer than the {config.max_sequence_length} positions "
            f"of this {config.model_type} model (max_position_embeddings={config.max_position_embeddings})"
        )
    if attention_mask is None:
        attention_mask = jnp.ones(input_ids.shape, bool)
    attention_mask = jnp.asarray(attention_mask)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {attention_mask.shape}, input_ids {input_ids.shape}")
    if config.type_vocab_size == 0:
        if token_type_ids is not None:
            raise ValueError(f"{config.model_type} has no token types; token_type_ids must be None")
    elif token_type_ids is None:
        token_type_ids = jnp.zeros(input_ids.shape, jnp.int32)
    else:
        token_type_ids = jnp.asarray(token_type_ids)
        if token_type_ids.shape != input_ids.shape:
            raise ValueError(f"token_type_ids has shape {token_type_ids.shape}, input_ids {input_ids.shape}")
    _check_range(input_ids, config.vocab_size, "input_ids", "vocab_size")
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
        hidden, attentions = self.encoder_cls(self.config, self.dtype, name="encoder")(
            x, mask, deterministic, output_attentions, self.last_layer_transform if in_block else None)
        if self.last_layer_transform is not None and not in_block:
            hidden[-1] = self.last_layer_transform(hidden[-1], mask).astype(hidden[-1].dtype)
        pooled = None
        if self.has_pooler and self.add_pooling_layer:
            pooled = Pooler(self.config, self.dtype, name="pooler")(hidden[-1])
        return EncoderOutput(hidden[-1], tuple(hidden), attentions, pooled)
