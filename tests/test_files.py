"""isojax's whole-or-nothing writes (isojax/_files.py) on a disk that fills: the error names the file."""

import subprocess
import sys


def test_a_write_that_fills_the_disk_names_its_file_and_leaves_no_part(tmp_path, tmpfs):
    small = tmp_path / "small"
    small.mkdir()
    target = small / "stats.json"
    code = (
        "import os, pathlib, sys\n"
        "from isojax._files import write_atomic\n"
        "target = pathlib.Path(sys.argv[1])\n"
        "try:\n"
        "    write_atomic(target, bytes(1 << 20))\n"
        "except OSError as e:\n"
        "    print(e, os.listdir(target.parent))\n"
    )
    result = subprocess.run(
        [*tmpfs("size=64k", small), sys.executable, "-c", code, str(target)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == f"[Errno 28] No space left on device: '{target}' []\n"
