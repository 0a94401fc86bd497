"""The documentation builds strictly (warnings and broken cross-references are errors), covers every public name,
and the README stays short; the notebooks store no local paths and no warnings in their outputs."""

import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

ROOT = Path(__file__).resolve().parents[1]


def _public_objects():
    """``{id: {qualified names}}`` of every object named in the ``__all__`` of a public isojax module (no leading
    underscore in its dotted name), modules left out: an object re-exported by a package has several names."""
    import pkgutil

    import isojax

    names = [isojax.__name__] + [i.name for i in pkgutil.walk_packages(isojax.__path__, "isojax.")]
    objects = {}
    for name in names:
        if any(part.startswith("_") for part in name.split(".")):
            continue
        module = importlib.import_module(name)
        for k in getattr(module, "__all__", ()):
            if not inspect.ismodule(obj := getattr(module, k)):
                objects.setdefault(id(obj), set()).add(f"{name}.{k}")
    return objects


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    require("sphinx")
    require("myst_nb")
    require("furo")
    out = tmp_path_factory.mktemp("docs")
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going", "-q", "-E"]
    cmd += ["-d", str(out / "doctrees"), str(ROOT / "docs"), str(out / "html")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    return proc, out / "html"


@pytest.mark.slow
def test_docs_build_without_warnings(built):
    proc, _ = built
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr[-8000:]


def test_every_public_name_has_an_api_page(built):
    _, html = built
    objects = _public_objects()
    assert len(objects) > 250
    missing = sorted(
        min(names)
        for names in objects.values()
        if not any((html / "_generated" / "api" / f"{n}.html").is_file() for n in names)
    )
    assert not missing  # every public object has a page under one of its names


def test_istar_loss_page_shows_its_arguments(built):
    _, html = built
    page = (html / "_generated" / "api" / "isojax.losses.istar_loss.html").read_text()
    assert "zeta" in page and "Parameters" in page  # napoleon's Args, rendered as a field list
    assert ":func:`" not in page and ":math:`" not in page


def test_math_is_handed_to_local_mathjax(built):
    _, html = built
    page = (html / "guides" / "metrics_losses.html").read_text()
    assert 'class="math' in page  # $...$ became a math node for MathJax, not literal text
    assert "_static/tex-svg.js" in page and "cdn" not in page.lower()


def test_results_pages_and_notebooks_are_built(built):
    _, html = built
    results = sorted((ROOT / "experiments" / "results").rglob("*.md"))
    for f in results:
        stem = str(f.relative_to(ROOT / "experiments" / "results").with_suffix("")).replace("/", "-")
        assert (html / "_generated" / "results" / f"{stem}.html").is_file(), stem
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        assert (html / "_generated" / "notebooks" / f"{nb.stem}.html").is_file(), nb.name


def test_readme_fits_on_two_screens():
    assert len((ROOT / "README.md").read_text()) <= 10_000


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_outputs_hold_no_local_paths_or_warnings(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            assert not (out["output_type"] == "stream" and out["name"] == "stderr"), "".join(out["text"])[:300]
            text = json.dumps(out)
            for bad in ("/work/", "/home/", "/tmp/", "site-packages", ".venv", "Warning:"):
                assert bad not in text, f"{path.name}: {bad!r} in an output"


def _readme_python_blocks():
    text = (ROOT / "README.md").read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


def test_readme_optax_example_runs_and_its_regulariser_matches_numpy():
    """The README's first example, run as written; its I-STAR term against IsoScore* written in numpy."""
    import numpy as np

    scope = {}
    exec(_readme_python_blocks()[0], scope)
    z = np.asarray(scope["x"] @ scope["params"]["w"], np.float64)
    # IsoScore* with C0 = I and zeta = 0.2 (Rudman & Eickhoff), by Rudman et al.'s steps: eigenvalues of the shrunk
    # sample covariance (ddof=1) scaled to norm sqrt(d), isotropy defect, fraction of dimensions used
    d = z.shape[1]
    eig = np.linalg.eigvalsh((1 - 0.2) * np.cov(z, rowvar=False) + 0.2 * np.eye(d))
    eig = np.sqrt(d) * eig / np.linalg.norm(eig)
    defect = np.linalg.norm(eig - 1) / np.sqrt(2 * (d - np.sqrt(d)))
    k = (d - defect**2 * (d - np.sqrt(d))) ** 2 / d
    iso = (k - 1) / (d - 1)
    task = np.mean((z - np.asarray(scope["x"], np.float64)) ** 2)
    assert np.isfinite(float(scope["loss"]))
    np.testing.assert_allclose(float(scope["loss_fn"](scope["params"], scope["x"])), task + 0.5 * (1 - iso), rtol=1e-4)


def test_readme_softdecay_example_runs(default_model_path, capsys):
    """The README's second example, run as written on the bundled model; SoftDecay keeps the shape."""
    scope = {}
    exec(_readme_python_blocks()[1], scope)
    assert scope["y"].shape == scope["h"].shape
    assert capsys.readouterr().out.strip()


def test_getting_started_first_lines_run(default_model_path, capsys):
    """Getting started's first ten lines, run as written on the bundled model."""
    text = (ROOT / "docs" / "getting_started.md").read_text()
    block = text.split("## A first ten lines", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    scope = {}
    exec(block, scope)
    assert scope["y"].shape == scope["h"].shape
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
