"""The package as a user gets it: the wheel built from this checkout, installed (not editable) into a fresh virtual
environment, runs ``isojax --help`` and a small ``isojax sts --limit 16`` from a directory outside the checkout.

To stay fast and offline, the fresh environment reads its dependencies from the test environment's site-packages
(one ``.pth`` line, which puts them after its own site-packages); isojax itself comes from the wheel alone."""

import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import scipy.stats

ROOT = Path(__file__).resolve().parents[1]


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=900, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(bin directory of the fresh environment, its environment variables, a working directory outside the
    checkout)`` with the wheel installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    # build from a copy of what the wheel is made of, so the build writes nothing into the checkout
    source = tmp / "source"
    shutil.copytree(ROOT / "isojax", source / "isojax", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
            str(source),
        ]
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("isojax-*.whl")
    env_dir = tmp / "env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    done = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)]
    )
    assert done.returncode == 0, done.stderr
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "test-dependencies.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    return env_dir / "bin", env, cwd


def test_the_wheel_holds_the_package_and_its_type_marker(installed):
    bin_dir, env, cwd = installed
    probe = (
        "import pathlib, isojax; p = pathlib.Path(isojax.__file__).parent; print(p); print((p / 'py.typed').is_file())"
    )
    out = _run([str(bin_dir / "python"), "-c", probe], env=env, cwd=cwd)
    assert out.returncode == 0, out.stderr
    package, typed = out.stdout.split()
    assert Path(package).is_relative_to(bin_dir.parent), package  # the installed copy, not the checkout
    assert typed == "True"


def test_isojax_help(installed):
    bin_dir, env, cwd = installed
    out = _run([str(bin_dir / "isojax"), "--help"], env=env, cwd=cwd)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: isojax")
    for command in ("sts", "analyze"):
        assert command in out.stdout


def test_isojax_sts_small(installed, default_model_path, shared_data_dir):
    bin_dir, env, cwd = installed
    args = ["sts", "--limit", "16", "--data-dir", str(shared_data_dir), "--methods", "raw,softdecay", "--quiet"]
    out = _run([str(bin_dir / "isojax"), *args, "--json", str(cwd / "sts.json")], env=env, cwd=cwd)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("default, mean pooling") and "pairs: stsb 16" in lines[0]
    result = json.loads((cwd / "sts.json").read_text())
    assert [(s["name"], s["split"], s["pairs"]) for s in result["sets"].values()] == [("stsb", "test", 16)]
    rows = result["sets"]["stsb"]["rows"]
    assert [r["method"] for r in rows][0] == "raw" and len(rows) == 2
    assert all(math.isfinite(r["spearman"]) for r in rows), rows
    # the installed package's raw Spearman is the one computed here, from the checkout, with scipy
    import isojax
    from isojax.data import load_sts
    from isojax.eval import sts

    data = load_sts("stsb", data_dir=shared_data_dir).head(16)
    a, b = sts.embed_pairs(*isojax.from_pretrained("default"), data)
    expected = 100 * scipy.stats.spearmanr(sts.cosine_scores(a, b), data.scores).statistic
    assert rows[0]["spearman"] == pytest.approx(expected, abs=1e-6)
