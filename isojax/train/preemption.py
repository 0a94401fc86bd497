"""Stopping a run on request at a step boundary, with a checkpoint, so that rerunning it resumes there.

A batch scheduler's wall-time limit, a preemptible TPU or GPU VM and ``kill`` all send ``SIGTERM`` before they end a
process. :func:`~isojax.train.loop.fit` watches for it: the step in flight finishes, the loop checkpoints that step,
writes a ``stop`` record to the log and raises :class:`TrainingStopped` (``isojax finetune`` exits with status 143,
``EXIT_STOPPED``, 128 + SIGTERM as a shell reports a process the signal ended). Nothing is lost but the time to start
again: the same command resumes from that checkpoint and sees exactly the batches that were left.

One process: :class:`StopRequest` installs a ``SIGTERM`` handler for the time of the run (main thread only; the
previous handler comes back afterwards). While the run loads (the model, the data, a checkpoint to resume from) the
handler raises :class:`TrainingStopped` at once: there is no step to checkpoint yet, and a scheduler's grace period
can be shorter than the loading; ``isojax finetune`` says so and exits with the same status 143. From the first step
on it only records the request, and the loop stops at the next step boundary. Several processes (``jax.distributed``):
JAX's preemption service catches the signal on whichever host gets it and agrees on one step at which every process
stops (``jax.experimental.multihost_utils.reached_preemption_sync_point``, asked after every step, as it requires),
so that all of them write the same checkpoint; no Python handler is installed there, since it would replace the
service's.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import jax
from jax.experimental import multihost_utils


class TrainingStopped(RuntimeError):
    """The run stopped at a step on ``SIGTERM``; rerunning the same configuration resumes from its checkpoint.

    Attributes:
      step: the global step the run stopped after; None where it stopped while loading, before its first step.
      checkpoint: the step of the newest checkpoint (``step`` unless the latest steps were skipped as non-finite);
        None where none was written, or where the run stopped while loading (none was looked for).
    """

    def __init__(self, message: str, *, step: int | None, checkpoint: int | None):
        super().__init__(message)
        self.step = step
        self.checkpoint = checkpoint


class StopRequest:
    """Whether a stop was requested, as a context manager around a run: first its loading, then its steps.

    Args:
      checkpoints: the run's checkpoint directory, named in the message of a stop while loading.

    Attributes:
      requested: whether ``SIGTERM`` came while the context was open (one process; with several, :meth:`reached`
        asks JAX's preemption service instead).

    Examples:
      >>> import os, signal
      >>> handler = signal.getsignal(signal.SIGTERM)
      >>> with StopRequest("run/checkpoints") as stop:
      ...     stop.stepping()  # loaded: the first step comes next
      ...     before = stop.reached(1)
      ...     os.kill(os.getpid(), signal.SIGTERM)  # recorded, not fatal
      ...     after = stop.reached(2)
      >>> before, after, signal.getsignal(signal.SIGTERM) is handler  # the previous handler is back
      (False, True, True)
      >>> with StopRequest("run/checkpoints") as stop:  # still loading
      ...     os.kill(os.getpid(), signal.SIGTERM)
      Traceback (most recent call last):
      ...
      isojax.train.preemption.TrainingStopped: stopped on SIGTERM while loading, before the first step; rerunning
        the same command resumes from the newest checkpoint in run/checkpoints, or starts over where there is none
      >>> signal.getsignal(signal.SIGTERM) is handler
      True
    """

    def __init__(self, checkpoints: str) -> None:
        self.requested = False
        self._checkpoints = checkpoints
        self._loading = True
        self._previous: Any = None
        self._installed = False

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self._loading:
            raise TrainingStopped(
                "stopped on SIGTERM while loading, before the first step; rerunning the same command resumes from "
                f"the newest checkpoint in {self._checkpoints}, or starts over where there is none",
                step=None,
                checkpoint=None,
            )

    def __enter__(self) -> StopRequest:
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._record)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def stepping(self) -> None:
        """The run has loaded and takes steps now: a ``SIGTERM`` from here on is only recorded, for :meth:`reached`
        (a ``SIGTERM`` that came while loading has raised already)."""
        self._loading = False

    def reached(self, step: int) -> bool:
        """Whether the run stops after global ``step``: asked once after every step, with increasing steps (the
        multi-process protocol counts on it). In one process: whether ``SIGTERM`` came since the run started."""
        if jax.process_count() > 1:  # the service off (jax_enable_preemption_service): never
            service = bool(jax.config.values["jax_enable_preemption_service"])
            return service and multihost_utils.reached_preemption_sync_point(step)
        return self.requested


__all__ = ["StopRequest", "TrainingStopped"]
