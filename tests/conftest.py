"""Test configuration: 8 virtual CPU devices when the backend is CPU, no network, float32 matmuls.

The same suite runs on GPU/TPU with ``JAX_PLATFORMS=cuda`` (or ``tpu``); then the real devices are used.
"""
import os

if os.environ.get("JAX_PLATFORMS", "cpu") == "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("ISOJAX_DATA_DIR", None)  # tests name their data directory; a user's setting must not leak in

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# The original data releases (STS12-16, SICK, GLUE) live beside the repository, as ../shared/data (README there).
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """A fresh ``datasets`` cache per test, so that local files are really read each time."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def require_offline():
    """Hub paths are exercised as on a machine without the Hub: this file sets HF_DATASETS_OFFLINE=1 before
    ``datasets`` is imported, so a Hub id fails at once with ConnectionError."""
    import datasets

    assert datasets.config.HF_HUB_OFFLINE, "run the suite with HF_DATASETS_OFFLINE=1 (tests/conftest.py sets it)"


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """``../shared/data`` beside the repository. Absent, the test is skipped with the reason, except under
    ``CI=true``, where CI keeps the data there: then absence is a failure."""
    if not SHARED_DATA.is_dir():
        message = f"the original data releases are not in {SHARED_DATA} (../shared/data beside the repository)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "; CI=true, where they must be present")
        pytest.skip(message)
    return SHARED_DATA
