"""Files written whole or not at all: a fetched data asset, a finished run's ``results.json``, a campaign's records.

Their presence is what marks the work done (the asset fetched, the run finished), so a write that fails or is
killed halfway must not leave a file behind. The other JSON the library and the experiments write (a saved model's
``config.json``, an analysis, a result table's record) goes through :func:`write_json` too, and a saved model's
weights through :func:`atomic_target`: whoever reads them next never finds half of one.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_target(target: Path) -> Iterator[Path]:
    """The ``.part`` path to write ``target`` through, for writers that take a path (``safetensors``' ``save_file``).

    The parent directories are created; when the block ends the ``.part`` file is renamed onto ``target`` (atomic on
    one file system); when it raises, the ``.part`` file is removed and ``target`` is left as it was.

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
        yield part
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    part.replace(target)


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
