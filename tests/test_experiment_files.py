"""The experiments' whole-or-nothing writes (experiments/tooling/files.py): a write that fails leaves the target as it
was and no ``.part`` file; JSON is written as ``json.dumps(indent=1)``."""

import json

import pytest

from experiments.tooling.files import write_atomic, write_json


def test_a_failed_write_leaves_the_old_file_and_no_part(tmp_path, monkeypatch):
    target = tmp_path / "run" / "campaign.json"
    write_json(target, {"wall_seconds": 1.5})
    assert target.read_text() == json.dumps({"wall_seconds": 1.5}, indent=1)
    with pytest.raises(TypeError):
        write_json(target, {"x": object()})
    original = type(target).write_bytes

    def full_disk(self, data):
        original(self, data[:3])
        raise OSError("No space left on device")

    monkeypatch.setattr(type(target), "write_bytes", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, b"half of the new")
    assert sorted(p.name for p in target.parent.iterdir()) == ["campaign.json"]
    assert json.loads(target.read_text()) == {"wall_seconds": 1.5}
