"""Evaluation: running encoders over texts, layer-wise analysis."""

from isojax.eval.analysis import analyze_layers
from isojax.eval.encode import encode

__all__ = ["analyze_layers", "encode"]
