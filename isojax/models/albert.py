"""ALBERT (Lan et al. 2020): factorised embeddings projected to the hidden size, and blocks shared across layers.

Layer ``i`` applies group ``i * num_hidden_groups // num_hidden_layers``; a group holds ``inner_group_num``
blocks applied in order. ``hidden_states`` records every block that runs, as Hugging Face's ALBERT does. Scanned
(``scan_layers=True``), each group is one loop over its layers, its blocks under ``encoder/group_{g}/block``.
"""

from isojax.models.checkpoint import HFNames
from isojax.models.config import TransformerConfig, bert_style_fields, bert_style_hf, check_absolute_positions
from isojax.models.encoder import EncoderModel
from isojax.models.heads import MLMHeadNames
from isojax.models.scan import ScanSegment
from isojax.models.stack import TransformerStack


class AlbertStack(TransformerStack):
    """Blocks ``group_{g}_layer_{j}``, shared by the layers of group g."""

    def layout(self):
        cfg = self.config
        groups, inner = cfg.num_hidden_groups, cfg.inner_group_num
        names = [f"group_{g}_layer_{j}" for g in range(groups) for j in range(inner)]
        order = [
            (i * groups // cfg.num_hidden_layers) * inner + j
            for i in range(cfg.num_hidden_layers)
            for j in range(inner)
        ]
        return names, order

    def scan_segments(self):
        """One loop per group over its ``num_hidden_layers // num_hidden_groups`` consecutive layers, each iteration
        running the group's ``inner_group_num`` shared blocks (parameters broadcast, not stacked)."""
        cfg = self.config
        per_group = cfg.num_hidden_layers // cfg.num_hidden_groups
        return [
            ScanSegment(
                f"group_{g}",
                [tuple(f"group_{g}_layer_{j}" for j in range(cfg.inner_group_num))] * per_group,
                stacked=False,
            )
            for g in range(cfg.num_hidden_groups)
        ]


class AlbertModel(EncoderModel):
    """ALBERT encoder with pooler; see :class:`isojax.models.encoder.EncoderModel` for inputs and outputs.

    Attributes:
      config: the model's :class:`~isojax.models.config.TransformerConfig` (``model_type="albert"``).

    The other fields (``dtype``, ``last_layer_transform``, ``add_pooling_layer``, ``transform_placement``,
    ``scan_layers``, ``remat``) are those of :class:`~isojax.models.encoder.EncoderModel`.
    """

    stack_cls = AlbertStack


def config_from_hf(hf) -> TransformerConfig:
    """:class:`TransformerConfig` of an ALBERT ``config.json`` (factorised embeddings, shared groups, no dropout
    after the feed-forward output)."""
    check_absolute_positions(hf)
    return TransformerConfig(
        **bert_style_fields(hf, hidden_act="gelu_new"),
        embedding_size=hf.get("embedding_size", 128),
        num_hidden_groups=hf.get("num_hidden_groups", 1),
        inner_group_num=hf.get("inner_group_num", 1),
        embedding_projection=True,
        ffn_output_dropout=False,
    )


def config_to_hf(config: TransformerConfig) -> dict:
    return bert_style_hf(
        config,
        "AlbertModel",
        embedding_size=config.embedding_size,
        num_hidden_groups=config.num_hidden_groups,
        inner_group_num=config.inner_group_num,
    )


ALBERT_HF_NAMES = HFNames(
    prefix="albert",
    rules=(
        (r"embeddings/norm", "embeddings.LayerNorm"),
        (r"embeddings/projection", "encoder.embedding_hidden_mapping_in"),
        (r"embeddings/(\w+)", r"embeddings.\1"),
        (r"encoder/group_(\d+)_layer_(\d+)/(?P<block>.+)", r"encoder.albert_layer_groups.\1.albert_layers.\2.{block}"),
        (r"pooler/dense", "pooler"),
    ),
    block={
        "attention/query": "attention.query",
        "attention/key": "attention.key",
        "attention/value": "attention.value",
        "attention/output": "attention.dense",
        "attention_norm": "attention.LayerNorm",
        "intermediate": "ffn",
        "output": "ffn_output",
        "output_norm": "full_layer_layer_norm",
    },
)

ALBERT_MLM_HEAD = MLMHeadNames(
    dense="predictions.dense", norm="predictions.LayerNorm", bias="predictions.bias", decoder="predictions.decoder"
)
