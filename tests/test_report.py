"""The HTML report of an analysis (isojax.eval.report): one self-contained file, checked in headless Chromium as the
docs are (docs/check_pages.py): a screenshot that is not blank, and no broken image."""

import base64
import importlib.util
import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from isojax.cli import main
from isojax.eval.analysis import analyze_hidden_states
from isojax.eval.report import FAMILIES, write_report

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_URI = "data:image/png;base64,"
INSTALL = "apt-get update && apt-get install -y chromium"
LAYERS, D = 4, 16
MASSIVE_DIMS = (3, 3, 9, 12)  # the dimension of each layer's massive activation: 3 columns in the map

_spec = importlib.util.spec_from_file_location("check_pages", ROOT / "docs" / "check_pages.py")
assert _spec is not None and _spec.loader is not None
check_pages = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_pages)


@pytest.fixture(scope="module")
def result():
    """An analysis of random states (no model): 6 texts, one shorter, a massive first token in a layer's dimension."""
    rng = np.random.default_rng(0)
    h = rng.normal(size=(6, LAYERS, 9, D)).astype(np.float32)
    for layer, dim in enumerate(MASSIVE_DIMS):
        h[:, layer, 0, dim] += 20.0 * (layer + 1)
    mask = np.ones((6, 9), bool)
    mask[1, 6:] = False
    result = analyze_hidden_states([(h, mask)])
    result.update(model="random-states", data="synthetic", date="2026-12-07")
    return result


@pytest.fixture(scope="module")
def report(result, tmp_path_factory) -> Path:
    return Path(write_report(result, str(tmp_path_factory.mktemp("report") / "sub" / "report.html")))


def per_layer_keys(result) -> list[str]:
    n = len(result["layers"])
    return [k for k, v in result.items() if k != "layers" and isinstance(v, list) and len(v) == n and np.ndim(v) == 1]


def image_sources(page: str) -> list[str]:
    return re.findall(r"<img\b[^>]*\bsrc=\"([^\"]*)\"", page)


def decoded_png(src: str) -> Image.Image:
    """The image of a ``data:image/png;base64,`` URI, decoded whole (a truncated or corrupt PNG raises)."""
    assert src.startswith(PNG_URI), src[:80]
    data = base64.b64decode(src[len(PNG_URI) :], validate=True)
    assert data[:8] == PNG_SIGNATURE
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_report_is_one_file_whose_figures_are_inlined_pngs_and_that_fetches_nothing(report, result):
    page = report.read_text()
    sources = image_sources(page)
    families = sum(any(c in result for c in columns) for _, columns in FAMILIES)
    assert len(sources) == families + 1  # a figure per family of measures and the CDF
    assert all(decoded_png(src).size[0] >= 600 for src in sources)
    outside = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    assert "http" not in outside.lower() and "//" not in outside
    assert outside.count("src=") == len(sources)  # every src is one of the inlined PNGs
    for fetching in ("<script", "<link", "<iframe", "<object", "<embed", "href=", "url(", "@import", "@font-face"):
        assert fetching not in outside.lower(), fetching


def test_report_shows_the_run_every_per_layer_key_and_the_massive_activation_map(report, result):
    page = report.read_text()
    keys = per_layer_keys(result)
    assert {"token_uni", "isoscore", "max_abs", "max_abs_dim", "max_abs_position", "rogue_top3_share"} <= set(keys)
    for key in keys:
        assert f"<code>{key}</code>" in page, key
    assert f"<td>{result['ev1'][2]:.4f}</td>" in page and f"<td>{result['max_abs_position'][1]}</td>" in page
    for text in ("random-states", "synthetic", "2026-12-07", f"<dd>{result['num_tokens']}</dd>"):
        assert text in page, text
    assert result["max_abs_dim"] == list(MASSIVE_DIMS)
    assert "<th>dim 12</th><th>dim 9</th><th>dim 3</th>" in page  # the map's columns, largest |h| first
    largest = np.asarray(result["massive_map"]["max_abs"])  # [layers, dims]: every layer in every such dimension
    assert largest.shape == (LAYERS, D) and page.count(", pos ") == LAYERS * D  # D = 16 = MAP_DIMENSIONS: all
    assert np.allclose(largest[np.arange(LAYERS), [2, 2, 1, 0]], 20.0 * np.arange(1, LAYERS + 1), atol=5.0)
    assert result["massive_map"]["position"][3][0] == 0  # layer 3's massive activation sits at the first token


def test_a_result_without_cdf_or_dimensions_says_what_is_missing(result, tmp_path):
    partial = {k: v for k, v in result.items() if k not in ("cdf", "massive_map")}
    page = Path(write_report(partial, str(tmp_path / "partial.html"))).read_text()
    assert "holds no CDF" in page and "no <code>massive_map</code>" in page and "dim " not in page
    bare = {"layers": [0, 1], "ev1": [0.5, 0.25]}
    page = Path(write_report(bare, str(tmp_path / "bare.html"), title="Two layers")).read_text()
    assert "<h1>Two layers</h1>" in page and "holds no massive-activation map" in page
    assert len(image_sources(page)) == 1


def test_a_per_layer_column_of_no_family_gets_a_figure_of_its_own(result, tmp_path):
    page = Path(write_report({**result, "new_measure": [0.1, 0.2, 0.3, 0.4]}, str(tmp_path / "r.html"))).read_text()
    families = sum(any(c in result for c in columns) for _, columns in FAMILIES)
    assert len(image_sources(page)) == families + 2 and "<code>new_measure</code>" in page


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    """Headless Chromium with the flags of the docs check, offline, with its own profile directory."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip(f"headless Chromium is not installed (Debian: {INSTALL})")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    return subprocess.run(
        [exe, *flags, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120, check=True
    )


# Run in the page once loaded (a copy of the report: the report itself holds no script): the number of images and
# of those the browser could not decode, written onto <body> for --dump-dom.
_COUNT_IMAGES = (
    "<script>window.addEventListener('load', () => { const all = Array.from(document.images);"
    " document.body.dataset.images = all.length;"
    " document.body.dataset.broken = all.filter(i => !i.complete || i.naturalWidth === 0).length; });</script>"
)


def images_and_broken(page: str, tmp_path: Path, name: str) -> tuple[int, int]:
    probe = tmp_path / f"{name}.html"
    probe.write_text(page.replace("</body>", _COUNT_IMAGES + "</body>"))
    dom = chromium("--virtual-time-budget=10000", "--dump-dom", probe.as_uri(), profile=tmp_path / "profile").stdout
    body = re.search(r'<body data-images="(\d+)" data-broken="(\d+)"', dom)
    assert body, dom[-500:]
    return int(body.group(1)), int(body.group(2))


@pytest.mark.slow
def test_headless_chromium_renders_the_report_not_blank_and_with_no_broken_image(report, tmp_path):
    page = report.read_text()
    shot = tmp_path / "report.png"
    chromium("--window-size=1280,2400", f"--screenshot={shot}", report.as_uri(), profile=tmp_path / "profile")
    image = np.asarray(Image.open(shot).convert("RGB"))
    assert image.shape == (2400, 1280, 3)
    assert check_pages.blank_fraction(shot) < 0.9  # more than a tenth of the page is not background
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 200  # text, curves, shading: not a blank page
    assert images_and_broken(page, tmp_path, "report") == (len(image_sources(page)), 0)
    # the probe does see a broken image: a page with one PNG cut short
    cut = re.sub(r'src="data:image/png;base64,[^"]*"', f'src="{PNG_URI}iVBORw0KGgo="', page, count=1)
    assert images_and_broken(cut, tmp_path, "cut")[1] == 1


def test_cli_analyze_writes_the_report(result, tmp_path, capsys, monkeypatch, default_model_path):
    """The wiring of ``isojax analyze --report``: the model's analysis and I(W) are faked (test_cli runs them)."""
    from isojax.eval import analysis, wordsim

    monkeypatch.setattr(analysis, "analyze_layers", lambda *args, **kwargs: dict(result))
    monkeypatch.setattr(wordsim, "embedding_isotropy", lambda w: {"I1": 0.5, "I2": 0.25})
    path = tmp_path / "reports" / "analysis.html"
    args = ["analyze", "--limit", "6", "--out", str(tmp_path / "out"), "--quiet", "--report", str(path)]
    assert main(args) == 0
    assert f"report: {path}" in capsys.readouterr().out
    page = path.read_text()
    assert "<h1>Anisotropy analysis: default (stsb test)</h1>" in page and "<dd>default</dd>" in page
    assert "<dt>input_embeddings</dt><dd>I1 0.5000, I2 0.2500</dd>" in page
    assert len(image_sources(page)) == sum(any(c in result for c in cs) for _, cs in FAMILIES) + 1
