"""Named intermediate points of a model's forward pass, for analysis: ``capture(module, params, ids, mask)``.

For every block of the stack (an encoder's, or a causal LM's decoder) it returns, each stacked over the layers::

    "embeddings"       [B, L, H]              the embedding output (the stack's input)
    "residual"         [layers, B, L, H]      the residual stream after each block (the model's hidden states: a
                                              pre-norm stack's last one after the final norm, as transformers has it)
    "attention"        [layers, B, L, H]      each self-attention sublayer's output (after its output projection,
                                              before dropout, a post-norm and the residual sum)
    "mlp"              [layers, B, L, H]      each feed-forward sublayer's output (its down projection, likewise)
    "attention_probs"  [layers, B, heads, L, T]  the attention probabilities (T keys)

It runs the model once with Flax's ``capture_intermediates`` (the outputs of the ``attention`` and ``output`` modules
of each block) and ``output_attentions``; it works under ``jit`` (``module`` and ``points`` static). Unrolled stacks only: a
scanned stack (``scan_layers=True``) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import traverse_util

POINTS = ("embeddings", "residual", "attention", "mlp", "attention_probs")
"""The capture points :func:`isojax.models.capture` knows."""


def capture(module, params, input_ids, attention_mask=None, *, points: Sequence[str] = POINTS) -> dict[str, jax.Array]:
    """The named intermediate points (module docstring) of one forward pass.

    Args:
      module: an encoder or a causal LM (:func:`isojax.from_pretrained`), its stack unrolled.
      params: its params.
      input_ids: ``[B, L]`` token ids.
      attention_mask: ``[B, L]`` (true = real token; default all).
      points: which of :data:`~isojax.models.intermediates.POINTS` to return.

    Returns:
      ``{point: array}`` with the shapes of the module docstring. An unknown point, an encoder-decoder or a scanned
      stack is a ``ValueError``.

    Examples:
      >>> from isojax.models import TransformerConfig, build_encoder, init_params
      >>> config = TransformerConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
      ...                            intermediate_size=16, max_position_embeddings=16)
      >>> module = build_encoder(config)
      >>> out = capture(module, init_params(module, jax.random.key(0)), jnp.array([[1, 2, 3]]))
      >>> {name: value.shape for name, value in out.items()}
      {'embeddings': (1, 3, 8), 'residual': (2, 1, 3, 8), 'attention': (2, 1, 3, 8), 'mlp': (2, 1, 3, 8), 'attention_probs': (2, 1, 2, 3, 3)}
    """
    unknown = sorted(set(points) - set(POINTS))
    if unknown:
        raise ValueError(f"unknown capture points {unknown}; expected some of {POINTS}")
    if getattr(module, "scan_layers", False):
        raise ValueError("capture needs an unrolled stack; build the model with scan_layers=False")
    stack = getattr(module, "stack_name", None)
    if stack is None:
        raise ValueError(f"capture takes an encoder or a causal LM, not {type(module).__name__}")
    if not any(key.startswith("layer_") for key in params[stack]):
        raise ValueError("capture needs an unrolled stack with layer_{i} blocks (ALBERT's shared groups are not)")

    def wanted(mdl, method_name):
        path = mdl.path
        return method_name == "__call__" and len(path) == 3 and path[0] == stack and path[2] in ("attention", "output")

    out, state = module.apply(
        {"params": params},
        input_ids,
        attention_mask,
        output_attentions="attention_probs" in points,
        capture_intermediates=wanted,
        mutable=["intermediates"],
    )
    inter = traverse_util.flatten_dict(state["intermediates"][stack], sep="/")
    layers = sorted({key.split("/")[0] for key in inter}, key=lambda name: int(name.split("_")[1]))
    found = {
        "embeddings": out.hidden_states[0],
        "residual": jnp.stack(out.hidden_states[1:]),
        "attention": jnp.stack([inter[f"{name}/attention/__call__"][0][0] for name in layers]),
        "mlp": jnp.stack([inter[f"{name}/output/__call__"][0] for name in layers]),
    }
    if "attention_probs" in points:
        found["attention_probs"] = jnp.stack(out.attentions)
    return {point: found[point] for point in POINTS if point in points}


__all__ = ["POINTS", "capture"]
