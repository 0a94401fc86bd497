"""MPNet (Song et al. 2020): BERT's post-LayerNorm blocks, RoBERTa's position ids, no token types, and a
relative-position bias shared by every layer.

One table ``relative_attention_bias [num_buckets, heads]`` gives the bias added to the scaled attention scores
of every block: ``scores[b, h, i, j] += table[bucket(j - i), h]``. The bucket of a relative position
``r = j - i`` (T5's scheme, bidirectional, 32 buckets, max distance 128; Hugging Face computes it with 32
buckets whatever the config says, and so does isojax)::

    n = -r;  half = 16;  ret = half if n < 0 else 0;  n = |n|
    ret += n                                                      if n < 8
    ret += min(8 + floor(ln(n / 8) / ln(128 / 8) * 8), half - 1)   otherwise
"""

import math

import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from isojax.models.checkpoint import HFNames
from isojax.models.config import TransformerConfig, bert_style_fields, bert_style_hf
from isojax.models.embeddings import Embed
from isojax.models.encoder import EncoderModel
from isojax.models.heads import MLMHeadNames
from isojax.models.roberta import RobertaEmbeddings
from isojax.models.stack import TransformerStack

_BUCKETS, _MAX_DISTANCE = 32, 128  # Hugging Face's MPNetEncoder.compute_position_bias defaults


def relative_position_bucket(relative_position, num_buckets: int = _BUCKETS, max_distance: int = _MAX_DISTANCE):
    """Bucket of each relative position ``j - i`` (integer array of any shape), see the module docstring."""
    n = -relative_position
    half = num_buckets // 2
    ret = jnp.where(n < 0, half, 0)
    n = jnp.abs(n)
    exact = half // 2
    scaled = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / exact) / math.log(max_distance / exact)
    large = exact + (scaled * (half - exact)).astype(jnp.int32)  # truncation, as torch's .to(long)
    return ret + jnp.where(n < exact, n, jnp.minimum(large, half - 1))


class MPNetStack(TransformerStack):
    """BERT's block stack plus the shared relative-position bias (module docstring)."""

    def attention_bias(self, length: int):
        cfg = self.config
        table = Embed(
            cfg.relative_attention_num_buckets,
            cfg.num_attention_heads,
            cfg.initializer_range,
            self.dtype,
            name="relative_attention_bias",
        )
        positions = jnp.arange(length)
        values = table(relative_position_bucket(positions[None, :] - positions[:, None]))  # [L, L, heads]
        return jnp.transpose(values, (2, 0, 1))[None]


class MPNetModel(EncoderModel):
    """MPNet encoder with pooler (``token_type_ids`` must be None); see :class:`isojax.models.encoder.EncoderModel`.

    Attributes:
      config: the model's :class:`~isojax.models.config.TransformerConfig` (``model_type="mpnet"``).

    The other fields (``dtype``, ``last_layer_transform``, ``add_pooling_layer``, ``transform_placement``,
    ``scan_layers``, ``remat``) are those of :class:`~isojax.models.encoder.EncoderModel`.
    """

    embeddings_cls = RobertaEmbeddings
    stack_cls = MPNetStack


def config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of an MPNet ``config.json`` (no token types; positions after ``pad_token_id``)."""
    fields = bert_style_fields(hf, type_vocab_size=0, pad_token_id=1, layer_norm_eps=1e-5)
    return TransformerConfig(
        **fields,
        position_offset=fields["pad_token_id"] + 1,
        relative_attention_num_buckets=hf.get("relative_attention_num_buckets", _BUCKETS),
    )


def config_to_hf(config: TransformerConfig) -> dict:
    out = bert_style_hf(config, "MPNetModel", relative_attention_num_buckets=config.relative_attention_num_buckets)
    del out["type_vocab_size"]
    return out


MPNET_HF_NAMES = HFNames(
    prefix="mpnet",
    rules=(
        (r"embeddings/norm", "embeddings.LayerNorm"),
        (r"embeddings/(\w+)", r"embeddings.\1"),
        (r"encoder/relative_attention_bias", "encoder.relative_attention_bias"),
        (r"encoder/layer_(\d+)/(?P<block>.+)", r"encoder.layer.\1.{block}"),
        (r"pooler/dense", "pooler.dense"),
    ),
    block={
        "attention/query": "attention.attn.q",
        "attention/key": "attention.attn.k",
        "attention/value": "attention.attn.v",
        "attention/output": "attention.attn.o",
        "attention_norm": "attention.LayerNorm",
        "intermediate": "intermediate.dense",
        "output": "output.dense",
        "output_norm": "output.LayerNorm",
    },
)

MPNET_PARTITION_RULES = ((r"encoder/relative_attention_bias/embedding$", P()),)

MPNET_MLM_HEAD = MLMHeadNames(
    dense="lm_head.dense", norm="lm_head.layer_norm", bias="lm_head.bias", decoder="lm_head.decoder", activation="gelu"
)
