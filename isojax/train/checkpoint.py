"""Orbax checkpoints of a run: the whole :class:`~isojax.train.state.TrainState` and a JSON record.

Each checkpoint ``<output_dir>/checkpoints/<step>/`` holds ``state`` (params, optimiser state, IsoBN
statistics, balancer, PRNG key, step) and ``meta`` (stage, data position, the run's configuration). Orbax
writes into a temporary directory and renames it when complete, so a run killed while saving leaves no
half-written step behind. Once orbax has finished a step, process 0 records the sha256 of each of its files in
``<step>/sha256.json`` (written atomically); a step restored is checked against it first (a step without one, where
the run ended before it was written, is not checked). A step that cannot be read (a truncated or deleted file, a
file whose bytes changed) is skipped with a warning naming it and moved aside to ``<step>.unreadable.<time>`` (so
that the resumed run can write that step again), and the next older one is restored; ``keep`` checkpoints are kept
so that there is one to fall back to.

A checkpoint that lacks a field of the state is restored when the field is empty in the run that resumes (no
arrays: ``TrainState.constants`` of a run without a flow), the field keeping its empty value; one that lacks a
field holding arrays was written by an older isojax and is refused with a ``ValueError`` naming the fields (it is
not "unreadable": it stays where it is).

A state holding a non-finite floating-point value is never saved: :meth:`Checkpoints.save` raises instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from isojax._files import naming, write_json

log = logging.getLogger(__name__)

MANIFEST = "sha256.json"
"""The file of a finished step that holds the sha256 of each of its other files, by relative path."""


def nonfinite_arrays(state) -> list[str]:
    """Paths of the floating-point arrays of ``state`` that hold a NaN or an infinity; checked in one compiled pass
    on device.

    Args:
      state: a pytree of host or device arrays (sharded ones included); integer arrays are not checked.

    Returns:
      The ``/``-joined paths (``params/encoder/...``) of the non-finite arrays, in the pytree's order.

    Examples:
      >>> import numpy as np
      >>> nonfinite_arrays({"params": {"a": np.ones(2), "b": np.array([1.0, np.nan])}, "step": np.int32(3)})
      ['params/b']
    """
    leaves = [
        (jax.tree_util.keystr(path, simple=True, separator="/"), x)
        for path, x in jax.tree_util.tree_leaves_with_path(state)
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]
    finite = jax.device_get(jax.jit(_all_finite)([x for _, x in leaves]))
    return [path for (path, _), ok in zip(leaves, finite) if not ok]


def _all_finite(arrays: list) -> list:
    return [jnp.isfinite(x).all() for x in arrays]


def file_digests(directory: Path) -> dict[str, str]:
    """The sha256 (hex) of every file under ``directory`` but :data:`MANIFEST`, by path relative to it, sorted."""
    digests = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST):
        with open(path, "rb") as f:
            digests[path.relative_to(directory).as_posix()] = hashlib.file_digest(f, "sha256").hexdigest()
    return digests


class CorruptCheckpoint(ValueError):
    """A file of a checkpoint step differs from the sha256 recorded when the step was written, or is missing."""


def verify_step(directory: str, step: int) -> None:
    """:class:`CorruptCheckpoint` naming the first file of checkpoint ``step`` in ``directory`` that is missing or
    whose sha256 differs from the one recorded (nothing is checked without a record)."""
    manifest = Path(directory, str(step), MANIFEST)
    if not manifest.exists():
        return
    recorded, found = json.loads(manifest.read_text()), file_digests(manifest.parent)
    for name, digest in recorded.items():
        if found.get(name) != digest:
            state = "is missing" if name not in found else "does not match the sha256 recorded when it was written"
            raise CorruptCheckpoint(f"{manifest.parent / name} {state}")


class _OlderCheckpoint(ValueError):
    """A checkpoint without a field of the state that holds arrays (module docstring)."""


class Checkpoints:
    """Save and restore the checkpoints of a run in ``directory``.

    Args:
      directory: where the ``<step>/`` checkpoints live (created when missing).
      save_every: :meth:`due` is true at its multiples (0: never; the loop also saves at the end of each stage).
      keep: number of most recent checkpoints kept.
    """

    def __init__(self, directory: str, *, save_every: int = 0, keep: int = 3):
        self.directory = os.path.abspath(directory)
        self.save_every = save_every
        self._unrecorded: list[int] = []  # steps saved here whose digests are not written yet
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, cleanup_tmp_directories=True, save_interval_steps=1
        )
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
        )

    def steps(self) -> list[int]:
        """Steps with a finished checkpoint, ascending."""
        return list(self.manager.all_steps())

    def due(self, step: int) -> bool:
        """Whether ``step`` is a multiple of ``save_every``."""
        return bool(self.save_every) and step % self.save_every == 0

    def save(self, step: int, state, meta: dict) -> bool:
        """Save ``state`` and ``meta`` at ``step`` unless that step is already saved; asynchronous (call
        :meth:`wait` before reading it back or exiting). Returns whether a save was started. ``ValueError`` naming
        the arrays when ``state`` holds a NaN or an infinity (nothing is written)."""
        if step in self.manager.all_steps():
            return False
        self.wait()  # the previous step finished and its digests recorded (orbax waits for it anyway)
        bad = nonfinite_arrays(state)
        if bad:
            raise ValueError(
                f"refusing to checkpoint step {step} in {self.directory}: non-finite values in "
                f"{', '.join(bad[:5])}{f' and {len(bad) - 5} more arrays' if len(bad) > 5 else ''}"
            )
        with naming(self.directory):
            self.manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                force=True,
            )
        self._unrecorded.append(step)
        return True

    def wait(self) -> None:
        """Block until pending saves are written, and record the digests of the steps saved here (process 0; a step
        of an earlier process that ended before recording its digests is not vouched for now)."""
        with naming(self.directory):
            self.manager.wait_until_finished()
        kept = set(self.steps())
        if jax.process_index() == 0:
            for step in (s for s in self._unrecorded if s in kept):
                write_json(Path(self.directory, str(step), MANIFEST), file_digests(Path(self.directory, str(step))))
        self._unrecorded = []

    def verify(self, step: int) -> None:
        """:func:`verify_step` of ``step``."""
        verify_step(self.directory, step)

    def restore_latest(
        self, target: Callable[[dict], Any], check: Callable[[dict], None] | None = None
    ) -> tuple[int, Any, dict] | None:
        """``(step, state, meta)`` of the newest readable checkpoint, or None when there is none.

        ``check(meta)`` may refuse the checkpoints (its exception propagates: a checkpoint of another run is
        not "unreadable"); ``target(meta)`` gives the abstract state to restore into (its structure can depend
        on the stage recorded in ``meta``). Unreadable steps (a file that cannot be read, or does not match its
        recorded digest: :meth:`verify`) are skipped with a ``UserWarning`` naming the step and error, and moved
        aside to ``<step>.unreadable.<time>``. Python may then also print "Event loop is
        closed": a read of the failed step that finished after orbax closed its event loop (harmless).
        """
        unreadable = []
        for step in reversed(self.steps()):
            try:
                self.verify(step)
                meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
            except Exception as e:  # noqa: BLE001 - any read failure means: try the previous checkpoint
                unreadable.append(self._unreadable(step, e))
                continue
            if check is not None:
                check(meta)
            try:
                state = self._restore_state(step, target(meta))
            except _OlderCheckpoint:
                raise
            except Exception as e:  # noqa: BLE001
                unreadable.append(self._unreadable(step, e))
                continue
            self._set_aside(unreadable)
            log.info("restored checkpoint step %d from %s", step, self.directory)
            return step, state, meta
        self._set_aside(unreadable)
        return None

    def _restore_state(self, step: int, target):
        """The state of ``step`` restored into ``target`` (a dataclass of arrays or abstract arrays); fields the
        checkpoint lacks keep their ``target`` value when it holds no array, and are refused otherwise (module
        docstring)."""
        saved = self.manager.item_metadata(step)["state"]  # None when its metadata cannot be read
        missing = set() if saved is None else {f.name for f in dataclasses.fields(target) if f.name not in saved}
        older = sorted(name for name in missing if jax.tree.leaves(getattr(target, name)))
        if older:
            raise _OlderCheckpoint(
                f"checkpoint step {step} in {self.directory} has no {', '.join(older)}: it was written by an older "
                "isojax, whose checkpoints are not restored; start the run again in a new output directory"
            )
        fields = {f.name: getattr(target, f.name) for f in dataclasses.fields(target) if f.name not in missing}
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(fields if missing else target))
        ).state
        return target.replace(**restored) if missing else restored

    def _unreadable(self, step: int, error: Exception) -> int:
        warnings.warn(
            f"checkpoint step {step} in {self.directory} cannot be read ({type(error).__name__}: "
            f"{str(error)[:300]}); falling back to an earlier checkpoint (moving this one to "
            f"{step}.unreadable.<time>)",
            stacklevel=3,
        )
        return step

    def _set_aside(self, steps) -> None:
        if not steps:
            return
        if jax.process_index() == 0:
            for step in steps:
                path = os.path.join(self.directory, str(step))
                os.replace(path, f"{path}.unreadable.{time.strftime('%Y%m%d-%H%M%S')}")
        multihost_utils.sync_global_devices("isojax: unreadable checkpoints set aside")
        self.manager.reload()

    def close(self) -> None:
        """Write pending saves (and their digests) and release the manager."""
        self.wait()
        self.manager.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
