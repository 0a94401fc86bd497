"""isojax: study and correct anisotropy ("token uniformity") in BERT-family encoders, in JAX/Flax."""
from isojax.models import from_pretrained, save_pretrained

__version__ = "0.1.0"

__all__ = ["from_pretrained", "save_pretrained"]
