"""Stopping a run on request at a step boundary, with a checkpoint, so that rerunning it resumes there.

A batch scheduler's wall-time limit, a preemptible TPU or GPU VM and ``kill`` all send ``SIGTERM`` before they end a
process; Ctrl-C sends ``SIGINT``. :func:`~isojax.train.loop.fit` treats both alike: the step in flight finishes, the
loop checkpoints that step (whatever ``save_every`` says), writes a ``stop`` record to the log and raises
:class:`TrainingStopped` (``isojax finetune`` exits with 128 + the signal's number, as a shell reports a process the
signal ended: 143 for ``SIGTERM``, 130 for ``SIGINT``). Nothing is lost but the time to start again: the same command
resumes from that checkpoint and sees exactly the batches that were left. A second signal while the run stops is
ignored (with a line on stderr) and restores the signal's default action, so a third ends the process at once; the
checkpoint being written is then left unfinished, which orbax never reads, and the earlier ones stay as they were.

One process: :class:`StopRequest` installs a handler for both signals for the time of the run (main thread only;
the previous handlers come back afterwards). While the run loads (the model, the data, a checkpoint to resume from)
the handler raises :class:`TrainingStopped` at once: there is no step to checkpoint yet, and a scheduler's grace
period can be shorter than the loading; ``isojax finetune`` says so and exits with the same status. From the first
step on it only records the request, and the loop stops at the next step boundary. Several processes
(``jax.distributed``): JAX's preemption service catches ``SIGTERM`` on whichever host gets it and agrees on one step
at which every process stops (``jax.experimental.multihost_utils.reached_preemption_sync_point``, asked after every
step, as it requires), so that all of them write the same checkpoint; no Python ``SIGTERM`` handler is installed
there, since it would replace the service's. A ``SIGINT`` to one of the processes is passed on to the service as a
``SIGTERM`` to that process, so Ctrl-C stops every process at one checkpointed step too (the status is 143 there: the
service does not say which signal it got). With the service off, both signals end the processes as Python does.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

import jax
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop a run at a checkpoint (module docstring)."""


class TrainingStopped(RuntimeError):
    """The run stopped at a step on ``SIGTERM`` or ``SIGINT``; rerunning the same configuration resumes from its
    checkpoint.

    Attributes:
      signum: the signal that stopped the run (``signal.SIGTERM`` or ``signal.SIGINT``).
      step: the global step the run stopped after; None where it stopped while loading, before its first step.
      checkpoint: the step of the newest checkpoint (``step`` unless the latest steps were skipped as non-finite);
        None where none was written, or where the run stopped while loading (none was looked for).
    """

    def __init__(self, message: str, *, step: int | None, checkpoint: int | None, signum: int = signal.SIGTERM):
        super().__init__(message)
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint


class StopRequest:
    """Whether a stop was requested, as a context manager around a run: first its loading, then its steps.

    Args:
      checkpoints: the run's checkpoint directory, named in the message of a stop while loading.

    Attributes:
      requested: whether ``SIGTERM`` or ``SIGINT`` came while the context was open (one process; with several,
        :meth:`reached` asks JAX's preemption service instead).
      signum: the first of those signals, or None.

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
      >>> with StopRequest("run/checkpoints") as stop:  # Ctrl-C
      ...     stop.stepping()
      ...     os.kill(os.getpid(), signal.SIGINT)
      ...     stop.reached(1), stop.name
      (True, 'SIGINT')
    """

    def __init__(self, checkpoints: str) -> None:
        self.requested = False
        self.signum: int | None = None
        self._checkpoints = checkpoints
        self._loading = True
        self._previous: dict[int, Any] = {}

    @property
    def name(self) -> str:
        """The name of the signal that stopped the run (``"SIGTERM"`` before any)."""
        return signal.Signals(self.signum or signal.SIGTERM).name

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:  # a second signal while the run stops: the next one takes the default action
            signal.signal(signum, signal.SIG_DFL)
            print(
                f"{signal.Signals(signum).name} again: the run stops once the checkpoint of its last step is written; "
                "once more ends it at once (an unfinished checkpoint is then dropped, the earlier ones kept)",
                file=sys.stderr,
                flush=True,
            )
            return
        self.requested, self.signum = True, signum
        if self._loading:
            raise TrainingStopped(
                f"stopped on {self.name} while loading, before the first step; rerunning the same command resumes "
                f"from the newest checkpoint in {self._checkpoints}, or starts over where there is none",
                step=None,
                checkpoint=None,
                signum=signum,
            )

    def _to_service(self, signum: int, frame: FrameType | None) -> None:
        """Several processes: pass a ``SIGINT`` on to JAX's preemption service as this process's ``SIGTERM``."""
        os.kill(os.getpid(), signal.SIGTERM)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():
            return self
        if jax.process_count() == 1:
            self._previous = {s: signal.signal(s, self._record) for s in SIGNALS}
        elif jax.config.values["jax_enable_preemption_service"]:
            self._previous = {signal.SIGINT: signal.signal(signal.SIGINT, self._to_service)}
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def stepping(self) -> None:
        """The run has loaded and takes steps now: a signal from here on is only recorded, for :meth:`reached` (one
        that came while loading has raised already)."""
        self._loading = False

    def reached(self, step: int) -> bool:
        """Whether the run stops after global ``step``: asked once after every step, with increasing steps (the
        multi-process protocol counts on it). In one process: whether ``SIGTERM`` or ``SIGINT`` came since the run
        started."""
        if jax.process_count() > 1:  # the service off (jax_enable_preemption_service): never
            service = bool(jax.config.values["jax_enable_preemption_service"])
            return service and multihost_utils.reached_preemption_sync_point(step)
        return self.requested


__all__ = ["SIGNALS", "StopRequest", "TrainingStopped"]
