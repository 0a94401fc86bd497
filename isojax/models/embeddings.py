"""Token, position and token-type embeddings, and the language-model head tied to the word embeddings."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from isojax.models.config import TransformerConfig
from isojax.models.dropout import Dropout
from isojax.models.primitives import dense, layer_norm

Array = jax.Array

WORD_EMBEDDINGS = ("embeddings", "word_embeddings", "embedding")
"""Path of the word (input, and tied output) embedding matrix ``[vocab_size, embedding_size]`` in the params of every
architecture (BART's table shared by encoder and decoder included)."""


def word_embeddings(params):
    """The word (input = tied output) embedding matrix of a model's params.

    Args:
      params: a model's params (any architecture of :mod:`isojax.models`).

    Returns:
      ``W`` ``[vocab_size, embedding_size]`` float32.

    Examples:
      >>> import jax
      >>> from isojax.models import TransformerConfig, build_encoder, init_params
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> params = jax.eval_shape(lambda: init_params(build_encoder(config), jax.random.key(0)))  # shapes alone
      >>> word_embeddings(params).shape
      (10, 8)
    """
    for key in WORD_EMBEDDINGS:
        params = params[key]
    return params


def tied_logits(params, h: Array) -> Array:
    """The language-model head tied to the word embeddings: ``h Wᵀ``, ``[..., H] -> [..., vocab_size]`` float32
    (``W`` = :func:`word_embeddings` of ``params``, cast to the compute dtype of ``h``)."""
    return _logits(h, word_embeddings(params))


def _logits(h: Array, w: Array) -> Array:
    return jnp.einsum("...h,vh->...v", h, w.astype(h.dtype), preferred_element_type=jnp.float32)


def sinusoidal_init(key, shape: tuple[int, int], dtype: Any = jnp.float32) -> Array:
    """The fixed sinusoidal position table ``P [num, features]`` of Vaswani et al. (2017), DistilBERT's
    ``sinusoidal_pos_embds`` initialisation: ``P[p, 2i] = sin(p / 10000^(2i/d))``, ``P[p, 2i+1] = cos(p /
    10000^(2i/d))`` with ``d = features``. A flax initializer; ``key`` is unused."""
    num, features = shape
    angle = np.arange(num)[:, None] / np.power(10000.0, 2 * (np.arange(features) // 2) / features)
    return jnp.asarray(np.where(np.arange(features) % 2 == 0, np.sin(angle), np.cos(angle)), dtype)


DATA_AXIS = "data"
"""The mesh axis that the batch's rows are split over (``isojax.models.partitioning.FSDP_AXIS``)."""


def data_shards() -> int:
    """The size of the :data:`DATA_AXIS` of the mesh being traced on (``jax.sharding.get_abstract_mesh()``, which
    :class:`isojax.train.parallel.MeshRunner` sets while its train step is traced) when that axis is *Auto* (its
    shardings left to XLA); 1 off a mesh, without that axis, or with an *Explicit* one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or DATA_AXIS not in mesh.axis_names:
        return 1
    auto = mesh.axis_types[mesh.axis_names.index(DATA_AXIS)] == jax.sharding.AxisType.Auto
    return mesh.shape[DATA_AXIS] if auto else 1


class Embed(nn.Module):
    """An embedding table ``[num, features]`` whose lookup never clamps silently.

    JAX clamps out-of-range gather indices and wraps negative ones; here an id outside ``[0, num)`` (past the table
    or negative) yields a NaN row instead (under ``jit``, where the ids cannot be checked eagerly). Eager calls are
    checked by :func:`validate_inputs` first.

    ``tied``: the table has several uses in one pass (a word table shared by two stacks, or read again by the LM
    head, :meth:`attend`). Traced on a mesh whose data axis has ``N > 1`` devices (:func:`data_shards`), every use
    then reads row block ``n`` of a batch ``[B, ...]`` (``B / N`` rows: data shard ``n``'s) from copy ``n`` of one
    broadcast ``[N, num, features]`` of the table, so that the uses' gradients are summed per shard and the
    broadcast's transpose, a sum over the shards, is the table's only all-reduce; read whole, each use's gradient (a
    sum over the batch's rows) is all-reduced on its own and the reduced sums added after
    (``docs/design/tied-embeddings.md``). The values are the same; a batch that ``N`` does not divide reads the table.
    """

    num_embeddings: int
    features: int
    init_std: float = 0.02
    dtype: Any = jnp.float32
    sinusoidal: bool = False  # initialise with :func:`sinusoidal_init` instead of N(0, init_std²)
    tied: bool = False

    def setup(self):
        init = sinusoidal_init if self.sinusoidal else nn.initializers.normal(self.init_std)
        self.embedding = self.param("embedding", init, (self.num_embeddings, self.features))
        shards = data_shards() if self.tied else 1
        # one broadcast per pass (setup runs once per apply), which every use reads
        self.per_shard = jnp.broadcast_to(self.embedding, (shards, *self.embedding.shape)) if shards > 1 else None

    def _per_shard(self, x: Array) -> Array | None:
        """The broadcast table that the ``N`` row blocks of ``x [B, ...]`` are read from, or None (``x`` reads the
        table itself: not tied, off a mesh, or ``N`` does not divide ``B``)."""
        table = self.per_shard
        return table if table is not None and x.ndim and x.shape[0] % table.shape[0] == 0 else None

    def __call__(self, ids: Array) -> Array:
        def lookup(table, ids):
            ids = jnp.where(ids < 0, table.shape[0], ids)  # past the table, not wrapped from its end
            return jnp.take(table, ids, axis=0, mode="fill", fill_value=jnp.nan)

        table = self._per_shard(ids)
        if table is None:
            return lookup(self.embedding, ids).astype(self.dtype)
        x = jax.vmap(lookup)(table, ids.reshape(table.shape[0], -1, *ids.shape[1:]))
        return x.reshape(*ids.shape, self.features).astype(self.dtype)

    def attend(self, h: Array) -> Array:
        """The language-model head tied to this table, :func:`tied_logits`: ``h Wᵀ``, ``[..., features] ->
        [..., num]`` float32 (``W`` cast to the dtype of ``h``)."""
        table = self._per_shard(h)
        if table is None:
            return _logits(h, self.embedding)
        blocks = h.reshape(table.shape[0], -1, *h.shape[1:])
        logits = jnp.einsum("n...h,nvh->n...v", blocks, table.astype(h.dtype), preferred_element_type=jnp.float32)
        return logits.reshape(*h.shape[:-1], self.num_embeddings)


class WordEmbeddings(nn.Module):
    """A word-embedding table on its own, ``word_embeddings`` (BART's, shared by its encoder and decoder and tied to
    its LM head: a ``tied`` :class:`Embed`): ``ids [B, L] -> [B, L, H]``, times ``sqrt(hidden_size)`` when
    ``config.scale_embedding``; :meth:`attend` is the LM head."""

    config: TransformerConfig
    dtype: Any = jnp.float32

    def setup(self):
        cfg = self.config
        self.word_embeddings = Embed(cfg.vocab_size, cfg.hidden_size, cfg.initializer_range, self.dtype, tied=True)

    def __call__(self, ids: Array) -> Array:
        x = self.word_embeddings(ids)
        return x * float(np.sqrt(self.config.hidden_size)) if self.config.scale_embedding else x

    def attend(self, h: Array) -> Array:
        """``h [..., H] -> h Wᵀ [..., vocab_size]`` float32 (:meth:`Embed.attend`; not scaled)."""
        return self.word_embeddings.attend(h)


class Embeddings(nn.Module):
    """Token + position (+ token-type) embeddings, LayerNorm, dropout: ``ids [B, L] -> [B, L, H]``.

    Tables are ``embedding_size`` wide; ALBERT (``config.embedding_projection``) then projects to ``hidden_size``.
    GPT-2 and the RoPE decoders (``config.embedding_norm`` False) have no LayerNorm here; RoPE models
    (``config.rope``) no position table; Gemma (``config.scale_embedding``) scales the token embeddings by
    ``sqrt(hidden_size)``. Subclasses override :meth:`position_ids`
    (RoBERTa counts positions after the padding index). ``tied``: the word table is also the LM head's
    (:meth:`attend`; a ``tied`` :class:`Embed`).
    """

    config: TransformerConfig
    dtype: Any = jnp.float32
    tied: bool = False

    def setup(self):
        cfg = self.config
        assert cfg.embedding_size is not None  # TransformerConfig.__post_init__ sets it (hidden_size by default)
        # its parameter is made on first use: a module given word_vectors (BART's stacks) has no table of its own
        self.word_embeddings = Embed(
            cfg.vocab_size, cfg.embedding_size, cfg.initializer_range, self.dtype, tied=self.tied
        )

    def attend(self, h: Array) -> Array:
        """The LM head tied to the word table: ``h [..., E] -> h Wᵀ [..., vocab_size]`` float32
        (:meth:`Embed.attend`)."""
        return self.word_embeddings.attend(h)

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
        assert cfg.embedding_size is not None  # TransformerConfig.__post_init__ sets it (hidden_size by default)
        table = functools.partial(Embed, features=cfg.embedding_size, init_std=cfg.initializer_range, dtype=self.dtype)
        if word_vectors is None:
            x = self.word_embeddings(input_ids)
            if cfg.scale_embedding:  # Gemma (BART scales in its shared WordEmbeddings)
                x = x * jnp.asarray(np.sqrt(cfg.hidden_size), x.dtype)
        else:
            x = word_vectors
        if cfg.rope is None:  # a learnt absolute position table (RoPE models rotate queries and keys instead)
            if position_ids is None:
                position_ids = self.position_ids(input_ids)
            positions = table(
                cfg.max_position_embeddings, sinusoidal=cfg.sinusoidal_pos_embds, name="position_embeddings"
            )
            x = x + positions(position_ids)
        if cfg.type_vocab_size:
            if token_type_ids is None:  # inputs.validate_inputs fills zeros for a model that reads token types
                raise ValueError(
                    f"this {cfg.model_type} model reads no token types, but its TransformerConfig has "
                    f"type_vocab_size={cfg.type_vocab_size}; set type_vocab_size=0"
                )
            x = x + table(cfg.type_vocab_size, name="token_type_embeddings")(token_type_ids)
        if cfg.embedding_norm:
            x = layer_norm(cfg, self.dtype, "norm")(x)
        x = Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
        if cfg.embedding_projection:
            x = dense(cfg.hidden_size, cfg, self.dtype, "projection")(x)
        return x
