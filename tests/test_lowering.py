"""The lowering matrix (``python -m experiments.benchmarks.lowering``) as tests: isojax's entry points exported by the compiler
for TPU, CUDA, ROCm and CPU from this CPU host, each cell either lowering or refused up front by isojax.

References: JAX's own lowering rules (a platform a decomposition has no rule for: isojax's per-platform dispatch
has no branch for it, and JAX's lowering refuses that platform by name); the README's rule for ``method="auto"``
(read from the exported module: the custom calls of the decomposition it contains); the direct jitted call (the
deserialised CPU export must give the same numbers).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.benchmarks import lowering
from isojax.softdecay import soft_decay
from isojax.spectral import METHODS, select_method

X = jnp.asarray(np.random.default_rng(0).standard_normal((2, 40, 6)), jnp.float32)
MASK = jnp.broadcast_to(jnp.arange(40) < 30, (2, 40))


def _grad_soft_decay(method):
    return jax.grad(lambda x, a: soft_decay(x, a, mask=MASK, method=method).sum(), argnums=(0, 1))


@pytest.mark.parametrize("platform", lowering.PLATFORMS)
def test_decompositions_states_what_each_platform_lowers(platform):
    """Each of isojax's decompositions, forward and backward of soft_decay: lowers for each platform METHODS lists
    (float64 only in gram_eigh_f64, never in a TPU module), and for the others (gram_eigh_f64 on TPU, exported from
    this CPU host) is refused by JAX's lowering of the per-platform dispatch naming the platform, a refusal, not a
    failure inside a decomposition's lowering."""
    for method, platforms in METHODS.items():
        cell = lowering.lower_cell(_grad_soft_decay(method), (X, jnp.float32(-0.6)), platform)
        if platform in platforms:
            assert cell["status"] == "lowers", (method, cell["detail"])
            assert cell["float64"] == (method == "gram_eigh_f64"), method
        else:
            assert cell["status"] == "refused", (method, cell["detail"])
            assert cell["detail"].startswith("NotImplementedError: ") and f"platform {platform}" in cell["detail"]


def test_a_platform_without_the_named_method_is_refused_by_name():
    """The backend a call is traced on refuses a method it cannot lower with a ValueError naming the method, the
    platform and what it has: shown for TPU, the one platform without one of isojax's methods."""
    message = "method 'gram_eigh_f64' does not lower on tpu (only on cpu, cuda, rocm); on tpu choose 'auto' or one of"
    with pytest.raises(ValueError, match=re.escape(message)):
        select_method("gram_eigh_f64", X.shape, "tpu")


def _exported_text(f, platforms):
    return jax.export.export(jax.jit(f), platforms=platforms)(X, jnp.float32(-0.6)).mlir_module()


def _custom_calls(text):
    return set(re.findall(r"custom_call\s*@([\w.]+)", text))


def test_auto_on_tpu_holds_no_float64_and_cuda_uses_the_readme_strategy():
    """README, "SoftDecay's SVD": ``method="auto"`` is ``svd`` on CPU and TPU and, on GPUs, ``gram_eigh_f64`` when
    a side is longer than 32, else ``svd``. Read from the exported modules: on TPU the SVD (no float64, no eigh);
    on CUDA for [40, 6] matrices the float64 Gram eigh (cuSOLVER syevd on f64, no SVD call), for [32, 6] cuSOLVER's
    SVD (gesvdj). Before, ``auto`` was resolved from the host's backend (CPU): every platform got ``svd``."""
    f = _grad_soft_decay("auto")
    tpu = _exported_text(f, ("tpu",))
    assert not re.search(r"\bf64\b", tpu)
    svd_tpu = jax.export.export(jax.jit(lambda x: jnp.linalg.svd(x, full_matrices=False)), platforms=("tpu",))(X)
    assert _custom_calls(svd_tpu.mlir_module()) <= _custom_calls(tpu)  # TPU's own SVD (QDWH) is in the module
    assert select_method("auto", X.shape, "tpu") == "svd"
    cuda = _exported_text(f, ("cuda",))
    calls = _custom_calls(cuda)
    assert re.search(r"\bf64\b", cuda) and any("syevd" in c for c in calls), calls
    assert not any("gesvd" in c for c in calls), calls
    small = jax.export.export(jax.jit(lambda x: soft_decay(x, -0.6, method="auto")), platforms=("cuda",))(
        X[:, :32]
    ).mlir_module()
    assert any("gesvd" in c for c in _custom_calls(small)) and not re.search(r"\bf64\b", small)


def test_one_artifact_for_several_platforms_carries_each_choice_and_round_trips_on_cpu():
    """Exported once for (cpu, cuda, tpu): the module dispatches on the platform and contains both choices (the
    CUDA branch's float64 Gram route and the SVD); deserialised and called here (CPU) it equals the direct call."""
    f = jax.jit(lambda x, a: soft_decay(x, a, mask=MASK))
    exported = jax.export.export(f, platforms=("cpu", "cuda", "tpu"))(X, jnp.float32(-0.6))
    assert exported.platforms == ("cpu", "cuda", "tpu")
    calls = _custom_calls(exported.mlir_module())
    assert any("syevd" in c for c in calls) and any("gesdd" in c or "gesvd" in c for c in calls), calls
    restored = jax.export.deserialize(exported.serialize())
    np.testing.assert_array_equal(restored.call(X, jnp.float32(-0.6)), f(X, jnp.float32(-0.6)))


def test_every_public_function_has_a_matrix_entry():
    """A function added to the __all__ of metrics, losses, topology, calibrate or gradients must get a call in
    experiments.benchmarks.lowering (else the matrix would silently skip it)."""
    assert set(lowering.public_functions()) <= set(lowering._function_calls())


@pytest.mark.parametrize("group", ["functions", "models", "generate"])
@pytest.mark.slow
def test_entry_points_lower_for_tpu_and_round_trip_on_cpu(group):
    """Every public function (jit and grad), each architecture's forward (float32 and bfloat16) and generate (greedy
    and beam, GPT-2 and BART) lower for TPU (the platform with the fewest lowerings and no float64); a sample of
    them also for CUDA and ROCm, and on CPU their export round-trips to the direct call's numbers."""
    entries = lowering.GROUPS[group]()
    for i, entry in enumerate(entries):
        platforms = ("tpu", "cuda", "rocm", "cpu") if i % 8 == 0 else ("tpu",)
        row = lowering.run_entry(entry, platforms)
        assert "build_error" not in row, row
        for p, cell in row["cells"].items():
            assert cell["status"] == "lowers", (entry.name, p, cell["detail"])
            assert not (p == "tpu" and cell["float64"]), entry.name
        if "cpu" in platforms:
            assert "round_trip_error" not in row, row
            assert row["round_trip_max_abs_diff"] == 0.0, (entry.name, row["round_trip_max_abs_diff"])


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest gives 8 virtual CPUs)")
@pytest.mark.parametrize("layout", list(lowering.TRAIN_LAYOUTS))
def test_softdecay_train_step_lowers_without_host_callbacks(layout):
    """The real train step of ``isojax finetune --method softdecay`` (bf16, scanned layers, full remat) as its runner
    compiles it, on one device, over the 8-device mesh (data 8; data 4 x model 2; FSDP 8 and FSDP 4 x model 2) and
    under pmap: lowers for TPU and CUDA with no host callback and no float64 on TPU."""
    entry = lowering.Entry("train", layout, lambda: lowering.train_step("softdecay", layout), round_trip=False)
    row = lowering.run_entry(entry, ("tpu", "cuda"))
    assert "build_error" not in row, row
    for p, cell in row["cells"].items():
        assert cell["status"] == "lowers", (layout, p, cell["detail"])
        assert cell["host_callbacks"] == [] and not (p == "tpu" and cell["float64"]), (layout, p, cell)


def test_accelerator_command_writes_the_matrix_for_its_platform(monkeypatch, tmp_path):
    """experiments.accelerator --lowering: the matrix for the platform it runs on, round trip there, written beside
    the device's results (one entry here; the device run takes every group)."""
    from experiments import accelerator

    monkeypatch.setattr(lowering, "GROUPS", {"spectral": lambda: lowering.spectral_entries(["auto"])[:2]})
    prov = {"command": "python -m experiments.accelerator --lowering", "commit": "x", "machine": "m", "date": "d"}
    summary = accelerator.run_lowering(str(tmp_path), "cpu", "cpu", prov)
    assert summary["counts"] == {"lowers": 2, "refused": 0, "fails": 0} and summary["fails"] == []
    assert summary["round_trip_errors"] == [] and summary["largest_round_trip_diff"] == 0.0
    md = (tmp_path / "cpu-lowering.md").read_text()
    assert "| spectral | soft_decay[auto] | lowers |" in md and "`python -m experiments.accelerator --lowering`" in md
    assert not accelerator.parse_args([]).lowering and accelerator.parse_args(["--lowering"]).lowering
