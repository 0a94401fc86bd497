"""How every parameter of the shared layers is laid out over a ``("data", "model")`` mesh.

:data:`PARTITION_RULES` are ``(regex searched in the "/"-joined parameter path, PartitionSpec)`` pairs; each
architecture adds the rules of its own layers (:func:`isojax.models.registry.partition_rules`).
"""

from __future__ import annotations

from jax.sharding import PartitionSpec as P

from isojax.models.encoder import TRANSFORM
from isojax.models.scan import SCANNED_STACK

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
