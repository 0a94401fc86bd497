"""Rotary position embeddings (RoPE; Su et al. 2021) as Llama, Qwen, Mistral and Gemma apply them to queries and keys.

Each head's ``d`` features are rotated in pairs ``(i, i + d/2)`` by the angle ``p · ω_i`` of the token's position
``p``, with the inverse frequencies ``ω_i = θ^(−2i/d)``, ``i < d/2``::

    rope(x)_p = x_p · cos(p ω) + rotate_half(x_p) · sin(p ω),    rotate_half([a, b]) = [−b, a]

(transformers' layout: ``cos`` and ``sin`` repeat the ``d/2`` angles twice). Scalings of ``ω`` (``rope_type``):
``default`` (none), ``linear`` (``ω / factor``, position interpolation) and ``llama3`` (Llama 3.1: frequencies whose
wavelength ``2π/ω`` exceeds ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, those
shorter than ``… / high_freq_factor`` kept, the band between interpolated smoothly). Other types are refused by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

ROPE_TYPES = ("default", "linear", "llama3")
"""The ``rope_type`` values isojax implements."""


@dataclasses.dataclass(frozen=True)
class Rope:
    """A RoPE setting (transformers' ``rope_parameters``); ``ValueError`` for an unknown kind or bad values.

    Attributes:
      theta: the base ``θ`` of the inverse frequencies (``rope_theta``).
      kind: one of :data:`ROPE_TYPES` (``rope_type``).
      factor: the scaling factor of ``linear`` and ``llama3``.
      low_freq_factor, high_freq_factor, original_max_position_embeddings: ``llama3``'s band edges.
    """

    theta: float = 10000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.kind not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.kind!r} is not supported; isojax implements {', '.join(ROPE_TYPES)}")
        if not (self.theta > 0 and self.factor > 0):
            raise ValueError(f"RoPE needs theta > 0 and factor > 0, got theta={self.theta}, factor={self.factor}")
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(
                f"llama3 RoPE needs high_freq_factor > low_freq_factor > 0, got {self.high_freq_factor} and "
                f"{self.low_freq_factor}"
            )

    def inverse_frequencies(self, head_dim: int) -> np.ndarray:
        """``ω [head_dim / 2]`` float32, scaled by :attr:`kind`."""
        inv = 1.0 / self.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        if self.kind == "linear":
            inv = inv / self.factor
        elif self.kind == "llama3":
            wavelength = 2 * np.pi / inv
            old = self.original_max_position_embeddings
            smooth = (old / wavelength - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
            scaled = np.where(wavelength > old / self.low_freq_factor, inv / self.factor, inv)
            medium = (wavelength >= old / self.high_freq_factor) & (wavelength <= old / self.low_freq_factor)
            inv = np.where(medium, (1 - smooth) * inv / self.factor + smooth * inv, scaled)
        return inv.astype(np.float32)


def rope_from_hf(hf: Mapping[str, Any], parameters: Mapping[str, Any] | None = None) -> Rope:
    """The :class:`Rope` of a ``config.json``.

    Args:
      hf: the ``config.json`` dict: its ``rope_parameters`` (transformers 5), else the older ``rope_theta`` and
        ``rope_scaling`` keys.
      parameters: one layer type's ``rope_parameters`` entry (Gemma 3 has one per layer type) instead.

    Returns:
      A :class:`Rope`. ``ValueError`` names an unsupported ``rope_type`` or a ``partial_rotary_factor`` other than 1.

    Examples:
      >>> rope_from_hf({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
      Rope(theta=500000.0, kind='linear', factor=2.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
      >>> rope_from_hf({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
      Traceback (most recent call last):
      ValueError: rope_type 'yarn' is not supported; isojax implements default, linear, llama3
    """
    if parameters is None:
        parameters = hf.get("rope_parameters") or dict(hf.get("rope_scaling") or {}, rope_theta=hf.get("rope_theta"))
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor={hf['partial_rotary_factor']} is not supported (only 1.0)")
    extra = {
        key: parameters[key]
        for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        if key in parameters and kind != "default"
    }
    return Rope(theta=float(parameters.get("rope_theta") or 10000.0), kind=kind, **extra)


def rope_to_hf(rope: Rope) -> dict[str, Any]:
    """The ``rope_parameters`` entry of a :class:`Rope` (inverse of :func:`rope_from_hf`).

    Args:
      rope: the setting.

    Returns:
      A JSON-serialisable dict with ``rope_type``, ``rope_theta`` and the type's parameters.

    Examples:
      >>> rope_to_hf(Rope(theta=10000.0, kind="linear", factor=4.0))
      {'rope_type': 'linear', 'rope_theta': 10000.0, 'factor': 4.0}
    """
    out: dict[str, Any] = {"rope_type": rope.kind, "rope_theta": rope.theta}
    if rope.kind == "linear":
        out["factor"] = rope.factor
    elif rope.kind == "llama3":
        out.update(
            factor=rope.factor,
            low_freq_factor=rope.low_freq_factor,
            high_freq_factor=rope.high_freq_factor,
            original_max_position_embeddings=rope.original_max_position_embeddings,
        )
    return out


def rotary_angles(rope: Rope, positions: Array, head_dim: int) -> tuple[Array, Array]:
    """The rotation angles of RoPE at the given positions.

    Args:
      rope: the setting.
      positions: ``[B, L]`` integer positions.
      head_dim: the width ``d`` of a head (even).

    Returns:
      ``(cos, sin)``, each ``[B, L, 1, head_dim]`` float32: ``cos(p ω)`` and ``sin(p ω)`` with the ``d/2`` angles
      repeated twice (transformers' layout).

    Examples:
      >>> cos, sin = rotary_angles(Rope(), jnp.array([[0, 1]]), 4)
      >>> cos.shape, cos[0, 0, 0].tolist(), [round(v, 4) for v in sin[0, 1, 0].tolist()]
      ((1, 2, 1, 4), [1.0, 1.0, 1.0, 1.0], [0.8415, 0.01, 0.8415, 0.01])
    """
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope.inverse_frequencies(head_dim))
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: Array, angles: tuple[Array, Array]) -> Array:
    """Rotate queries or keys by RoPE: ``x cos + rotate_half(x) sin``, ``rotate_half([a, b]) = [-b, a]``.

    Args:
      x: ``[B, L, heads, head_dim]`` queries or keys.
      angles: ``(cos, sin)`` of :func:`rotary_angles` at the tokens' positions.

    Returns:
      ``[B, L, heads, head_dim]`` in the dtype of ``x``; each pair ``(i, i + d/2)`` rotated, norms kept.

    Examples:
      Position 0 is the identity; the rotation keeps every head's norm:

      >>> x = jnp.arange(8.0).reshape(1, 2, 1, 4)
      >>> y = apply_rotary(x, rotary_angles(Rope(), jnp.array([[0, 5]]), 4))
      >>> bool(jnp.allclose(y[0, 0], x[0, 0])), bool(jnp.allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1)))
      (True, True)
    """
    cos, sin = (a.astype(x.dtype) for a in angles)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


__all__ = ["ROPE_TYPES", "Rope", "apply_rotary", "rope_from_hf", "rope_to_hf", "rotary_angles"]
