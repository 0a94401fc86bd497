"""Evaluation: running encoders over texts, layer-wise analysis."""

from isojax.eval.analysis import analyze_hidden_states, analyze_layers, hidden_state_batches
from isojax.eval.encode import encode

__all__ = ["analyze_hidden_states", "analyze_layers", "encode", "hidden_state_batches"]
