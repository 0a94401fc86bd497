"""The checks every model runs on its inputs before the first layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from isojax.models.config import TransformerConfig


def validate_inputs(config: TransformerConfig, input_ids, attention_mask, token_type_ids, *, prefix: str = ""):
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
