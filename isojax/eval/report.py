"""One self-contained HTML report of a layer-wise analysis (:mod:`isojax.eval.analysis`): ``isojax analyze --report``.

The page holds the run (model, data, counts), the per-layer table of every per-layer key of the result, one figure of
per-layer curves per family of measures (:func:`isojax.eval.analysis.plot_layers`), the singular-value CDF
(:func:`isojax.eval.analysis.plot_cdf`) and a map of the massive activations (layers × the dimensions holding the
largest ``|h|``, over every real token). Figures are PNGs inlined as ``data:`` URIs and the style is inline: the file opens offline, with
no script, font or image fetched from anywhere.
"""

from __future__ import annotations

import base64
import datetime
import html
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

from isojax._files import write_atomic
from isojax.eval import analysis

# The per-layer curves, one figure per family: (title, columns); a family absent from the result is left out.
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Cosine uniformity", ("token_uni", "mean_cosine")),
    ("RBF uniformity", ("rbf_dis",)),
    ("Explained variance of the top directions", ("ev1", "ev2", "ev3")),
    ("Median normalised singular value", ("sv_median",)),
    ("Skewness of the normalised singular values", ("sv_skewness",)),
    ("Isotropy and anisotropy", ("isoscore", "anisotropy", "anisotropy_centered")),
    ("Rogue dimensions", ("rogue_top1_share", "rogue_top3_share")),
    ("Massive activations: max |h| / median |h| per text", ("massive_ratio",)),
    ("Massive activations: largest |h|", ("max_abs",)),
    ("Intrinsic dimension (TwoNN)", ("twonn",)),
    ("Attention sinks: α₁ and Sink_0.3", ("sink_alpha1", "sink_rate")),
)
_INDICES = ("max_abs_dim", "max_abs_position")  # per-layer integers: in the table and the map, not plotted
_RUN = (
    ("model", "model"),
    ("data", "data"),
    ("split", "split"),
    ("texts", "texts file"),
    ("num_texts", "texts"),
    ("num_sentence_texts", "texts of 2 or more tokens"),
    ("num_tokens", "content tokens"),
    ("date", "date"),
)

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1400px;
       padding: 0 1em; color: #222; background: #fff; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
th { background: #f3f3f3; } th code { font-weight: normal; color: #666; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dt { font-weight: bold; } dd { margin: 0; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 1em; }
.figures img { width: 100%; height: auto; border: 1px solid #eee; }
.note { color: #555; font-size: 0.9em; max-width: 60em; }
.scroll { overflow-x: auto; }
"""


def _per_layer_keys(result: dict) -> list[str]:
    """The keys of ``result`` holding one number per layer (``layers`` itself and ``cdf_grid`` aside), in order."""
    n = len(result["layers"])
    return [
        k
        for k, v in result.items()
        if k not in ("layers", "cdf_grid")
        and isinstance(v, list)
        and len(v) == n
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    ]


def _number(v) -> str:
    if isinstance(v, int):
        return str(v)
    return f"{v:.4f}" if math.isfinite(v) and abs(v) < 1e6 else f"{v:.4g}"


def _png(plot: Callable[..., str], result: dict, **options) -> str:
    """A ``data:`` URI of the PNG that ``plot(result, path, **options)`` writes."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(plot(result, str(Path(tmp) / "figure.png"), **options)).read_bytes()
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _figure(uri: str, caption: str) -> str:
    """An inlined figure (its caption is the plot's title, so only its ``alt`` text here)."""
    return f'<figure><img src="{uri}" alt="{html.escape(caption)}"></figure>'


def _header(key: str) -> str:
    label = analysis._HEADERS.get(key, key)
    return f"<th>{html.escape(label)}<br><code>{html.escape(key)}</code></th>"


def _run_section(result: dict) -> str:
    rows = [(label, result[k]) for k, label in _RUN if k in result]
    rows.append(("layers", f"{len(result['layers'])} (0 = the embedding output)"))
    shown = {k for k, _ in _RUN} | set(_per_layer_keys(result)) | {"layers", "cdf", "cdf_grid"}
    for k, v in result.items():  # any other scalar the result carries, e.g. the input embeddings' I(W)
        if k in shown:
            continue
        if isinstance(v, (str, int, float)):
            rows.append((k, v))
        elif isinstance(v, dict) and all(isinstance(x, (str, int, float)) for x in v.values()):
            rows.append((k, ", ".join(f"{n} {x if isinstance(x, str) else _number(x)}" for n, x in v.items())))
    written = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows.append(("report written", written))
    items = "".join(
        f"<dt>{html.escape(str(label))}</dt><dd>{html.escape(v if isinstance(v, str) else _number(v))}</dd>"
        for label, v in rows
    )
    return f"<h2>Run</h2><dl>{items}</dl>"


def _table(result: dict, keys: list[str]) -> str:
    head = "<tr><th>layer</th>" + "".join(_header(k) for k in keys) + "</tr>"
    body = "".join(
        f"<tr><th>{layer}</th>" + "".join(f"<td>{_number(result[k][i])}</td>" for k in keys) + "</tr>"
        for i, layer in enumerate(result["layers"])
    )
    return f'<h2>Per layer</h2><div class="scroll"><table>{head}{body}</table></div>'


def _massive_map(result: dict) -> str:
    """Layers × the dimensions of ``massive_map``: every cell the layer's largest ``|h|`` in that dimension, shaded by it,
    with the position of its token."""
    title = "<h2>Massive activations</h2>"
    found = result.get("massive_map")
    if not found:
        return title + '<p class="note">This result holds no massive-activation map (no <code>massive_map</code>).</p>'
    dims, values, positions = found["dims"], found["max_abs"], found["position"]
    top = max((v for row in values for v in row if math.isfinite(v)), default=1.0) or 1.0
    head = "<tr><th>layer</th>" + "".join(f"<th>dim {d}</th>" for d in dims) + "</tr>"
    rows = []
    for layer, row, where in zip(result["layers"], values, positions):
        cells = []
        for d, v, pos in zip(dims, row, where):
            shade = min(max(v / top, 0.0), 1.0) if math.isfinite(v) else 1.0
            color = "#fff" if shade > 0.55 else "#222"
            cells.append(
                f'<td style="background: rgba(200, 30, 30, {shade:.3f}); color: {color}" '
                f'title="layer {layer}, dim {d}: |h| {_number(v)} at position {pos}">{_number(v)}, pos {pos}</td>'
            )
        rows.append(f"<tr><th>{layer}</th>{''.join(cells)}</tr>")
    note = (
        f"The largest |h| of each layer in each of the {len(dims)} dimensions that hold the largest |h| of some "
        f"layer (ranked by it), over {html.escape(found.get('tokens', 'the tokens analysed'))}; “pos N”: the "
        "position of that token in its text (0 = the first). Sun et al. (2024) find massive activations in a few "
        "fixed dimensions, at the first token and at delimiters."
    )
    return f'{title}<p class="note">{note}</p><div class="scroll"><table>{head}{"".join(rows)}</table></div>'


def write_report(result: dict, path: str, *, title: str = "") -> str:
    """Write the analysis ``result`` as one self-contained HTML page (module docstring): figures inlined as PNG
    ``data:`` URIs, no script, and nothing fetched from the network.

    Args:
      result: an :func:`isojax.eval.analysis.analyze_layers` or :func:`~isojax.eval.analysis.analyze_hidden_states`
        dict (``layers`` and any of its columns; ``cdf`` and ``cdf_grid`` for the CDF figure, ``massive_map`` for
        the massive-activation map), with ``model``, ``data``, ``split``, ``texts``, ``date``
        shown when present.
      path: the HTML file to write (overwritten; missing directories are created; written whole or not at all).
      title: the page title; ``""``: "Anisotropy analysis" and the model when the result names one.

    Returns:
      ``path``.

    Examples:
      >>> import os.path, tempfile
      >>> result = {"layers": [0, 1], "ev1": [0.5, 0.25], "max_abs": [3.0, 40.0]}
      >>> result["massive_map"] = {"dims": [2, 7], "max_abs": [[1.0, 3.0], [40.0, 2.0]], "position": [[0, 4], [0, 1]]}
      >>> path = write_report(result, os.path.join(tempfile.mkdtemp(), "report.html"))
      >>> page = open(path).read()
      >>> page.count('<img src="data:image/png;base64,'), "<script" in page  # the figures of EV_1 and max |h|, inlined
      (2, False)
      >>> "<th>dim 2</th><th>dim 7</th>" in page, "40.0000, pos 0" in page  # the map: dimensions, |h| and position
      (True, True)
    """
    keys = _per_layer_keys(result)
    title = title or "Anisotropy analysis" + (f": {result['model']}" if "model" in result else "")
    figures = []
    plotted: set[str] = set(_INDICES)
    for caption, family in FAMILIES:
        columns = tuple(c for c in family if c in keys)
        plotted.update(family)
        if columns:
            figures.append(_figure(_png(analysis.plot_layers, result, title=caption, columns=columns), caption))
    for k in keys:  # a per-layer measure of no family (a column added later): a figure of its own
        if k not in plotted:
            figures.append(_figure(_png(analysis.plot_layers, result, title=k, columns=(k,)), k))
    if "cdf" in result and "cdf_grid" in result:
        caption = "Empirical CDF of the normalised singular values σ / σ₁ per layer"
        cdf = _png(analysis.plot_cdf, result, title=caption)
        cdf_section = f'<h2>Singular-value CDF</h2><div class="figures">{_figure(cdf, caption)}</div>'
    else:
        cdf_section = '<h2>Singular-value CDF</h2><p class="note">This result holds no CDF (no <code>cdf</code>).</p>'
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        + _run_section(result)
        + _table(result, keys)
        + "<h2>Per-layer curves</h2>"
        + f'<div class="figures">{"".join(figures)}</div>'
        + cdf_section
        + _massive_map(result)
        + "</body></html>\n"
    )
    write_atomic(Path(path), page.encode("utf-8"))
    return path


__all__ = ["write_report"]
