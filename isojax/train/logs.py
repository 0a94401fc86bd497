"""Run logs: one JSON object per line (``log.jsonl``), and PNG curves of the task metric and anisotropy.

Records carry ``"kind"`` and ``"time"`` (wall clock): ``"train"`` (step, stage, epoch, learning rate, ``seconds`` of
training since the previous train record, loss and its terms, gradient norm), ``"eval"`` (step, stage, task
metrics, isotropy metrics), ``"resume"`` (step restored, checkpoint).
"""
from __future__ import annotations

import json
import math
import os
import time


class JsonLog:
    """Append-only JSON-lines log at ``path`` (a resumed run appends to the same file)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def write(self, record: dict) -> None:
        """Append ``record`` with its wall-clock ``time`` (seconds since the epoch)."""
        with open(self.path, "a") as f:
            f.write(json.dumps({**record, "time": round(time.time(), 3)}, allow_nan=True) + "\n")

    def read(self) -> list[dict]:
        """Every record, in order ([] before the first write)."""
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [json.loads(line) for line in f if line.strip()]


def latest_evaluations(records: list[dict]) -> list[dict]:
    """The ``eval`` records, one per step (a step evaluated again after a resume keeps its last record)."""
    by_step = {r["step"]: r for r in records if r.get("kind") == "eval"}
    return [by_step[s] for s in sorted(by_step)]


def plot_curves(records: list[dict], path: str, *, metrics: tuple[str, ...],
                isotropy: tuple[str, ...] = ("anisotropy", "anisotropy_centered", "isoscore"), title: str = "") -> str:
    """PNG with the task ``metrics`` (left) and the ``isotropy`` measures (right; by default the anisotropy, raw and
    centered, and IsoScore of the evaluated embeddings) over training steps; stage boundaries are drawn as dotted
    lines. Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = latest_evaluations(records)
    steps = [r["step"] for r in evals]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for metric in metrics:
        left.plot(steps, [r.get(metric, math.nan) for r in evals], marker="o", label=metric)
    left.set(xlabel="step", ylabel="×100", title="task metric (dev)")
    left.legend()
    for key, style in zip(isotropy, ("-o", "--o", ":s", "-.^")):
        right.plot(steps, [r.get(key, math.nan) for r in evals], style, label=key.replace("_", " "))
    right.set(xlabel="step", title="isotropy")
    right.legend()
    for ax in (left, right):
        ax.grid(alpha=0.3)
        for boundary in sorted({r["step"] for r in evals if r.get("stage_end")})[:-1]:
            ax.axvline(boundary, color="grey", linestyle=":")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["JsonLog", "latest_evaluations", "plot_curves"]
