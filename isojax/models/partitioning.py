"""How every parameter is laid out over a ``("data", "model")`` mesh: tensor-parallel rules and FSDP.

**Model parallelism.** :data:`PARTITION_RULES` are ``(regex searched in the "/"-joined parameter path,
PartitionSpec)`` pairs for the shared layers; each architecture adds the rules of its own layers
(:func:`isojax.models.registry.partition_rules`).

**Fully sharded data parallelism (FSDP, ZeRO-3)**: where each parameter and optimiser moment lies on the mesh's
data axis.

Under FSDP each device of the ``data`` axis holds ``1/N`` of every array it can split, instead of a whole copy:
an array ``[d_0, ..., d_{k-1}]`` is split along the dimension ``i`` of largest ``d_i`` (ties: the earlier
dimension) among those that

- divide by the data-axis size ``N`` (``d_i % N == 0``; every shard the same shape ``d_i / N``),
- are not already split over the model axis (the model-parallel rules, :func:`isojax.models.registry.partition_rules`,
  stay as they are: FSDP combines with them, e.g. data 4 x model 2), and
- are not named by :data:`FSDP_EXCEPTIONS` for that parameter.

An array with no such dimension (a scalar, an odd-sized bias, a 3-way classifier bias) keeps its model-parallel
placement (replicated over ``data``). The computation is unchanged: under ``jit`` XLA all-gathers each split
parameter where the forward and backward passes use it and sums its gradient over the data axis for the local
shard, which is all the optimiser updates (:mod:`isojax.train.parallel` applies these rules).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from jax.sharding import PartitionSpec as P

from isojax.models.encoder import TRANSFORM
from isojax.models.scan import SCANNED_STACK

# Megatron-style tensor parallelism over the mesh axis "model": query/key/value and the feed-forward input
# projections (gate and up) split by output features (whole heads per device), the two output projections by input
# features (each device adds its partial product; XLA inserts the reduction); everything else replicated.
# (regex searched in the "/"-joined parameter path, PartitionSpec); every parameter of these modules matches.
_BLOCK_RULES: tuple[tuple[str, P], ...] = (
    (r"attention/(query|key|value)/kernel", P(None, "model")),
    (r"attention/(query|key|value)/bias", P("model")),
    (r"attention/output/kernel", P("model", None)),
    (r"attention/(query|key)_norm/scale", P()),
    (r"(gate|intermediate)/kernel", P(None, "model")),
    (r"(gate|intermediate)/bias", P("model")),
    (r"output/kernel", P("model", None)),
    (r"output/bias", P()),
    (r"(attention|output)(_post)?_norm/(scale|bias)", P()),
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

FSDP_AXIS = "data"
"""The mesh axis that FSDP splits parameters and optimiser moments over (the batch's axis)."""

FSDP_EXCEPTIONS: tuple[tuple[str, tuple[int, ...]], ...] = (
    # the layer axis of a scanned stack: each scan iteration slices one layer, so splitting that axis would make
    # every iteration fetch its layer from one device (in practice, all-gather the whole stack at once)
    (rf"(^|/){SCANNED_STACK}/block/", (0,)),
)
"""(regex searched in the "/"-joined path of a parameter or of its optimiser moment, dimensions never split over
the data axis)."""


def fsdp_spec(path: str, shape: Sequence[int], spec: P, data_size: int) -> P:
    """``spec`` with :data:`FSDP_AXIS` added on the dimension that the rule of the module docstring chooses.

    The chosen dimension is the largest (ties: the earliest) of those that divide by ``data_size``, are not split over
    the model axis in ``spec`` and are not excluded for ``path`` by :data:`FSDP_EXCEPTIONS`.

    Args:
      path: the "/"-joined path of the parameter (or of its optimiser moment).
      shape: the array's shape.
      spec: the array's model-parallel ``PartitionSpec`` (it may name fewer dimensions than ``shape`` has).
      data_size: the number of devices on the data axis (>= 1).

    Returns:
      a ``PartitionSpec`` naming every dimension of ``shape``; ``spec`` itself when ``data_size == 1`` or no dimension
      qualifies. ``ValueError`` for ``data_size < 1`` or a ``spec`` longer than ``shape``.

    Examples:
      The feed-forward kernel's output dimension is split over ``model``, so ``data`` takes the input dimension; a
      square kernel splits its first dimension; a 3-way bias does not divide by 8 and stays replicated:

      >>> fsdp_spec("encoder/layer_0/intermediate/kernel", (16, 32), P(None, "model"), 8)
      P('data', 'model')
      >>> fsdp_spec("encoder/layer_0/attention/query/kernel", (16, 16), P(), 4)
      P('data', None)
      >>> fsdp_spec("head/classifier/bias", (3,), P(), 8)
      P()
    """
    if data_size < 1:
        raise ValueError(f"data_size must be a positive number of devices, got {data_size!r}")
    if len(spec) > len(shape):
        raise ValueError(f"{path}: PartitionSpec {spec} names more dimensions than the shape {tuple(shape)} has")
    axes = tuple(spec) + (None,) * (len(shape) - len(spec))
    excluded = {dim for pattern, dims in FSDP_EXCEPTIONS if re.search(pattern, path) for dim in dims}
    candidates = [
        i for i, n in enumerate(shape) if axes[i] is None and i not in excluded and n > 0 and n % data_size == 0
    ]
    if data_size == 1 or not candidates:
        return spec
    chosen = max(candidates, key=lambda i: (shape[i], -i))
    return P(*(FSDP_AXIS if i == chosen else axis for i, axis in enumerate(axes)))


__all__ = ["FSDP_AXIS", "FSDP_EXCEPTIONS", "fsdp_spec"]
