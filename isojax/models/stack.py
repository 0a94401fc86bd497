"""A stack of transformer blocks: an encoder's, or a decoder's (causal, with cross-attention to an encoder output).

The mask says which keys a query sees: the real tokens (an encoder), the real tokens at or before its own position
(a ``causal`` stack, a decoder), the encoder's real tokens (cross-attention). Incremental decoding appends each new
token's keys and values to a :class:`~isojax.models.cache.Cache` instead of recomputing the prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from isojax.models.attention import AttentionContext
from isojax.models.block import TransformerBlock
from isojax.models.cache import Cache
from isojax.models.config import TransformerConfig
from isojax.models.primitives import layer_norm
from isojax.models.rope import rotary_angles
from isojax.models.scan import SCANNED_STACK, BlockSequence, ScanSegment

Array = jax.Array

REMAT_POLICIES: dict[str, Callable | None] = {
    "full": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
"""``TransformerStack(remat=...)``: what the backward pass keeps of each block's forward (``"none"``, not listed:
everything; ``"full"``: only the block's input, everything else recomputed; ``"dots"``: the matmul outputs)."""


@flax.struct.dataclass
class StackOutput:
    """What :class:`TransformerStack` returns: ``hidden_states`` (embedding output, then every block's; the last after
    ``final_norm`` in a pre-LN stack), per-layer ``attentions`` / ``cross_attentions`` (or None), the updated
    ``cache`` (or None)."""

    hidden_states: tuple[Array, ...]
    attentions: tuple[Array, ...] | None = None
    cross_attentions: tuple[Array, ...] | None = None
    cache: Cache | None = None


class TransformerStack(nn.Module):
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
    A cross-attention stack, decoding with a cache, layers of different attention types and a last-block transform
    are refused. ``remat``: ``"none"``, or a key of :data:`REMAT_POLICIES` to recompute each block's forward in the
    backward pass (``nn.remat``), scanned or not.
    """

    config: TransformerConfig
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
        positions: Array | None = None,
    ) -> StackOutput:
        """``x [B, L, H]``, ``mask [B, L]``; ``last_block_transform`` is passed to the last block that runs as its
        ``output_transform``; ``memory [B, S, H]`` / ``memory_mask [B, S]`` (default all real): what
        cross-attention reads; ``cache``: the decoding :class:`Cache`, to which the ``L`` tokens are appended (a
        causal stack only); ``positions [B, L]``: the RoPE positions (``config.rope``; default: the slots)."""
        if self.cross_attention != (memory is not None):
            raise ValueError("memory (the encoder output) must be given exactly when the stack has cross-attention")
        if cache is not None and not self.causal:
            raise ValueError("a key/value cache needs a causal stack")
        if self.remat != "none" and self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be 'none' or one of {tuple(REMAT_POLICIES)}, got {self.remat!r}")
        if self.scan_layers and (
            cache is not None or self.cross_attention or last_block_transform is not None or self.config.layer_types
        ):
            raise ValueError(
                "scan_layers supports stacks of identical blocks without a key/value cache: not a cross-attention "
                "stack, decoding with a cache, layers of different attention types (layer_types), nor a last-block "
                "transform (use transform_placement='output')"
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
        memory_allowed = None
        if memory is not None:
            memory_allowed = (jnp.ones(memory.shape[:2], bool) if memory_mask is None else memory_mask)[
                :, None, None, :
            ]
        context = AttentionContext(
            mask,
            allowed,
            self.attention_bias(length),
            memory,
            memory_allowed,
            None if cache is None else cache.index,
        )
        contexts = self._layer_contexts(context, first, length, key_mask.shape[1], positions)
        hidden, attentions, cross_attentions, layer_caches = [x], [], [], []
        if self.scan_layers:
            for segment in self.scan_segments():
                x, states, probs = self._scan(segment, x, contexts[0], deterministic, output_attentions)
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
                    contexts[self.config.layer_window(index)],
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

    def _layer_contexts(
        self, context: AttentionContext, first, length: int, slots: int, positions: Array | None
    ) -> dict[int, AttentionContext]:
        """The context of each sliding window the layers use (0: full attention): RoPE angles at ``positions`` (the
        sliding layers' own with ``config.local_rope``), and keys further back than the window masked out."""
        cfg = self.config
        windows = {cfg.layer_window(i) for i in range(cfg.num_hidden_layers)}
        if cfg.rope is None and windows == {0}:
            return {0: context}
        if windows != {0} and not self.causal:
            raise ValueError("sliding-window attention is implemented for causal stacks only")
        query_slots = first + jnp.arange(length)
        if positions is None:
            positions = jnp.broadcast_to(query_slots, context.mask.shape)
        head_dim = cfg.attention_head_dim
        contexts = {}
        for window in windows:
            rope = cfg.local_rope if window and cfg.local_rope is not None else cfg.rope
            allowed = context.allowed
            if window:  # query at slot i sees slots j > i - window
                allowed = allowed & (jnp.arange(slots)[None, :] > query_slots[:, None] - window)
            angles = None if rope is None else rotary_angles(rope, positions, head_dim)
            contexts[window] = context._replace(allowed=allowed, angles=angles)
        return contexts

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
