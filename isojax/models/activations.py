"""The activation functions a transformer's feed-forward sublayer may use, by their Hugging Face ``config.json`` name
(``hidden_act``, GPT-2 and BART's ``activation_function``); :class:`~isojax.models.config.TransformerConfig` accepts
exactly these names."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_fast": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}
