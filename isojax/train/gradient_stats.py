"""Gradient statistics logged during fine-tuning (``isojax finetune --log-gradients``).

Per step, from the (globally reduced) gradient of the objective:

    grad_norm/<group>              ‖g‖₂ over the parameters of one group: ``embeddings``, each block (``layer_3``,
                                   ALBERT's ``group_0_layer_0``, BART's ``decoder_layer_0``), ``pooler``,
                                   ``last_layer_transform``, ``head``, ``isotropy_layer``, ``flow``, ...
    embedding_grad/mean_cosine     cos(−Σ_j g_j, μ): how the descent step on the word embedding matrix W moves its
                                   rows along their mean direction μ (too-much-in-common §3's common-enemies effect;
                                   :func:`isojax.gradients.common_enemies_alignment`)
    embedding_grad/principal_cosine  |cos(Σ_j g_j, v₁)| with W's first principal direction
    embedding_grad/coherence       mean cosine between the rows' gradients (1: all pushed one way)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import traverse_util

from isojax import gradients
from isojax.models import registry
from isojax.train.model import word_embeddings

KEYS = ("embedding_grad/mean_cosine", "embedding_grad/principal_cosine", "embedding_grad/coherence")


def parameter_group(path: tuple[str, ...]) -> str:
    """The group of a parameter path of a task model: below the pretrained network (``params["encoder"]``), the
    model contract's :func:`~isojax.models.registry.parameter_group` (``("encoder", "encoder", "layer_3", ...)`` ->
    ``layer_3``; ``("encoder", "decoder", "layer_0", ...)`` -> ``decoder_layer_0``; BART's ``("encoder",
    "final_logits_bias")`` -> ``final_logits_bias``), else the task model's own module (``("head", ...)`` ->
    ``head``).

    Args:
      path: the parameter's keys in the task model's params.

    Returns:
      The group's name.

    Examples:
      >>> parameter_group(("encoder", "encoder", "layer_3", "attention", "query", "kernel"))
      'layer_3'
      >>> parameter_group(("encoder", "decoder", "layer_0", "output", "bias")), parameter_group(("head", "kernel"))
      ('decoder_layer_0', 'head')
    """
    return registry.parameter_group(path[1:]) if path[0] == "encoder" and len(path) > 1 else path[0]


def gradient_statistics(params, grads) -> dict[str, jax.Array]:
    """The statistics of the module docstring for a task model's ``params`` and their gradient ``grads``.

    Args:
      params: the task model's params (the pretrained network under ``"encoder"``).
      grads: their gradient, of the same structure.

    Returns:
      A dict of float32 scalars: ``grad_norm/<group>`` for every group of :func:`parameter_group`, and the
      ``embedding_grad/*`` alignments of :data:`KEYS`.

    Examples:
      The word embeddings ``W`` have rows (1, 1), (3, 1), mean (2, 1); each row's gradient is (2, 1), so the descent
      direction ``-Σ g`` is opposite to the mean (cosine -1) and the rows' gradients all agree (coherence 1);
      ``‖g‖`` of the head is ``‖(3, 4)‖ = 5``:

      >>> import jax.numpy as jnp
      >>> params = {"encoder": {"embeddings": {"word_embeddings": {"embedding": jnp.array([[1.0, 1.0], [3.0, 1.0]])}}},
      ...           "head": {"kernel": jnp.zeros((1, 2))}}
      >>> grads = {"encoder": {"embeddings": {"word_embeddings": {"embedding": jnp.array([[2.0, 1.0], [2.0, 1.0]])}}},
      ...          "head": {"kernel": jnp.array([[3.0, 4.0]])}}
      >>> stats = gradient_statistics(params, grads)
      >>> [round(float(stats[k]), 4) for k in ("grad_norm/head", "grad_norm/embeddings")]
      [5.0, 3.1623]
      >>> [round(float(stats[k]), 4) for k in ("embedding_grad/mean_cosine", "embedding_grad/coherence")]
      [-1.0, 1.0]
    """
    squares: dict[str, jax.Array] = {}
    for path, g in traverse_util.flatten_dict(grads).items():
        group = parameter_group(path)
        squares[group] = squares.get(group, 0.0) + jnp.sum(jnp.square(g.astype(jnp.float32)))
    out = {f"grad_norm/{group}": jnp.sqrt(value) for group, value in squares.items()}
    alignment = gradients.common_enemies_alignment(word_embeddings(params), word_embeddings(grads))
    out.update(zip(KEYS, (alignment.mean_cosine, alignment.principal_cosine, alignment.coherence)))
    return out
