"""Run logs: one JSON object per line (``log.jsonl``), and PNG curves of the task metric and anisotropy.

Records carry ``"kind"`` and ``"time"`` (wall clock): ``"train"`` (step, stage, epoch, learning rate, ``seconds`` of
training since the previous train record, loss and its terms, gradient norm, the method's learnt state:
:data:`METHOD_STATE`), ``"eval"`` (step, stage, task
metrics, isotropy metrics), ``"resume"`` (step restored, checkpoint). :func:`epoch_seconds` reads a stage's training
time per epoch from them.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings

METHOD_STATE = ("softdecay@", "isotropy_layer/", "isobn/", "balancer/")
"""Prefixes of the train records' keys that hold a method's learnt state (:func:`isojax.train.model.method_state`:
SoftDecay's α, the Isotropy Layer's and IsoBN's summaries, the joint-loss balancer's weights)."""


def method_state(records: list[dict]) -> dict[str, dict[str, float]]:
    """The learnt state at the end of each stage.

    Args:
      records: log records, as :meth:`JsonLog.read` returns.

    Returns:
      Stage name -> the :data:`METHOD_STATE` values of that stage's last train record; a stage without any is left
      out.

    Examples:
      >>> method_state([{"kind": "train", "stage": "finetune", "loss": 1.0, "softdecay@output/alpha": -0.2},
      ...               {"kind": "train", "stage": "finetune", "loss": 0.9, "softdecay@output/alpha": -0.25}])
      {'finetune': {'softdecay@output/alpha': -0.25}}
    """
    state: dict[str, dict[str, float]] = {}
    for r in records:
        values = {k: v for k, v in r.items() if k.startswith(METHOD_STATE)}
        if r.get("kind") == "train" and values:
            state[r["stage"]] = values
    return state


class JsonLog:
    """Append-only JSON-lines log at ``path`` (a resumed run appends to the same file).

    Creating it makes the parent directory; the file itself appears at the first :meth:`write`. Each record is
    appended whole, in one ``write``; a last line that a killed process or a full disk left torn is cut off (with a
    warning) before the first record of this process, so that it starts a line, and :meth:`read` skips it (and any
    other line that is not JSON), warning with the line numbers.

    Args:
      path: the ``log.jsonl`` file.

    Attributes:
      path: as given.

    Examples:
      >>> import tempfile
      >>> log = JsonLog(os.path.join(tempfile.mkdtemp(), "run", "log.jsonl"))
      >>> log.read()
      []
      >>> log.write({"kind": "eval", "step": 10, "accuracy": 81.5})
      >>> [{k: v for k, v in r.items() if k != "time"} for r in log.read()]
      [{'kind': 'eval', 'step': 10, 'accuracy': 81.5}]
      >>> with open(log.path, "a") as f:  # a process killed in the middle of a record
      ...     _ = f.write('{"kind": "train", "st')
      >>> import warnings
      >>> with warnings.catch_warnings(record=True) as caught:  # the next process's first record
      ...     JsonLog(log.path).write({"kind": "resume", "step": 10})
      >>> str(caught[0].message).split(": ", 1)[1]
      'its last line was cut short (21 bytes: a write that did not finish); removed'
      >>> [r["kind"] for r in log.read()]
      ['eval', 'resume']
    """

    def __init__(self, path: str):
        self.path = path
        self._mended = False
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def write(self, record: dict) -> None:
        """Append ``record`` with its wall-clock ``time`` (seconds since the epoch), as one whole line."""
        line = (json.dumps({**record, "time": round(time.time(), 3)}, allow_nan=True) + "\n").encode()
        if not self._mended:
            self._mend()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def _mend(self) -> None:
        """Cut a torn last line (a write that did not finish), so that the next record starts a line."""
        self._mended = True
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                f.truncate(keep)
                warnings.warn(
                    f"{self.path}: its last line was cut short ({len(data) - keep} bytes: a write that did not "
                    "finish); removed",
                    stacklevel=3,
                )

    def read(self) -> list[dict]:
        """Every record, in order ([] before the first write); lines that are not JSON are skipped with a warning."""
        if not os.path.exists(self.path):
            return []
        records, bad = [], []
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                try:
                    records.extend([json.loads(line)] if line.strip() else [])
                except json.JSONDecodeError:
                    bad.append(number)
        if bad:
            lines = ", ".join(map(str, bad))
            warnings.warn(f"{self.path}: line(s) {lines} are not JSON (torn or damaged); skipped", stacklevel=2)
        return records


def latest_evaluations(records: list[dict]) -> list[dict]:
    """The ``eval`` records, one per step (a step evaluated again after a resume keeps its last record).

    Args:
      records: log records (dicts with ``kind``; ``eval`` records also with ``step``), as :meth:`JsonLog.read` returns.

    Returns:
      the ``eval`` records sorted by step, the last one of each step.

    Examples:
      >>> records = [
      ...     {"kind": "eval", "step": 20, "accuracy": 80.0},
      ...     {"kind": "train", "step": 20, "loss": 0.4},
      ...     {"kind": "resume", "step": 10},
      ...     {"kind": "eval", "step": 20, "accuracy": 82.0},
      ...     {"kind": "eval", "step": 10, "accuracy": 75.0},
      ... ]
      >>> [(r["step"], r["accuracy"]) for r in latest_evaluations(records)]
      [(10, 75.0), (20, 82.0)]
    """
    by_step = {r["step"]: r for r in records if r.get("kind") == "eval"}
    return [by_step[s] for s in sorted(by_step)]


def epoch_seconds(records: list[dict], stage: str, per_epoch: int) -> dict:
    """Training wall time of ``stage`` from the ``train`` records of a run's log: ``seconds_per_epoch`` is the mean
    seconds per step times the steps of an epoch, leaving out the first interval of each session (it holds the
    step's compilation); ``compile_and_first_seconds`` sums those first intervals.

    Args:
      records: the run's ``log.jsonl`` records (``train`` records with ``seconds``; ``resume`` records start a
        session).
      stage: the stage's name.
      per_epoch: batches per epoch.

    Returns:
      ``{"seconds_per_epoch": ..., "compile_and_first_seconds": ...}``, or None without train records.

    Examples:
      Ten steps of 5 s (the compilation) then twenty of 0.1 s each, 100 steps an epoch:

      >>> train = [{"kind": "train", "stage": "finetune", "step": s, "seconds": t} for s, t in ((10, 5.0), (20, 1.0), (30, 1.0))]
      >>> epoch_seconds(train, "finetune", per_epoch=100)
      {'seconds_per_epoch': 10.0, 'compile_and_first_seconds': 5.0}
    """
    train = [r for r in records if r.get("kind") == "resume" or (r.get("kind") == "train" and r["stage"] == stage)]
    steady, first, steps, last_step = 0.0, 0.0, 0, None
    for record in train:
        if record["kind"] == "resume":
            last_step = None
            continue
        if "seconds" not in record:
            continue
        if last_step is None:  # the first interval after a (re)start holds the compilation
            first += record["seconds"]
        else:
            steady += record["seconds"]
            steps += record["step"] - last_step
        last_step = record["step"]
    if steps == 0:
        return {"seconds_per_epoch": None, "compile_and_first_seconds": round(first, 3) if first else None}
    return {"seconds_per_epoch": round(steady / steps * per_epoch, 3), "compile_and_first_seconds": round(first, 3)}


def plot_curves(
    records: list[dict],
    path: str,
    *,
    metrics: tuple[str, ...],
    isotropy: tuple[str, ...] = ("anisotropy", "anisotropy_centered", "isoscore"),
    title: str = "",
) -> str:
    """PNG of the task ``metrics`` and the ``isotropy`` measures over training steps.

    Two panels (1100 × 440 pixels: 10 × 4 in at 110 dpi): the task ``metrics`` (left) and the ``isotropy`` measures
    (right) of the :func:`latest_evaluations`, and a third (1650 × 440) of the method's learnt state
    (:data:`METHOD_STATE` keys of the train records: SoftDecay's α, ...) where the records hold any. With gradient
    statistics in the train records (``--log-gradients``:
    ``grad_norm/<group>`` and ``embedding_grad/*`` keys), two more panels (2200 × 440): the gradient norm of each
    parameter group (log scale) and the word-embedding gradient's alignment with the mean embedding direction. Stage
    boundaries (eval records with ``stage_end``, the last excepted) are dotted lines; a missing value is a gap.

    Args:
      records: log records, as :meth:`JsonLog.read` returns.
      path: the PNG file to write (its directory is created).
      metrics: keys of the eval records to plot on the left (values ×100, e.g. ``("accuracy",)``).
      isotropy: keys plotted on the right; by default the anisotropy, raw and centered, and IsoScore of the
        evaluated embeddings.
      title: a figure title; ``""``: none.

    Returns:
      ``path``.

    Examples:
      >>> import struct, tempfile
      >>> records = [{"kind": "eval", "step": s, "accuracy": a, "isoscore": i} for s, a, i in ((0, 50, 0.1), (10, 70, 0.2))]
      >>> path = plot_curves(records, os.path.join(tempfile.mkdtemp(), "curves.png"), metrics=("accuracy",))
      >>> png = open(path, "rb").read()
      >>> png[:8] == b"\\x89PNG\\r\\n\\x1a\\n", struct.unpack(">II", png[16:24])  # signature; IHDR width, height
      (True, (1100, 440))
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = latest_evaluations(records)
    steps = [r["step"] for r in evals]
    train = [r for r in records if r.get("kind") == "train" and "embedding_grad/mean_cosine" in r]
    learnt = [r for r in records if r.get("kind") == "train" and any(k.startswith(METHOD_STATE) for k in r)]
    panels = 2 + bool(learnt) + 2 * bool(train)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    left, right = axes[:2]
    for metric in metrics:
        left.plot(steps, [r.get(metric, math.nan) for r in evals], marker="o", label=metric)
    left.set(xlabel="step", ylabel="×100", title="task metric (dev)")
    left.legend()
    for key, style in zip(isotropy, ("-o", "--o", ":s", "-.^")):
        right.plot(steps, [r.get(key, math.nan) for r in evals], style, label=key.replace("_", " "))
    right.set(xlabel="step", title="isotropy")
    right.legend()
    if learnt:
        keys = sorted({k for r in learnt for k in r if k.startswith(METHOD_STATE)})
        for key in keys:
            axes[2].plot([r["step"] for r in learnt], [r.get(key, math.nan) for r in learnt], label=key, linewidth=1)
        axes[2].set(xlabel="step", title="learnt method state")
        axes[2].legend(fontsize=7)
    if train:
        _plot_gradients(train, *axes[-2:])
    for ax in axes:
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


def _plot_gradients(train: list[dict], norms, alignment) -> None:
    """The two gradient panels of :func:`plot_curves` from train records holding the statistics."""
    steps = [r["step"] for r in train]
    groups = sorted({k for r in train for k in r if k.startswith("grad_norm/")})
    for key in groups:
        norms.plot(steps, [r.get(key, math.nan) for r in train], label=key.split("/", 1)[1], linewidth=1)
    norms.set(xlabel="step", yscale="log", title="gradient norm per parameter group")
    norms.legend(fontsize=6, ncol=2)
    for key, style in (
        ("embedding_grad/mean_cosine", "-"),
        ("embedding_grad/principal_cosine", "--"),
        ("embedding_grad/coherence", ":"),
    ):
        alignment.plot(steps, [r.get(key, math.nan) for r in train], style, label=key.split("/", 1)[1])
    alignment.set(xlabel="step", title="word-embedding gradient vs mean direction")
    alignment.legend(fontsize=7)


__all__ = ["METHOD_STATE", "JsonLog", "epoch_seconds", "latest_evaluations", "method_state", "plot_curves"]
