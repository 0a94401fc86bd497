"""Open built pages in headless Chromium, screenshot them and fail on what a reader would see as broken.

Usage: ``python docs/check_pages.py HTML_DIR SCREENSHOT_DIR`` (``make docs-check``). Pages: the index, one guide,
the API page of :func:`isojax.losses.istar_loss` and one notebook. For each page Chromium runs its scripts
(MathJax included) and the DOM it ends with is checked:

- not empty: the article holds at least 200 characters of text;
- no raw roles: no ``:func:`` / ``:class:`` / ``:math:``-style markup left in the text;
- no raw math: no ``$$``, ``\\(`` or ``\\[`` left in the text, and every math node was typeset by MathJax
  (an ``mjx-container`` per ``class="math"`` element);

and the screenshot must not be blank (more than 1 % of its pixels differ from the page background).
"""

import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

PAGES = {
    "index": "index.html",
    "guide": "guides/metrics_losses.html",
    "api_istar_loss": "_generated/api/isojax.losses.istar_loss.html",
    "notebook": "_generated/notebooks/token_uniformity.html",
}
ROLE = re.compile(r":(func|class|meth|mod|attr|data|obj|exc|math|ref|doc|term):`")
RAW_MATH = re.compile(r"\$\$|\\\(|\\\[")


class _Article(HTMLParser):
    """Text inside <article> (the page body in furo), skipping scripts and styles."""

    def __init__(self):
        super().__init__()
        self.depth, self.skip, self.text, self.math, self.typeset = 0, 0, [], 0, 0

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if tag == "article":
            self.depth += 1
        if tag in ("script", "style"):
            self.skip += 1
        if self.depth and "math" in classes:
            self.math += 1
        if self.depth and tag == "mjx-container":
            self.typeset += 1

    def handle_endtag(self, tag):
        if tag == "article":
            self.depth -= 1
        if tag in ("script", "style"):
            self.skip -= 1

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.text.append(data)


def chromium(*args):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        sys.exit("docs-check needs Chromium: apt-get install -y chromium")
    common = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=15000"]
    return subprocess.run([exe, *common, *args], capture_output=True, text=True, timeout=180)


def blank_fraction(png: Path) -> float:
    """Fraction of the screenshot's pixels equal to its bottom-right (background) pixel."""
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB"))
    return float((img == img[-5, -5]).all(axis=-1).mean())


def check(name: str, page: Path, shots: Path) -> list[str]:
    url = page.resolve().as_uri()
    dom = chromium("--dump-dom", url).stdout
    art = _Article()
    art.feed(dom)
    text = " ".join("".join(art.text).split())
    problems = []
    if len(text) < 200:
        problems.append(f"{name}: empty page ({len(text)} characters of text)")
    if m := ROLE.search(text):
        problems.append(f"{name}: raw role {m.group(0)!r}: …{text[max(0, m.start() - 60) : m.end() + 60]}…")
    if m := RAW_MATH.search(text):
        problems.append(f"{name}: raw math {m.group(0)!r}: …{text[max(0, m.start() - 60) : m.end() + 60]}…")
    if art.math and art.typeset < art.math:
        problems.append(f"{name}: {art.math - art.typeset} of {art.math} math nodes not typeset by MathJax")
    png = shots / f"{name}.png"
    chromium(f"--screenshot={png}", "--window-size=1280,1600", url)
    if not png.is_file():
        problems.append(f"{name}: no screenshot")
    elif (fraction := blank_fraction(png)) > 0.99:
        problems.append(f"{name}: screenshot is blank ({fraction:.1%} background)")
    print(f"{name}: {len(text)} characters, {art.math} math nodes ({art.typeset} typeset), {png}")
    return problems


def main(html: str, shots: str) -> None:
    html_dir, shot_dir = Path(html), Path(shots)
    shot_dir.mkdir(parents=True, exist_ok=True)
    problems = []
    for name, rel in PAGES.items():
        problems += check(name, html_dir / rel, shot_dir)
    if problems:
        sys.exit("docs-check failed:\n" + "\n".join(problems))
    print("docs-check: all pages rendered")


if __name__ == "__main__":
    main(*sys.argv[1:])
