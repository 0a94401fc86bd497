"""Sentence pooling and task heads on top of an encoder.

Pooling methods (``h_l`` = hidden state of layer l, ``h_0`` the embedding output, averages over real tokens)::

    cls             h_L[:, 0]                   (an encoder's [CLS]; a causal LM's classification token is its last)
    last            h_L[b, last real token of b]   (causal LMs: transformers' ...ForSequenceClassification)
    pooler          tanh(W h_L[:, 0] + b)       (architectures with a pooler)
    mean            mean_t h_L[:, t]
    first_last_avg  mean_t (h_1 + h_L)[:, t] / 2   (BERT-flow / BERT-whitening "first-last-avg")
    last2avg        mean_t (h_0 + h_L)[:, t] / 2   (SoftDecay authors' code: embedding output and last layer)

Heads: :class:`ClassificationHead` (fine-tuning) and :class:`MaskedLMHead` (the pretrained masked-LM head, loaded
by :func:`isojax.models.load_mlm_head`, for gradient studies of the tied output layer).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from isojax._stats import masked_mean
from isojax.models.activations import ACTIVATIONS
from isojax.models.config import TransformerConfig
from isojax.models.outputs import DecoderOutput, EncoderOutput

POOLINGS = ("cls", "last", "pooler", "mean", "first_last_avg", "last2avg")


def pool(output: EncoderOutput | DecoderOutput, mask: jax.Array, method: str = "mean") -> jax.Array:
    """Sentence embeddings ``[B, H]`` from an encoder's or causal LM's output by ``method`` (module docstring)."""
    h = output.hidden_states
    if method == "cls":
        return h[-1][:, 0]
    if method == "last":  # the last real token, wherever the padding is
        last = mask.shape[1] - 1 - jnp.argmax(mask[:, ::-1], axis=1)
        return h[-1][jnp.arange(mask.shape[0]), last]
    if method == "pooler":
        pooled = getattr(output, "pooler_output", None)
        if pooled is None:
            raise ValueError("pooling='pooler' needs a model with a pooler; this one has none (use 'cls')")
        return pooled
    if method == "mean":
        return masked_mean(h[-1], mask)
    if method == "first_last_avg":
        return masked_mean((h[1] + h[-1]) / 2, mask)
    if method == "last2avg":
        return masked_mean((h[0] + h[-1]) / 2, mask)
    raise ValueError(f"unknown pooling {method!r}; expected one of {POOLINGS}")


class ClassificationHead(nn.Module):
    """Dropout -> Dense(num_labels) on a pooled ``[B, H]`` representation; ``num_labels = 1`` is regression."""

    num_labels: int
    dropout_rate: float = 0.1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, pooled: jax.Array, deterministic: bool = True) -> jax.Array:
        x = nn.Dropout(self.dropout_rate)(pooled, deterministic=deterministic)
        return nn.Dense(self.num_labels, dtype=self.dtype, kernel_init=nn.initializers.normal(0.02), name="classifier")(
            x
        ).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class MLMHeadNames:
    """Where an architecture's masked-LM head lives in its Hugging Face checkpoints (keys without the base-model
    prefix): the transform's ``dense`` and ``norm`` modules, the output ``bias`` key, the ``decoder`` module
    (tied to the word embeddings; its weight and bias repeat the embeddings and ``bias`` when a checkpoint stores
    them), the transform's ``activation`` (None: the config's ``hidden_act``) and LayerNorm ``norm_eps`` (None:
    the config's)."""

    dense: str
    norm: str
    bias: str
    decoder: str
    activation: str | None = None
    norm_eps: float | None = None


class MaskedLMHead(nn.Module):
    """The masked-LM head of a BERT-family encoder, its decoder tied to the word embeddings ``W [V, E]``::

        t      = LayerNorm(act(h W_d + b_d))          transform, [..., H] -> [..., E]  (E = embedding_size)
        logits = t Wᵀ + bias                          [..., V], float32

    Parameters: ``dense``, ``norm``, ``bias [V]``. ``W`` is passed in (:func:`isojax.models.word_embeddings` of the
    encoder's params), so the tie is explicit and gradients of the logits reach the encoder's embedding matrix.
    :func:`~isojax.models.hub.load_mlm_head` builds one with a checkpoint's params.

    Attributes:
      config: the encoder's :class:`~isojax.models.config.TransformerConfig`.
      names: the architecture's :class:`MLMHeadNames` (activation, LayerNorm epsilon).
      dtype: compute dtype (params are float32).
    """

    config: TransformerConfig
    names: MLMHeadNames
    dtype: Any = jnp.float32

    def setup(self):
        cfg = self.config
        eps = cfg.layer_norm_eps if self.names.norm_eps is None else self.names.norm_eps
        assert cfg.embedding_size is not None  # EncoderConfig.__post_init__ sets it
        self.dense = nn.Dense(cfg.embedding_size, dtype=self.dtype, name="dense")
        self.norm = nn.LayerNorm(epsilon=eps, dtype=self.dtype, name="norm")
        self.bias = self.param("bias", nn.initializers.zeros, (cfg.vocab_size,), jnp.float32)

    def transform(self, h):
        """``t = LayerNorm(act(dense(h)))``: the output vectors the tied decoder scores, ``[..., E]``."""
        act = ACTIVATIONS[self.names.activation or self.config.hidden_act]
        return self.norm(act(self.dense(h)))

    def __call__(self, h, word_embeddings):
        """``logits [..., V] = transform(h) Wᵀ + bias`` for hidden states ``h [..., H]`` and ``W [V, E]``."""
        t = self.transform(h)
        return (
            jnp.einsum("...e,ve->...v", t, word_embeddings.astype(t.dtype), preferred_element_type=jnp.float32)
            + self.bias
        )
