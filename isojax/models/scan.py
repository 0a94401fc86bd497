"""Running a stack's blocks as ``nn.scan`` loops, and converting params between the scanned and unscanned layouts.

A scanned stack (``TransformerStack(scan_layers=True)``) runs its blocks as one or more :class:`ScanSegment` loops;
its params then hold each loop's blocks stacked on a leading layer axis (or, shared, once). Checkpoints keep the
unscanned layout (one subtree per block, the names Hugging Face's map): :func:`to_scanned` / :func:`to_unscanned`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from isojax.models.attention import AttentionContext
from isojax.models.block import TransformerBlock
from isojax.models.config import TransformerConfig

Array = jax.Array

SCANNED_STACK = "layers"
"""Name of the scanned stack of blocks (``TransformerStack(scan_layers=True)``): its parameters are the block's,
stacked on a leading layer axis, under ``encoder/layers/block/...``."""


class ScanSegment(NamedTuple):
    """One ``nn.scan`` loop of a scanned stack (see :meth:`~isojax.models.stack.TransformerStack.scan_segments`).

    name: the scanned module's name; iterations: per iteration, the names (in the unscanned layout) of the blocks it
    runs, in order; inside the loop they are ``block`` (``block_{j}`` for several). stacked: whether each iteration
    has its own parameters, stacked on a leading axis, or all iterations share (broadcast) the same blocks (ALBERT).
    """

    name: str
    iterations: list[tuple[str, ...]]
    stacked: bool


def _block_name(j: int, size: int) -> str:
    """Name of the ``j``-th of ``size`` blocks in one iteration of a scanned stack."""
    return "block" if size == 1 else f"block_{j}"


class BlockSequence(nn.Module):
    """``size`` blocks applied in order: the body of a scanned stack (see
    :attr:`~isojax.models.stack.TransformerStack.scan_layers`).

    ``(x [B, L, H], context) -> (x, (hidden states [size, B, L, H], attention probs [size, B, heads, L, L] or
    None))``.
    """

    config: TransformerConfig
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


def to_scanned(model: nn.Module, params: dict) -> dict:
    """An encoder's or causal LM's params in the layout of ``model`` built with ``scan_layers=True``, from the unscanned
    layout (``encoder/layer_0/...`` or ``decoder/layer_0/...``, the one Hugging Face's names map; see
    :meth:`~isojax.models.stack.TransformerStack.scan_segments`). Inverse of :func:`to_unscanned`.

    Args:
      model: the encoder or causal LM built with ``scan_layers=True``.
      params: its params in the unscanned layout (numpy or JAX arrays).

    Returns:
      The params with each scanned segment's blocks stacked: every leaf ``[...]`` of a block becomes
      ``[iterations, ...]``; other subtrees are unchanged.

    Examples:
      A 2-layer encoder's two blocks become one block whose parameters are stacked along a new leading axis:

      >>> import jax, numpy as np
      >>> from isojax.models import TransformerConfig, build_encoder, init_params
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> params = init_params(build_encoder(config), jax.random.key(0))
      >>> scanned = to_scanned(build_encoder(config, scan_layers=True), params)
      >>> kernel = scanned["encoder"]["layers"]["block"]["attention"]["query"]["kernel"]
      >>> kernel.shape
      (2, 8, 8)
      >>> np.array_equal(kernel[1], params["encoder"]["layer_1"]["attention"]["query"]["kernel"])
      True
    """
    key, segments = _scanned_stack(model)
    tree = params[key]
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
    return {**params, key: out}


def to_unscanned(model: nn.Module, params: dict) -> dict:
    """An encoder's or causal LM's params in the unscanned layout (one subtree per block of
    :meth:`~isojax.models.stack.TransformerStack.layout`, the names Hugging Face's checkpoints map), from the layout of
    ``model`` built with ``scan_layers=True``; inverse of :func:`to_scanned`.

    Args:
      model: the encoder or causal LM built with ``scan_layers=True``.
      params: its params in the scanned layout.

    Returns:
      The params with one subtree per block (``encoder/layer_0``, ``encoder/layer_1``, ...).

    Examples:
      >>> import jax, numpy as np
      >>> from isojax.models import TransformerConfig, build_encoder, init_params
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> model = build_encoder(config, scan_layers=True)
      >>> params = init_params(build_encoder(config), jax.random.key(0))
      >>> back = to_unscanned(model, to_scanned(model, params))
      >>> sorted(back["encoder"])
      ['layer_0', 'layer_1']
      >>> all(jax.tree.leaves(jax.tree.map(np.array_equal, back, params)))
      True
    """
    key, segments = _scanned_stack(model)
    tree = params[key]
    out = {k: v for k, v in tree.items() if k not in {segment.name for segment in segments}}
    for name, iterations, stacked in segments:
        for i, step in enumerate(iterations):
            for j, block in enumerate(step):
                block_params = tree[name][_block_name(j, len(step))]
                out[block] = jax.tree.map(lambda a, i=i: a[i], block_params) if stacked else block_params
    return {**params, key: out}


def _scanned_stack(model) -> tuple[str, list[ScanSegment]]:
    """(params key of the stack, its scan segments) of an encoder (``encoder``) or a causal LM (``decoder``)."""
    return model.stack_name, model.stack_cls(model.config).scan_segments()
