"""isojax: study and correct anisotropy ("token uniformity") in BERT-family encoders, in JAX/Flax.

Public API (see README.md): ``from_pretrained``/``save_pretrained`` (Flax BERT, RoBERTa, ALBERT, DistilBERT, MPNet,
GPT-2, BART, mBART from Hugging Face checkpoints; decoding in ``isojax.models.generate``), ``soft_decay``/``SoftDecay``,
and the modules ``metrics``, ``stats`` (streaming statistics), ``topology``, ``losses``, ``calibrate``, ``spectral``,
``gradients``.
"""

from isojax._transformers_notice import drop_torch_notice

drop_torch_notice()  # before anything imports transformers

from typing import TYPE_CHECKING  # noqa: E402

from isojax._lazy import lazy_attributes  # noqa: E402

if TYPE_CHECKING:
    from isojax import calibrate, gradients, losses, metrics, spectral, stats, topology
    from isojax.models import from_pretrained, save_pretrained
    from isojax.softdecay import SoftDecay, soft_decay

__getattr__ = lazy_attributes(
    "isojax",
    {
        **{m: f"isojax.{m}" for m in ("calibrate", "gradients", "losses", "metrics", "spectral", "stats", "topology")},
        "from_pretrained": "isojax.models",
        "save_pretrained": "isojax.models",
        "SoftDecay": "isojax.softdecay",
        "soft_decay": "isojax.softdecay",
    },
)

__version__ = "0.1.0"

__all__ = [
    "SoftDecay",
    "calibrate",
    "from_pretrained",
    "gradients",
    "losses",
    "metrics",
    "save_pretrained",
    "soft_decay",
    "spectral",
    "stats",
    "topology",
]
