"""Reproductions of the five papers' tables and figures (each writes ``experiments/results/<name>.{md,json}``), the
GLUE campaign and its paired design, and the papers' own fine-tuning configurations (``configs/``)."""
