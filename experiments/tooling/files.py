"""Files the experiments write whole or not at all: a result table and its JSON, a campaign run's ``config.json``,
``campaign.json`` and ``sittings.json`` (whose presence marks the run's state, so a write killed halfway must not
leave one behind)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_atomic(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` (its parent directories created) through ``target`` + ``.part``, renamed onto
    ``target`` once written; a write that raises removes the ``.part`` file and leaves ``target`` as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    try:
        part.write_bytes(data)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    part.replace(target)


def write_json(target: Path, payload: Any) -> None:
    """Write ``payload`` as JSON (``indent=1``) through :func:`write_atomic`; serialised first, so a payload ``json``
    cannot encode raises ``TypeError`` and writes nothing."""
    write_atomic(target, json.dumps(payload, indent=1).encode())
