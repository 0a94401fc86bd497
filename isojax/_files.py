"""Files written whole or not at all: a fetched data asset, a finished run's ``results.json``, a campaign's records.

Their presence is what marks the work done (the asset fetched, the run finished), so a write that fails or is
killed halfway must not leave a file behind. The other JSON the library and the experiments write (a saved model's
``config.json``, an analysis, a result table's record) goes through :func:`write_json` too, and a saved model's
weights through :func:`atomic_target`: whoever reads them next never finds half of one. The data reaches the disk
(``fsync``) before the rename, and the rename before the write returns (``fsync`` of the directory), so a power cut
leaves the old file or the new one.

:func:`exclusive_directory` gives a directory one writer at a time (a run's output directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOCK_FILE = ".lock"
"""The file in a directory that :func:`exclusive_directory` locks; it holds the holder's ``pid on host``."""


class DirectoryInUse(OSError):
    """Another live process holds the lock of the directory (:func:`exclusive_directory`)."""


def fsync_path(path: Path) -> None:
    """Flush ``path`` (a file, or a directory: its entries) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_directory(directory: Path) -> Iterator[None]:
    """Hold an advisory lock (``flock``) on ``directory``'s :data:`LOCK_FILE` for the block: one writer at a time.

    The directory (and its parents) is created first, so a directory that cannot be written fails here, before any
    work. The operating system releases the lock when its process ends however it ends (``kill -9`` included), so a
    dead holder never leaves a stale lock behind; the file stays, holding the last holder's ``pid on host``.

    Args:
      directory: the directory (a ``Path``).

    Raises:
      DirectoryInUse: another process holds the lock; the message names the directory and that process.
      OSError: the directory cannot be written (read-only file system, permissions), naming it.

    Examples:
      >>> import tempfile, pathlib
      >>> run = pathlib.Path(tempfile.mkdtemp()) / "run"
      >>> with exclusive_directory(run):
      ...     with exclusive_directory(run):
      ...         pass
      Traceback (most recent call last):
      isojax._files.DirectoryInUse: ... is in use by another process (pid ... on ...): ...
      >>> with exclusive_directory(run):  # free again once the block ends
      ...     pass
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise _named(e, f"{directory} cannot be written ({e.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise DirectoryInUse(
                f"{directory} is in use by another process (pid {holder}): wait for it to end, or choose another "
                "directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _named(error: OSError, message: str) -> OSError:
    """An ``OSError`` of ``error``'s kind and ``errno`` whose message is ``message``."""
    named = type(error)(message)
    named.errno = error.errno
    return named


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise an ``OSError`` with an errno but no file name (a write or close that fails on a full disk says only
    ``[Errno 28] No space left on device``) as the same error naming ``path``.

    Args:
      path: the file or directory being written.

    Yields:
      ``None``.

    Examples:
      >>> import errno
      >>> with naming("/runs/a/checkpoints"):
      ...     raise OSError(errno.ENOSPC, "No space left on device")
      Traceback (most recent call last):
      OSError: [Errno 28] No space left on device: '/runs/a/checkpoints'
    """
    try:
        yield
    except OSError as e:
        if e.errno is None or e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, os.fspath(path)) from e


@contextlib.contextmanager
def atomic_target(target: Path) -> Iterator[Path]:
    """The ``.part`` path to write ``target`` through, for writers that take a path (``safetensors``' ``save_file``).

    The parent directories are created; when the block ends the ``.part`` file is flushed to the disk and renamed onto
    ``target`` (atomic on one file system), and the directory flushed; when it raises, the ``.part`` file is removed
    and ``target`` is left as it was.

    Args:
      target: the file to write (a ``Path``).

    Yields:
      ``target`` with ``.part`` appended to its name.

    Examples:
      >>> import tempfile, pathlib
      >>> target = pathlib.Path(tempfile.mkdtemp()) / "model" / "model.safetensors"
      >>> with atomic_target(target) as part:
      ...     _ = part.write_bytes(b"weights")
      ...     part.name, target.exists()
      ('model.safetensors.part', False)
      >>> with atomic_target(target) as part:
      ...     _ = part.write_bytes(b"half of the new")
      ...     raise OSError("No space left on device")
      Traceback (most recent call last):
      OSError: No space left on device
      >>> target.read_bytes(), sorted(p.name for p in target.parent.iterdir())
      (b'weights', ['model.safetensors'])
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    try:
        with naming(target):
            yield part
            fsync_path(part)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    part.replace(target)
    fsync_path(target.parent)


def write_atomic(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` through a ``.part`` file (:func:`atomic_target`), so that a half-written file never
    looks complete.

    Args:
      target: the file to write (a ``Path``).
      data: its content.

    Returns:
      ``None``.

    Examples:
      >>> import tempfile, pathlib
      >>> target = pathlib.Path(tempfile.mkdtemp()) / "wordsim" / "men.txt"
      >>> write_atomic(target, b"sun\\tsunlight\\t50\\n")
      >>> target.read_bytes(), sorted(p.name for p in target.parent.iterdir())
      (b'sun\\tsunlight\\t50\\n', ['men.txt'])
    """
    with atomic_target(target) as part:
        part.write_bytes(data)


def write_json(target: Path, payload: Any) -> None:
    """Write ``payload`` as JSON (``indent=1``) through :func:`write_atomic`.

    It is serialised before anything is written, so a payload ``json`` cannot encode raises ``TypeError`` and leaves
    no file (neither ``target`` nor its ``.part``).

    Args:
      target: the file to write (a ``Path``).
      payload: what ``json.dumps`` takes.

    Returns:
      ``None``.

    Examples:
      >>> import tempfile, pathlib
      >>> target = pathlib.Path(tempfile.mkdtemp()) / "run" / "campaign.json"
      >>> write_json(target, {"wall_seconds": 1.5})
      >>> target.read_text()
      '{\\n "wall_seconds": 1.5\\n}'
      >>> write_json(target.with_name("bad.json"), {"x": object()})
      Traceback (most recent call last):
      TypeError: Object of type object is not JSON serializable
      >>> sorted(p.name for p in target.parent.iterdir())
      ['campaign.json']
    """
    write_atomic(target, json.dumps(payload, indent=1).encode())
