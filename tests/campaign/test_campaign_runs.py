"""The GLUE campaign (experiments/campaign/, ``python -m experiments.campaign``) end to end on a tiny configuration:
two tasks, two methods, two seeds, a tiny random BERT and tiny GLUE files in the download script's format.

References: scipy.stats.ttest_ind on the runs' own results.json values (the table's p-values) and
scipy.stats.ttest_rel on made-up numbers (the paired p-values); the run records (a campaign resumed after SIGKILL
redoes no finished run and resumes the killed one from its checkpoint); the first step's task loss of a baseline
and of regulariser runs (equal when their dropout masks are, unequal without dropout).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import scipy.stats
import transformers
from conftest import read_json, read_jsonl, save_tiny_encoder

from experiments.campaign import cli, runner, schedule, spec
from experiments.reproductions import glue_pairing
from experiments.tooling.report import ROOT

WORDS = "the a man dog runs plays guitar park red blue car house sleeps eats green big small".split()


def _sentence(rng, n):
    return " ".join(rng.choice(WORDS, n))


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, default_model_path):
    root = tmp_path_factory.mktemp("campaign")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path))
    model = save_tiny_encoder(root / "model", tokenizer)
    rng = np.random.default_rng(0)
    rte, mrpc = root / "data" / "glue" / "RTE", root / "data" / "glue" / "MRPC"
    rte.mkdir(parents=True)
    mrpc.mkdir(parents=True)
    for split, n in (("train", 24), ("dev", 8)):
        (rte / f"{split}.tsv").write_text(
            "index\tsentence1\tsentence2\tlabel\n"
            + "".join(
                f"{i}\t{_sentence(rng, 6)}\t{_sentence(rng, 4)}\t{['entailment', 'not_entailment'][i % 2]}\n"
                for i in range(n)
            )
        )
        (mrpc / f"{split}.tsv").write_text(
            "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
            + "".join(f"{i % 2}\t{i}\t{i + 100}\t{_sentence(rng, 5)}\t{_sentence(rng, 5)}\n" for i in range(n)),
            encoding="utf-8",
        )
    config = {
        "title": "tiny campaign",
        "papers": "test",
        "model": model,
        "tasks": ["rte", "mrpc"],
        "seeds": [0, 1],
        "evals_per_epoch": 1,
        "protocols": {
            "p": {
                "source": "test protocol",
                "defaults": {
                    "optim.steps": 6,
                    "optim.batch_size": 8,
                    "optim.eval_batch_size": 8,
                    "task.max_length": 24,
                    "optim.learning_rate": 1e-3,
                    "logging.log_every": 1,
                    "logging.save_every": 2,
                    "placement.devices": 1,
                },
                "baseline": "baseline",
                "methods": {
                    "baseline": {"method.name": "baseline"},
                    "cosine": {"method.name": "baseline", "method.regularizers": ["cosine=1.0"]},
                },
            }
        },
    }
    path = root / "config.json"
    path.write_text(json.dumps(config))
    return root, path


def _argv(root, path, *extra):
    return [
        "--config",
        str(path),
        "--data-dir",
        str(root / "data"),
        "--runs-dir",
        str(root / "runs"),
        "--out",
        str(root / "out"),
        *extra,
    ]


@pytest.mark.slow
def test_campaign_runs_reports_and_resumes_after_a_kill(campaign):
    root, path = campaign
    # first sitting: one task only
    assert cli.main(_argv(root, path, "--only", "task=rte")) == 0
    runs = spec.expand(json.loads(path.read_text()))
    rte_done = {
        r.key: os.path.getmtime(os.path.join(r.directory(str(root / "runs")), "results.json"))
        for r in runs
        if r.task == "rte"
    }
    assert len(rte_done) == 4
    # second sitting: killed while the first MRPC run is past its first checkpoint
    child = subprocess.Popen(
        [sys.executable, "-m", "experiments.campaign", *_argv(root, path)],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first = next(r for r in runs if r.task == "mrpc")
    checkpoints = os.path.join(first.directory(str(root / "runs")), "checkpoints")
    try:
        deadline = time.time() + 240
        while not (os.path.isdir(checkpoints) and any(n.isdigit() for n in os.listdir(checkpoints))):
            assert time.time() < deadline and child.poll() is None, "the run wrote no checkpoint"
            time.sleep(0.2)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert not os.path.exists(os.path.join(first.directory(str(root / "runs")), "results.json"))
    # third sitting: finishes the rest without redoing a finished run
    assert cli.main(_argv(root, path)) == 0
    for run in runs:
        results = os.path.join(run.directory(str(root / "runs")), "results.json")
        assert os.path.exists(results)
        if run.key in rte_done:
            assert os.path.getmtime(results) == rte_done[run.key]
    log = read_jsonl(os.path.join(first.directory(str(root / "runs")), "log.jsonl"))
    assert any(r["kind"] == "resume" for r in log)

    report = json.loads((root / "out" / "glue_methods.json").read_text())
    assert {(t["task"], t["protocol"]) for t in report["tables"]} == {("rte", "p"), ("mrpc", "p")}
    for table in report["tables"]:
        rows = {row["method"]: row for row in table["rows"]}
        assert set(rows) == {"baseline", "cosine"} and rows["cosine"]["seeds"] == [0, 1]
        metric = "accuracy"
        values = {
            m: [
                read_json(os.path.join(r.directory(str(root / "runs")), "results.json"))["stages"]["finetune"][metric]
                for r in runs
                if r.task == table["task"] and r.method == m
            ]
            for m in ("baseline", "cosine")
        }
        assert rows["cosine"][metric]["values"] == values["cosine"]
        a, b = np.asarray(values["cosine"]), np.asarray(values["baseline"])
        want = None if a.std() == 0 and b.std() == 0 else scipy.stats.ttest_ind(a, b).pvalue
        got = rows["cosine"][metric]["p_vs_baseline"]
        assert (got is None and want is None) or got == pytest.approx(want, rel=1e-12)
        # one commit, one dropout stream: both seeds pair (values in seed order)
        assert rows["cosine"][metric]["paired_seeds"] == [0, 1]
        want = None if np.ptp(a - b) == 0 else scipy.stats.ttest_rel(a, b).pvalue
        got = rows["cosine"][metric]["paired_p_vs_baseline"]
        assert (got is None and want is None) or got == pytest.approx(want, rel=1e-12)
        assert all(s is not None and s > 0 for s in rows["baseline"]["seconds_per_epoch"])
    text = (root / "out" / "glue_methods.md").read_text()
    assert "## rte, protocol p (4 of 4 runs finished)" in text and "## mrpc, protocol p" in text
    assert "accuracy (p; paired p)" in text and "## Summary by paper" not in text  # the tiny config has none
    assert (root / "out" / "glue_methods_runs" / "p" / "rte" / "cosine" / "seed1" / "results.json").exists()
    assert (root / "out" / "glue_methods_curves.png").stat().st_size > 1000


def test_relative_paths_are_the_callers_not_the_repository_roots(campaign, monkeypatch, capsys):
    # the runs are processes started in the repository root; relative directories must still mean the caller's
    root, path = campaign
    monkeypatch.chdir(root)
    assert (
        cli.main(
            [
                "--config",
                str(path),
                "--data-dir",
                "data",
                "--runs-dir",
                "elsewhere",
                "--out",
                "out_dry",
                "--only",
                "task=rte",
                "seed=0",
                "--dry-run",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    directory = root / "elsewhere" / "p" / "rte" / "cosine" / "seed0"
    assert f"finetune --config {directory / 'config.json'}\n" in printed
    assert f'"logging.output_dir": "{directory}"' in printed and f'"task.data_dir": "{root / "data"}"' in printed


def _first_step_task_loss(root, model, out, *extra):
    from isojax import cli

    assert (
        cli.main(
            [
                "finetune",
                "--model",
                model,
                "--task",
                "rte",
                "--data-dir",
                str(root / "data"),
                "--out",
                str(root / out),
                "--steps",
                "1",
                "--batch-size",
                "8",
                "--eval-batch-size",
                "8",
                "--eval-limit",
                "8",
                "--max-length",
                "24",
                "--log-every",
                "1",
                "--save-every",
                "0",
                "--devices",
                "1",
                "--seed",
                "3",
                "--no-progress",
                *extra,
            ]
        )
        == 0
    )
    (record,) = [r for r in read_jsonl(root / out / "log.jsonl") if r["kind"] == "train"]
    return record


def test_a_regulariser_run_draws_the_baselines_dropout_masks(campaign):
    # Step 1 runs on the same initial parameters in every method, so with equal masks its task loss is equal;
    # the regularisers add their own term, and turning dropout off changes the task loss (the masks matter).
    root, path = campaign
    model = json.loads(path.read_text())["model"]
    base = _first_step_task_loss(root, model, "pair_baseline")
    for name, reg in (("cosine", "cosine=1.0"), ("istar", "istar=1.0@cls")):
        other = _first_step_task_loss(root, model, f"pair_{name}", "--reg", reg)
        assert other["loss"] != pytest.approx(other["task"], rel=1e-6)  # the regulariser is in the loss
        assert other["task"] == pytest.approx(base["task"], rel=1e-6, abs=1e-7)
    plain = _first_step_task_loss(root, model, "pair_no_dropout", "--no-dropout")
    assert abs(plain["task"] - base["task"]) > 1e-4


def test_cost_timing_records_the_runs_wall_seconds(campaign, monkeypatch, tmp_path):
    """``glue_cost`` times a task by the campaign's own ``run_one`` and measures the run's log: its
    ``campaign.json`` holds the wall seconds (a number: ``run_one``'s ``Outcome.seconds``), and a
    timing run stopped by non-finite numbers stops the timing with its error. The finetune process is a stand-in
    that writes an every-step log (steps of 1 s; the final evaluation 3 s after the last step)."""
    from experiments.benchmarks import glue_cost

    root, path = campaign
    config = json.loads(path.read_text())
    config["cost"] = {"protocol": "p", "method": "baseline", "seed": 0, "order": ["rte"], "note": "A stand-in."}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    status = [0]

    def finetune(argv):
        directory = read_json(argv[-1])["logging"]["output_dir"]
        steps = [{"kind": "train", "step": k, "seconds": 1.0, "time": 100.0 + k} for k in range(1, 4)]
        records = [*steps, {"kind": "eval", "step": 3, "stage_end": True, "time": 106.0}]
        with open(os.path.join(directory, "log.jsonl"), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
        with open(os.path.join(directory, "results.json"), "w") as f:
            json.dump({}, f)
        return status[0], "isojax finetune: error: steps 2 to 3 had a non-finite loss\n" if status[0] else ""

    _stand_in_finetune(monkeypatch, finetune)
    argv = ["--config", str(path), "--data-dir", str(root / "data"), "--tasks", "rte", "--out", str(tmp_path / "out")]
    assert glue_cost.main([*argv, "--runs-dir", str(tmp_path / "runs")]) == 0
    timed = read_json(tmp_path / "out" / "glue_cost.json")["tasks"]["rte"]
    assert isinstance(timed["wall_seconds"], float) and timed["seconds_per_step"] == 1.0
    assert timed["seconds_per_evaluation"] == 3.0
    assert timed["startup_seconds"] == pytest.approx(timed["wall_seconds"] - 2.0 - 6.0)
    status[0] = 3
    with pytest.raises(SystemExit, match="timing run of rte was stopped by non-finite numbers: steps 2 to 3"):
        glue_cost.main([*argv, "--runs-dir", str(tmp_path / "diverged")])


def _stand_in_finetune(monkeypatch, finetune):
    """Replace the campaign's ``isojax finetune`` processes by ``finetune(argv) -> (exit status, stderr)``; other
    commands (git, for the provenance) still run."""
    popen = subprocess.Popen

    def fake(argv, **kwargs):
        if argv[1:4] != ["-m", "isojax.cli", "finetune"]:
            return popen(argv, **kwargs)
        status, stderr = finetune(argv)
        return contextlib.nullcontext(types.SimpleNamespace(stderr=io.StringIO(stderr), returncode=status))

    monkeypatch.setattr(subprocess, "Popen", fake)


def test_a_run_that_diverges_is_recorded_reported_and_not_run_again(campaign, monkeypatch, tmp_path):
    """``isojax finetune`` exit status 3 (non-finite numbers stopped the run) is a result: the campaign records the
    error in the run's ``campaign.json``, goes on, does not run it again, and the report says so; any other failure
    stops the campaign. The finetune process is replaced by a stand-in that exits as a diverged run does."""
    root, path = campaign
    error = (
        "steps 3 to 4 (stage 'finetune') had a non-finite loss or gradient, 2 in a row (max_nonfinite_steps=2); "
        "their updates were skipped and the run stops. No checkpoint was written in x: rerunning the same command "
        "starts over"
    )
    calls = []

    def finetune_exits(status, stderr):
        def finetune(argv):
            calls.append(argv)
            return status, stderr

        return finetune

    _stand_in_finetune(monkeypatch, finetune_exits(3, f"WARNING 2 step(s) skipped\nisojax finetune: error: {error}\n"))
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = [*_argv(root, path)[:4], "--runs-dir", str(runs), "--out", str(out), "--only", "task=rte", "seed=0"]
    assert cli.main([*argv, "method=cosine"]) == 0
    assert cli.main([*argv, "method=cosine"]) == 0  # recorded: not run again
    assert len(calls) == 1
    record = read_json(runs / "p" / "rte" / "cosine" / "seed0" / "campaign.json")
    assert record["diverged"] == error
    pairing = record["pairing"]  # the masks this code draws pair it (glue_pairing.pair_key)
    assert pairing["dropout_masks"] == glue_pairing.dropout_masks()
    assert glue_pairing.pair_key(record) == f"masks {pairing['dropout_masks']}"
    assert (
        read_json(out / "glue_methods_runs" / "p" / "rte" / "cosine" / "seed0" / "campaign.json")["diverged"] == error
    )
    report = (out / "glue_methods.md").read_text()
    assert "| cosine | 0 | not run: seed 0 diverged |" in report
    assert (
        "Stopped by non-finite numbers (`isojax finetune` exit status 3; not run again): cosine seed 0: steps 3 to 4 "
        "(stage 'finetune') had a non-finite loss or gradient, 2 in a row (max_nonfinite_steps=2)\n" in report
    )
    _stand_in_finetune(monkeypatch, finetune_exits(1, "Traceback (most recent call last): ...\n"))
    with pytest.raises(subprocess.CalledProcessError):
        cli.main([*argv, "method=baseline"])


def test_a_time_limit_starts_only_the_runs_whose_estimate_fits_in_what_is_left(campaign, monkeypatch, tmp_path, capsys):
    """``--time-limit MINUTES``: the campaign order is kept, but a run starts only where the cost table's estimate
    fits in the minutes left since the campaign started, and the campaign stops where none does. A stand-in finetune
    advances a stand-in clock by its run's estimate times a slowdown; ``--dry-run`` lists the same runs by the
    estimates alone. Where this sitting's runs took longer than their estimates, the later estimates are scaled by
    that ratio."""
    root, path = campaign
    cost = tmp_path / "cost.json"
    cost.write_text(
        json.dumps({"tasks": {"rte": {"minutes_per_run": {"p": 2.0}}, "mrpc": {"minutes_per_run": {"p": 2.5}}}})
    )
    clock, slowdown, calls = [0.0], [1.0], []

    def finetune(argv):
        calls.append(read_json(argv[-1])["task"]["name"])
        clock[0] += 60 * {"rte": 2.0, "mrpc": 2.5}[calls[-1]] * slowdown[0]
        return 0, ""

    _stand_in_finetune(monkeypatch, finetune)
    monkeypatch.setattr(
        runner, "time", types.SimpleNamespace(monotonic=lambda: clock[0], perf_counter=lambda: clock[0])
    )
    argv = [*_argv(root, path)[:4], "--out", str(tmp_path / "out"), "--cost", str(cost), "--only", "seed=0"]
    # 4 runs: rte baseline and cosine (2 min each), then mrpc's (2.5 min each); 6 minutes hold the two rte runs,
    # then 2 are left and neither mrpc run fits
    dry = [*argv, "--runs-dir", str(tmp_path / "dry"), "--dry-run", "--time-limit", "6"]
    assert cli.main(dry) == 0
    listed = capsys.readouterr().out
    assert [line.split(": python")[0] for line in listed.splitlines() if line.startswith("==")] == [
        "== ('p', 'baseline', 'rte', 0)",
        "== ('p', 'cosine', 'rte', 0)",
    ]
    assert "--time-limit: 2 run(s) left, none estimated to finish in the 2 min left" in listed
    assert cli.main([*argv, "--runs-dir", str(tmp_path / "runs"), "--time-limit", "6"]) == 0
    assert calls == ["rte", "rte"] and clock[0] == 240
    assert "none estimated to finish in the 2 min left" in capsys.readouterr().out
    # 5 minutes from a new start hold both mrpc runs (2.5 + 2.5)
    assert cli.main([*argv, "task=mrpc", "--runs-dir", str(tmp_path / "runs"), "--time-limit", "5"]) == 0
    assert calls == ["rte", "rte", "mrpc", "mrpc"]
    # a machine twice as slow as the table: the first rte run takes 4 of the 7 minutes, and the second, estimated
    # 2 x 2 = 4, no longer fits in the 3 left (unscaled, its 2 would)
    slowdown[0], before = 2.0, clock[0]
    assert cli.main([*argv, "task=rte", "--runs-dir", str(tmp_path / "slow"), "--time-limit", "7"]) == 0
    assert calls[4:] == ["rte"] and clock[0] - before == 240
    assert "--time-limit: 1 run(s) left, none estimated to finish in the 3 min left (estimates x 2.00, as this " in (
        capsys.readouterr().out
    )
    with pytest.raises(SystemExit):
        cli.main([*argv, "--time-limit", "0"])
    assert "--time-limit must be a positive number of minutes, got 0.0" in capsys.readouterr().err


# a stand-in for a run that the time limit stops: it waits, and exits as isojax finetune does on SIGTERM
STOPPABLE = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)); time.sleep(300)"


@pytest.mark.slow
def test_stop_at_limit_stops_the_run_in_progress_and_the_next_sitting_resumes_and_records_both(
    campaign, monkeypatch, tmp_path, capsys
):
    """``--time-limit M --stop-at-limit``: the first run in the campaign's order starts although its estimate (2 min)
    exceeds the limit, gets SIGTERM at the limit, and, exiting as a stopped run does (status 143), is recorded as a
    sitting in its ``sittings.json`` and left unfinished; the campaign stops there. The next sitting runs it (a real
    ``isojax finetune``, which would resume from a checkpoint; the stand-in left none) and its ``campaign.json`` counts
    both sittings' wall time. The first sitting's finetune is a real process standing in (``STOPPABLE``)."""
    root, path = campaign
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"tasks": {"rte": {"minutes_per_run": {"p": 2.0}}}}))
    popen, launched = subprocess.Popen, []

    def stoppable(argv, **kwargs):
        if argv[1:4] == ["-m", "isojax.cli", "finetune"]:
            launched.append(time.monotonic())
            argv = [sys.executable, "-c", STOPPABLE]
        return popen(argv, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", stoppable)
    monkeypatch.setattr(schedule, "STOP_MIN_MINUTES", 0.01)
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = [*_argv(root, path)[:4], "--runs-dir", str(runs), "--out", str(out), "--cost", str(cost)]
    argv += ["--only", "task=rte", "seed=0", "method=baseline"]
    assert cli.main([*argv, "--time-limit", "0.1", "--stop-at-limit"]) == 0
    printed = capsys.readouterr().out
    assert len(launched) == 1
    assert "   (estimated 2 min: stopped at the limit, resumed by the next sitting)" in printed
    directory = runs / "p" / "rte" / "baseline" / "seed0"
    assert (
        f"('p', 'baseline', 'rte', 0) stopped at the time limit after 0 min (sitting 1); its "
        f"checkpoint is in {directory}, and running the campaign again resumes it" in printed
    )
    (first,) = read_json(directory / "sittings.json")
    assert 0 < first["wall_seconds"] < 60 and first["commit"] and first["machine"]
    assert not (directory / "results.json").exists() and not (directory / "campaign.json").exists()

    monkeypatch.setattr(subprocess, "Popen", popen)
    assert cli.main([*argv, "--time-limit", "60", "--stop-at-limit"]) == 0
    for records in (directory, out / "glue_methods_runs" / "p" / "rte" / "baseline" / "seed0"):
        record = read_json(records / "campaign.json")
        assert record["earlier_sittings"] == [first]
        assert record["wall_seconds"] > first["wall_seconds"]  # this sitting's seconds added
        assert (records / "results.json").exists()
    with pytest.raises(SystemExit):
        cli.main([*argv, "--stop-at-limit"])
    assert "--stop-at-limit needs --time-limit (the limit to stop a run at)" in capsys.readouterr().err


# stand-ins for a run that a SIGTERM from outside the campaign stops (a scheduler, a kill of the finetune process):
# while training or loading (its handler checkpoints, or not yet, and exits with status 143) and while Python imports
# it (no handler yet: the signal ends the process at once)
TERMINATED = {
    "training": "import os, signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)); "
    "os.kill(os.getpid(), signal.SIGTERM); time.sleep(300)",
    "importing": "import os, signal, time; os.kill(os.getpid(), signal.SIGTERM); time.sleep(300)",
}


@pytest.mark.parametrize("when", sorted(TERMINATED))
def test_a_run_stopped_by_a_sigterm_from_outside_is_kept_as_a_sitting_and_the_campaign_stops(
    campaign, monkeypatch, tmp_path, capsys, when
):
    """A run's ``isojax finetune`` that exits as a stopped run does (status 143), or that the signal ended while
    Python imported it, on a ``SIGTERM`` the campaign did not send, without ``--time-limit``: its sitting is kept in
    ``sittings.json`` for the next sitting to resume, no record says it finished, and the campaign stops there instead
    of failing (the next seed is not started)."""
    root, path = campaign
    popen, launched = subprocess.Popen, []

    def terminated(argv, **kwargs):
        if argv[1:4] == ["-m", "isojax.cli", "finetune"]:
            launched.append(argv)
            argv = [sys.executable, "-c", TERMINATED[when]]
        return popen(argv, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", terminated)
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = [*_argv(root, path)[:4], "--runs-dir", str(runs), "--out", str(out)]
    assert cli.main([*argv, "--only", "task=rte", "seed=0,1", "method=baseline"]) == 0
    directory = runs / "p" / "rte" / "baseline" / "seed0"
    assert (
        f"('p', 'baseline', 'rte', 0) stopped by a SIGTERM from outside after 0 min (sitting 1); its checkpoint is in "
        f"{directory}, and running the campaign again resumes it" in capsys.readouterr().out
    )
    assert len(launched) == 1
    (sitting,) = read_json(directory / "sittings.json")
    assert 0 < sitting["wall_seconds"] < 60
    assert not (directory / "results.json").exists() and not (directory / "campaign.json").exists()


def test_a_selection_no_run_has_or_a_missing_file_is_refused_by_its_option(campaign, tmp_path, capsys):
    """A typo in ``--only`` selected nothing (or less than asked) without a word; a
    missing ``--config`` was a traceback and a missing ``--cost`` ran unordered and unfiltered."""
    root, path = campaign
    argv = _argv(root, path, "--dry-run")
    for extra, message in (
        (["--only", "task=mprc"], "--only: no run has task 'mprc'; the tasks are ['rte', 'mrpc']"),
        (["--only", "task=rte", "seed=1,2"], "--only: no run has seed '2'; the seeds are ['0', '1']"),
        (["--only", "method=cosin"], "--only: no run has method 'cosin'; the methods are"),
        (["--cost", str(tmp_path / "nosuch.json")], f"--cost {tmp_path / 'nosuch.json'}: no such file"),
    ):
        with pytest.raises(SystemExit, match=re.escape(message)):
            cli.main([*argv, *extra])
    with pytest.raises(SystemExit):
        cli.main([*argv, "--config", str(tmp_path / "nosuch.json")])
    assert f"error: --config {tmp_path / 'nosuch.json'}: [Errno 2] No such file" in capsys.readouterr().err
