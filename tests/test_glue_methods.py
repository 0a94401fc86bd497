"""The GLUE campaign runner (experiments/reproductions/glue_methods.py) end to end on a tiny configuration: two tasks, two methods,
two seeds, a tiny random BERT and tiny GLUE files in the download script's format.

References: scipy.stats.ttest_ind on the runs' own results.json values (the table's p-values) and
scipy.stats.ttest_rel on made-up numbers (the paired p-values); the run records (a campaign resumed after SIGKILL
redoes no finished run and resumes the killed one from its checkpoint); the first step's task loss of a baseline
and of regulariser runs (equal when their dropout masks are, unequal without dropout).
"""

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
from pathlib import Path

import jax
import numpy as np
import pytest
import scipy.stats
import transformers
from conftest import read_json, read_jsonl, save_tiny_encoder

from experiments.reproductions import glue_methods, glue_pairing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    assert glue_methods.main(_argv(root, path, "--only", "task=rte")) == 0
    runs = glue_methods.expand(json.loads(path.read_text()))
    rte_done = {
        r.key: os.path.getmtime(os.path.join(r.directory(str(root / "runs")), "results.json"))
        for r in runs
        if r.task == "rte"
    }
    assert len(rte_done) == 4
    # second sitting: killed while the first MRPC run is past its first checkpoint
    child = subprocess.Popen(
        [sys.executable, "-m", "experiments.reproductions.glue_methods", *_argv(root, path)],
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
    assert glue_methods.main(_argv(root, path)) == 0
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
        glue_methods.main(
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


def test_ttest_is_scipys_and_undefined_cases_are_none():
    a, b = [70.1, 71.5, 69.8], [68.0, 68.9, 69.5]
    assert glue_methods.ttest(a, b) == pytest.approx(scipy.stats.ttest_ind(a, b).pvalue, rel=1e-12)
    assert glue_methods.ttest([1.0], [2.0, 3.0]) is None
    assert glue_methods.ttest([50.0, 50.0], [50.0, 50.0]) is None


def test_the_committed_configuration_expands_and_selects():
    config = read_json(glue_methods.DEFAULT_CONFIG)
    runs = glue_methods.expand(config)
    methods = sum(len(p["methods"]) for p in config["protocols"].values())
    assert len(runs) == methods * len(config["tasks"]) * len(config["seeds"])
    cpu = glue_methods.campaign_selection(runs, config)
    appb, shrink = (len(p["methods"]) for p in config["protocols"].values())
    # CoLA, WNLI: everything; MRPC: 8 new appB methods, 3 shrink; RTE, MRPC: 4 earlier; SST-2, STS-B: 4 + 2
    assert len(cpu) == 3 * (2 * (appb + shrink) + 8 + 3 + 2 * 4 + 2 * (4 + 2))
    assert {(r.task, r.method) for r in cpu if r.task in ("sst2", "stsb") and r.protocol == "shrink"} == {
        (t, m) for t in ("sst2", "stsb") for m in ("baseline", "persistent_entropy (selected bars)")
    }
    assert "flow" in config["protocols"]["appB"]["methods"]
    mrpc = next(r for r in cpu if r.task == "mrpc" and r.protocol == "appB")
    optim = mrpc.config().optim
    assert optim.epochs == 5 and optim.learning_rate == 2e-5 and optim.schedule == "constant"
    shrink = next(r for r in runs if r.protocol == "shrink" and r.task == "mrpc").config()
    assert shrink.optim.learning_rate == 8e-5 and shrink.optim.batch_size == 64 and shrink.optim.weight_decay == 8e-6
    # with the committed cost table: a run estimated longer than max_run_minutes (one sitting) is left out, which
    # today is the shrink protocol's SST-2 runs (10 epochs), and the report says why
    cost = glue_methods.read_cost(os.path.join(glue_methods.RESULTS, "glue_cost.json"))
    capped = glue_methods.campaign_selection(runs, config, cost)
    assert {r.key for r in cpu} - {r.key for r in capped} == {
        ("shrink", m, "sst2", s) for m in ("baseline", "persistent_entropy (selected bars)") for s in range(3)
    }
    long_run = next(r for r in cpu if (r.protocol, r.task) == ("shrink", "sst2"))
    minutes = glue_methods.too_long(long_run, config, cost)
    assert minutes > config["cpu_campaign"]["max_run_minutes"] == 180
    assert glue_methods.not_run_reason(long_run, {r.key for r in capped}, cost, config) == (
        f"left to an accelerator: about {minutes:.0f} min per run on this CPU (glue_cost estimate), longer than the "
        "CPU campaign's 180 min (one sitting)"
    )
    sweeps = glue_methods.expand(config, sweep=True)
    assert {r.task for r in sweeps} == {"cola"} and len(sweeps) == 21
    # a sweep cell at the table's own value is the table's run (same directory, run once): six regulariser weights
    # and the flow's learning rate 1e-3, which the flow's table settings leave to TrainConfig's default
    table_keys = {r.key for r in runs}
    assert sum(r.key in table_keys for r in sweeps) == 7
    flow = {r.method: r.config().optim.transform_learning_rate for r in sweeps if r.method.startswith("flow")}
    assert flow == {
        "flow [optim.transform_learning_rate=1e-05]": 1e-5,
        "flow [optim.transform_learning_rate=0.0001]": 1e-4,
        "flow": 1e-3,
    }
    with pytest.raises(SystemExit, match="unknown key"):
        glue_methods.select(runs, {"model": ["x"]})


def test_every_run_prints_the_settings_that_rebuild_its_config():
    """Before it starts a run the campaign prints the settings that differ from ``TrainConfig()``; applied to the
    defaults they give the run's configuration again. A method with a section the defaults leave unset (flow) is
    printed, not a ``KeyError`` that stops the campaign when it reaches it."""
    from isojax.train.config import TrainConfig

    config = read_json(glue_methods.DEFAULT_CONFIG)
    runs = glue_methods.expand(config) + glue_methods.expand(config, sweep=True)
    for run in runs:
        ran = run.config("runs", "data", 7)
        changed = glue_methods.changed_settings(ran)
        assert TrainConfig().override(changed) == ran, run.key
        assert changed["logging.eval_every"] == 7 and changed["logging.output_dir"] == run.directory("runs")
    flow = glue_methods.changed_settings(next(r for r in runs if r.method == "flow").config())
    assert flow["method.name"] == "flow" and {"flow.levels", "flow.depth", "flow.hidden"} <= set(flow)


def test_every_committed_run_record_has_the_settings_its_configuration_gives_it():
    """The configuration is the runs' own: each committed run's ``results.json`` records the settings it ran with
    (made from the finetune command lines the configuration was written in before it took dotted settings, or from
    this configuration); expanding the configuration today gives every one of them again."""
    from isojax.train.config import TrainConfig

    config = read_json(glue_methods.DEFAULT_CONFIG)
    records = os.path.join(ROOT, "experiments", "results", "glue_methods_runs")
    compared = 0
    for run in glue_methods.expand(config) + glue_methods.expand(config, sweep=True):
        path = os.path.join(run.directory(records), "results.json")
        if not os.path.exists(path):
            continue
        recorded = TrainConfig.from_json(read_json(path)["config"])
        directory = recorded.logging.output_dir
        assert directory.endswith(run.directory("")), (run.key, directory)
        ran = run.config(directory[: -len(run.directory(""))], recorded.task.data_dir, recorded.logging.eval_every)
        assert ran == recorded, run.key
        compared += 1
    assert compared >= 40  # RTE and MRPC (4 methods x 3 seeds each) and the WNLI runs of the CPU campaign


def test_a_sweep_varies_one_setting_at_a_time_and_keeps_the_overrides_of_its_method():
    """A sweep cell is its method's run with one setting replaced: the protocol's defaults, the method's other
    settings and the overrides that match the method by its table name all still apply; the cell with the table's
    own value is the table's run."""
    config = read_json(glue_methods.DEFAULT_CONFIG)
    appb = config["protocols"]["appB"]
    appb["overrides"].append({"when": {"method": "softdecay", "task": "cola"}, "set": {"optim.epochs": 2}})
    appb["sweeps"]["values"] = {
        "softdecay": {"optim.transform_learning_rate": [2e-5, 1e-4], "method.softdecay_placement": ["block"]}
    }
    cells = {r.method: r for r in glue_methods.expand(config, sweep=True)}
    assert sorted(cells) == [
        "softdecay",
        "softdecay [method.softdecay_placement=block]",
        "softdecay [optim.transform_learning_rate=0.0001]",
    ]
    table = next(r for r in glue_methods.expand(config) if r.key == cells["softdecay"].key)
    assert cells["softdecay"].config() == table.config()
    for label, rate, placement in (
        ("softdecay [optim.transform_learning_rate=0.0001]", 1e-4, "output"),
        ("softdecay [method.softdecay_placement=block]", 2e-5, "block"),
    ):
        ran = cells[label].config()
        assert ran.method.name == "softdecay" and ran.optim.epochs == 2 and ran.optim.learning_rate == 2e-5
        assert (ran.optim.transform_learning_rate, ran.method.softdecay_placement) == (rate, placement)
        assert ran.logging.output_dir == os.path.join("runs", "appB", "cola", glue_methods.slug(label), "seed0")


def test_a_setting_that_is_not_a_train_config_field_names_the_run():
    config = read_json(glue_methods.DEFAULT_CONFIG)
    config["protocols"]["appB"]["methods"]["cosine"]["optim.learnig_rate"] = 1e-3
    with pytest.raises(ValueError, match="protocol 'appB', method 'cosine'.*optim.learnig_rate"):
        glue_methods.expand(config)


def test_paired_ttest_is_scipys_ttest_rel_over_the_seeds_of_one_dropout_stream():
    a, b = [70.1, 71.5, 69.8], [68.0, 68.9, 69.5]
    same = ({s: (v, "s1") for s, v in enumerate(a)}, {s: (v, "s1") for s, v in enumerate(b)})
    p, seeds = glue_pairing.paired_ttest(*same)
    assert seeds == [0, 1, 2] and p == pytest.approx(scipy.stats.ttest_rel(a, b).pvalue, rel=1e-12)
    assert p != pytest.approx(scipy.stats.ttest_ind(a, b).pvalue, rel=1e-3)  # the pairing changes the answer
    # seed 0 of b drew other masks (another stream), seed 3 has no partner: pairs are seeds 1 and 2 only
    other = ({**same[0], 3: (72.0, "s1")}, {**same[1], 0: (68.0, "s0")})
    p, seeds = glue_pairing.paired_ttest(*other)
    assert seeds == [1, 2] and p == pytest.approx(scipy.stats.ttest_rel(a[1:], b[1:]).pvalue, rel=1e-12)
    assert glue_pairing.paired_ttest({0: (1.0, "s")}, {0: (2.0, "s")}) == (None, [0])  # one pair: undefined
    assert glue_pairing.paired_ttest({0: (1.0, "s"), 1: (2.0, "s")}, {0: (0.0, "s"), 1: (1.0, "s")})[0] is None
    # one more right answer of 71 in every seed: differences equal but for round-off (ttest_rel would say p ~ 1e-30)
    right = {s: (100 * k / 71, "s") for s, k in enumerate([17, 21, 25])}
    assert glue_pairing.paired_ttest(right, {s: (100 * k / 71, "s") for s, k in enumerate([16, 20, 24])})[0] is None
    assert glue_methods.ttest([100 * 17 / 71] * 3, [100 * 16 / 71] * 3) is None
    assert np.var([100 * 17 / 71] * 3, ddof=1) > 0  # round-off: Cohen's d would be about 1e15
    assert glue_methods.effect([100 * 17 / 71] * 3, [100 * 16 / 71] * 3) == (pytest.approx(100 / 71), None)


def test_the_table_marks_the_methods_that_change_the_model():
    """SoftDecay and the Isotropy Layer's second stage change the model (†); a regulariser and the Isotropy Layer's
    first stage (the fine-tuned model itself) do not."""
    protocol = read_json(glue_methods.DEFAULT_CONFIG)["protocols"]["appB"]
    record = {"accuracy": 50.0, "seed": 0, "pair": "s", "seconds_per_epoch": 1.0}
    lines = {
        name: [record]
        for name in ("baseline", "softdecay", "cosine", "isotropy_layer: finetune", "isotropy_layer: isotropy_layer")
    }
    _, rows = glue_methods.task_table("wnli", lines, protocol, {})
    assert {row["method"]: row["model_change"] for row in rows} == {
        "baseline": False,
        "softdecay": True,
        "cosine": False,
        "isotropy_layer: finetune": False,
        "isotropy_layer: isotropy_layer": True,
    }


def test_the_table_traces_each_regulariser_term_from_its_first_to_its_last_logged_step(tmp_path):
    """Per stage, the unweighted regulariser terms (``name@representation``, the flow's ``flow``) of the first and
    the last training row of log.jsonl; scheduled values, the task loss and evaluation rows are not terms."""
    rows = [
        {"kind": "eval", "step": 0, "stage": "finetune", "accuracy": 50.0},
        {"kind": "train", "step": 10, "stage": "finetune", "loss": 1.0, "task": 0.7, "istar@cls": 0.3,
         "istar@cls/weight": 1.0, "flow": 2.0},
        {"kind": "train", "step": 20, "stage": "finetune", "loss": 0.8, "task": 0.6, "istar@cls": 0.2,
         "istar@cls/weight": 1.0, "flow": 1.5},
        {"kind": "train", "step": 30, "stage": "finetune", "loss": 0.7, "task": 0.6, "istar@cls": 0.1,
         "istar@cls/weight": 1.0, "flow": 1.0},
        {"kind": "train", "step": 40, "stage": "isotropy_layer", "loss": 3.0, "task": 0.5, "isoscore@head_input": 2.5},
    ]  # fmt: skip
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = glue_methods.term_trace(str(log))
    assert trace == {
        "finetune": {"istar@cls": (0.3, 0.1), "flow": (2.0, 1.0)},
        "isotropy_layer": {"isoscore@head_input": (2.5, 2.5)},
    }
    assert glue_methods.term_trace(str(tmp_path / "missing.jsonl")) == {}

    protocol = read_json(glue_methods.DEFAULT_CONFIG)["protocols"]["appB"]
    record = {"accuracy": 50.0, "pair": "s", "seconds_per_epoch": 1.0}
    lines = {
        "baseline": [{**record, "seed": 0, "isoscore": 0.08, "terms": {}}],
        "istar (C0 = I)": [
            {**record, "seed": 0, "isoscore": 0.05, "terms": {"istar@cls": (0.3, 0.1)}},
            {**record, "seed": 1, "isoscore": 0.03, "terms": {"istar@cls": (0.1, 0.02)}},
        ],
    }
    text, payload = glue_methods.task_table("wnli", lines, protocol, {})
    assert payload[1]["terms"] == {
        "istar@cls": {"first": [0.3, 0.1], "last": [0.1, 0.02], "first_mean": 0.2, "last_mean": pytest.approx(0.06)}
    }
    baseline_line, istar_line = (line for line in text.splitlines() if line.startswith(("| baseline", "| istar")))
    assert "| istar@cls 0.2 → 0.06 |" in istar_line
    assert "| – | 1 |" in baseline_line  # no term; then s / epoch
    config = read_json(glue_methods.DEFAULT_CONFIG)
    config["summaries"] = [{"paper": "P", "claim": "C", "protocol": "appB", "methods": ["istar (C0 = I)"]}]
    text = glue_methods.summary(config, [{"task": "wnli", "protocol": "appB", "rows": payload}])
    assert "2 vs 1 seeds; IsoScore 0.04 vs 0.08, istar@cls 0.2 → 0.06 in training)." in text


def test_summary_states_effect_sizes_and_why_a_paired_p_is_missing():
    """The summary line of a method: difference of means, Cohen's d over the pooled sample std (numpy), both
    p-values (scipy); where every pair of seeds differs alike (ttest_rel undefined), it says by how much."""
    config = read_json(glue_methods.DEFAULT_CONFIG)
    protocol = config["protocols"]["appB"]
    # WNLI dev accuracies (71 examples): cosine gets one more right in every seed, flow two more in seed 2 only
    base, cosine, flow = ([100 * k / 71 for k in right] for right in ([16, 20, 24], [17, 21, 25], [16, 20, 26]))

    def records(values):
        return [{"accuracy": v, "seed": k, "pair": "s", "seconds_per_epoch": 1.0} for k, v in enumerate(values)]

    lines = {"baseline": records(base), "cosine": records(cosine), "flow": records(flow), "isobn": records(base)}
    _, rows = glue_methods.task_table("wnli", lines, protocol, {})
    config["summaries"] = [
        {"paper": "P", "claim": "C", "protocol": "appB", "methods": ["cosine", "flow", "isobn"]},
    ]
    text = glue_methods.summary(config, [{"task": "wnli", "protocol": "appB", "rows": rows}])
    pooled = np.sqrt((np.var(flow, ddof=1) + np.var(base, ddof=1)) / 2)
    d = (np.mean(flow) - np.mean(base)) / pooled
    p = scipy.stats.ttest_ind(flow, base).pvalue
    paired = scipy.stats.ttest_rel(flow, base).pvalue
    assert (
        f"- flow vs baseline: wnli accuracy +0.94 (d {d:+.2f}, p {p:.3f}, paired p {paired:.3f} over 3 pairs; "
        "3 vs 3 seeds). Not run: cola, sst2, mrpc, rte, stsb." in text
    )
    p = scipy.stats.ttest_ind(cosine, base).pvalue
    d = (np.mean(cosine) - np.mean(base)) / np.sqrt((np.var(cosine, ddof=1) + np.var(base, ddof=1)) / 2)
    assert (
        f"- cosine vs baseline: wnli accuracy +1.41 (d {d:+.2f}, p {p:.3f}, paired p – (every pair differs by +1.41) "
        "over 3 pairs; 3 vs 3 seeds)." in text
    )
    p = scipy.stats.ttest_ind(base, base).pvalue
    assert f"- isobn vs baseline: wnli accuracy +0.00 (d +0.00, p {p:.3f}, paired p – (every pair equal) over 3" in text


def test_summary_tests_the_dev_isoscore_paired_over_the_metrics_pairs():
    """Beside the mean dev IsoScores, the summary gives their paired t-test (scipy's ttest_rel) over the seeds of the
    task metric's paired test: a run of another dropout stream (seed 2 here) is left out of both; "–" where every
    pair differs alike; "< 0.001" below a thousandth (never "0.000")."""
    config = read_json(glue_methods.DEFAULT_CONFIG)
    base_iso, layer_iso, shifted = [0.071, 0.064, 0.082], [0.118, 0.131, 0.090], [0.081, 0.074, 0.5]

    def records(isoscores, pairs="sss"):
        return [
            {"accuracy": 100 * (16 + 4 * k) / 71, "seed": k, "pair": pair, "isoscore": iso}
            for k, (iso, pair) in enumerate(zip(isoscores, pairs))
        ]

    steady = [0.118, 0.1112, 0.1288]  # 0.047 ± 0.0002 above the baseline: ttest_rel's p is 6e-6
    lines = {
        "baseline": records(base_iso),
        "isobn": records(layer_iso),
        "flow": records(shifted, "sst"),
        "cosine": records(steady),
    }
    _, rows = glue_methods.task_table("wnli", lines, config["protocols"]["appB"], {})
    config["summaries"] = [{"paper": "P", "claim": "C", "protocol": "appB", "methods": ["isobn", "flow", "cosine"]}]
    text = glue_methods.summary(config, [{"task": "wnli", "protocol": "appB", "rows": rows}])
    paired = scipy.stats.ttest_rel(layer_iso, base_iso).pvalue
    assert (
        f"3 vs 3 seeds; IsoScore {np.mean(layer_iso):.3g} vs {np.mean(base_iso):.3g} (paired p {paired:.3f}))." in text
    )
    # flow: seeds 0 and 1 pair, and their IsoScores differ alike (+0.01): no paired p
    assert (
        f"over 2 pairs; 3 vs 3 seeds; IsoScore {np.mean(shifted):.3g} vs {np.mean(base_iso):.3g} (paired p –))." in text
    )
    assert scipy.stats.ttest_rel(steady, base_iso).pvalue < 1e-3
    assert f"IsoScore {np.mean(steady):.3g} vs {np.mean(base_iso):.3g} (paired p < 0.001))." in text


def benjamini_hochberg(ps, dependence_factor=False):
    """Benjamini and Hochberg's (1995) adjusted p-values by their closed form: the i-th smallest of m p-values
    becomes min over j >= i of p_(j) m / j, at most 1; with ``dependence_factor``, Benjamini and Yekutieli's (2001)
    for any dependence: m / j becomes m c(m) / j, c(m) = sum_{i<=m} 1/i."""
    ps = np.asarray(ps, np.float64)
    m = len(ps)
    order = np.argsort(ps)
    scaled = ps[order] * m / np.arange(1, m + 1) * (np.sum(1 / np.arange(1, m + 1)) if dependence_factor else 1)
    q = np.empty_like(ps)
    q[order] = np.minimum(np.minimum.accumulate(scaled[::-1])[::-1], 1.0)
    return q


def test_summary_corrects_each_family_of_p_values_for_their_number():
    """After the papers, the summary adjusts each family of its p-values (the task metric's unpaired and paired p,
    the dev IsoScore's paired p; one per method and task) by Benjamini-Hochberg and Benjamini-Yekutieli: the
    q-values equal the closed forms over scipy's t-test p-values, and the comparisons with p < 0.05 are listed, *
    where q < 0.05."""
    config = read_json(glue_methods.DEFAULT_CONFIG)
    base = [16, 20, 24, 22]  # WNLI dev examples right (of 71) in seeds 0-3
    right = {"cosine": [17, 19, 26, 22], "flow": [22, 26, 27, 26], "isobn": [15, 21, 23, 22], "spectrum_pol": base}
    iso = {"baseline": [0.08, 0.07, 0.09, 0.08], "cosine": [0.081, 0.069, 0.092, 0.083], "flow": [0.2, 0.3, 0.25, 0.2]}

    def records(method):
        return [
            {"accuracy": 100 * k / 71, "seed": s, "pair": "s", "isoscore": iso.get(method, iso["baseline"])[s]}
            for s, k in enumerate(right.get(method, base))
        ]

    _, rows = glue_methods.task_table(
        "wnli", {m: records(m) for m in ["baseline", *right]}, config["protocols"]["appB"], {}
    )
    config["summaries"] = [
        {"paper": "P", "claim": "C", "protocol": "appB", "methods": ["cosine", "flow"]},
        {"paper": "Q", "claim": "C", "protocol": "appB", "methods": ["isobn", "spectrum_pol"]},
    ]
    text = glue_methods.summary(config, [{"task": "wnli", "protocol": "appB", "rows": rows}])
    methods = ["cosine", "flow", "isobn"]  # spectrum_pol equals the baseline: unpaired p 1, no paired p
    acc = {m: [100 * k / 71 for k in right[m]] for m in methods}
    base_acc = [100 * k / 71 for k in base]
    unpaired = [scipy.stats.ttest_ind(acc[m], base_acc).pvalue for m in methods]
    paired = [scipy.stats.ttest_rel(acc[m], base_acc).pvalue for m in methods]
    iso_p = [scipy.stats.ttest_rel(iso[m], iso["baseline"]).pvalue for m in ["cosine", "flow"]]
    assert min(unpaired) > 0.05 and paired[1] < 0.05 < min(paired[0], paired[2]) and iso_p[1] < 0.05 < iso_p[0]

    def starred(q):
        return f"{q:.3f}" + ("*" if q < 0.05 else "")

    def listed(ps, i):
        bh, by = benjamini_hochberg(ps)[i], benjamini_hochberg(ps, dependence_factor=True)[i]
        return f"p {ps[i]:.3f} q {starred(bh)} (BY {starred(by)})"

    assert "- task metric (unpaired): 0 of 4 p < 0.05." in text
    assert f"- task metric (paired): 1 of 3 p < 0.05: flow on wnli {listed(paired, 1)}." in text
    assert f"- dev IsoScore (paired): 1 of 2 p < 0.05: flow on wnli {listed(iso_p, 1)}." in text
    # by hand: sorted 0.01, 0.03, 0.04, 0.5 scale to 0.04, 0.06, 0.0533, 0.5; the 0.06 takes the 0.0533 above it
    np.testing.assert_allclose(benjamini_hochberg([0.01, 0.04, 0.03, 0.5]), [0.04, 0.16 / 3, 0.16 / 3, 0.5])
    # BY multiplies by c(4) = 1 + 1/2 + 1/3 + 1/4 = 25/12, capped at 1
    np.testing.assert_allclose(
        benjamini_hochberg([0.01, 0.04, 0.03, 0.5], dependence_factor=True), [1 / 12, 1 / 9, 1 / 9, 1.0]
    )


def test_summary_compares_a_method_with_fewer_seeds_with_the_baselines_same_seeds():
    """A method with one finished seed (seed 2) is compared with the baseline's seed 2, not its three-seed mean:
    the difference, Cohen's d and the dev IsoScore; the two-sample p still uses every seed (scipy)."""
    config = read_json(glue_methods.DEFAULT_CONFIG)
    base = [
        {"accuracy": 100 * k / 71, "seed": s, "pair": "s", "isoscore": 0.1 * (s + 1)}
        for s, k in enumerate((16, 20, 30))
    ]
    one = [{"accuracy": 100 * 27 / 71, "seed": 2, "pair": "s", "isoscore": 0.5}]
    _, rows = glue_methods.task_table("wnli", {"baseline": base, "isobn": one}, config["protocols"]["appB"], {})
    config["summaries"] = [{"paper": "P", "claim": "C", "protocol": "appB", "methods": ["isobn"]}]
    text = glue_methods.summary(config, [{"task": "wnli", "protocol": "appB", "rows": rows}])
    # 27/71 - 30/71 = -4.23 (against the three-seed mean, 22/71, it would read +7.04)
    assert (
        "- isobn vs baseline: wnli accuracy -4.23 (d –, p –, paired p – over 1 pair; 1 vs 3 seeds; difference, d and "
        "IsoScore against the baseline's seeds 2; IsoScore 0.5 vs 0.3)." in text
    )


def test_campaign_order_is_cheapest_first_then_priority_then_seed():
    config = read_json(glue_methods.DEFAULT_CONFIG)
    runs = glue_methods.select(
        glue_methods.expand(config),
        {"task": ["cola", "wnli"], "protocol": ["appB"], "method": ["cosine", "flow", "isotropy_layer"]},
    )
    cost = {
        "tasks": {
            "wnli": {"minutes_per_run": {"appB": 10.0, "appB + isotropy layer stage 2": 12.0}},
            "cola": {"minutes_per_run": {"appB": 11.0, "appB + isotropy layer stage 2": 15.0}},
        }
    }
    order = [(r.task, r.method, r.seed) for r in glue_methods.campaign_order(runs, config, cost, {})]
    assert order == [("wnli", m, s) for m in ("flow", "cosine") for s in range(3)] + [
        ("cola", m, s) for m in ("flow", "cosine") for s in range(3)
    ] + [("wnli", "isotropy_layer", s) for s in range(3)] + [("cola", "isotropy_layer", s) for s in range(3)]
    # the sweep's other weights (seed 0 on CoLA) after every table run of their cost; its default weight is the
    # table's run itself
    sweep = [r for r in glue_methods.expand(config, sweep=True) if r.method.startswith("cosine")]
    assert sorted(r.method for r in sweep) == ["cosine", "cosine [cosine=0.1]", "cosine [cosine=10.0]"]
    order = [(r.task, r.method, r.seed) for r in glue_methods.campaign_order(runs + sweep[:1], config, cost, {})]
    assert order[6:12] == [("cola", "flow", s) for s in range(3)] + [("cola", "cosine", s) for s in range(3)]
    assert order[12] == ("cola", sweep[0].method, 0)


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
                "--quiet",
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


def test_mask_fingerprint_follows_the_masks_not_the_arithmetic(monkeypatch):
    """Other weights change every activation (as another device's arithmetic changes them a little): the older
    stream changes, the mask fingerprint does not; another mask generator at the same rate changes both."""
    stream, masks = glue_pairing.dropout_stream(), glue_pairing.dropout_masks()
    assert (stream, masks) == (glue_pairing.dropout_stream(), glue_pairing.dropout_masks())  # deterministic
    assert glue_pairing.dropout_masks(weights_seed=1) == masks and glue_pairing.dropout_stream(weights_seed=1) != stream
    from isojax.models import dropout

    original = dropout.bernoulli_mask
    monkeypatch.setattr(
        dropout, "bernoulli_mask", lambda key, keep, shape: original(jax.random.fold_in(key, 1), keep, shape)
    )  # other masks, same rate
    assert glue_pairing.dropout_stream() != stream and glue_pairing.dropout_masks() != masks


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the older stream of this code was recorded on CPU")
def test_the_current_code_draws_the_masks_its_cpu_stream_is_mapped_to():
    assert glue_pairing.STREAM_OF_MASKS.get(glue_pairing.dropout_masks()) == glue_pairing.dropout_stream(), (
        "the encoder now draws other masks than the code STREAM_OF_MASKS maps: runs of this code no longer pair "
        "with the records of that stream"
    )


def test_pair_key_prefers_the_masks_and_maps_them_to_the_older_stream():
    (masks, stream), key = next(iter(glue_pairing.STREAM_OF_MASKS.items())), glue_pairing.pair_key
    assert key({"pairing": {"dropout_stream": "d7ee28911d1c", "dropout_masks": masks}}) == stream  # a GPU run
    assert key({"pairing": {"dropout_stream": stream}}) == stream  # a CPU record made before mask fingerprints
    assert key({"pairing": {"dropout_stream": stream, "dropout_masks": "0123456789ab"}}) == "masks 0123456789ab"
    assert key({"commit": "4f6c0e6"}) == "commit 4f6c0e6"


def test_cost_measure_and_estimate_from_a_written_log(tmp_path):
    from experiments.benchmarks import glue_cost

    # 4 steps: the first (compilation) takes 30 s, then 2, 4, 6 s; the final evaluation ends 9 s after step 4
    steps = [
        {"kind": "train", "step": k + 1, "stage": "finetune", "seconds": s, "time": 1000.0 + t}
        for k, (s, t) in enumerate([(30.0, 30.0), (2.0, 32.0), (4.0, 36.0), (6.0, 42.0)])
    ]
    records = [
        {"kind": "eval", "step": 0, "stage_end": False, "time": 990.0},
        *steps,
        {"kind": "eval", "step": 4, "stage_end": True, "time": 1051.0},
    ]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "campaign.json").write_text(json.dumps({"wall_seconds": 100.0, "commit": "c", "machine": "m"}))
    row = glue_cost.measure(str(tmp_path))
    assert row["seconds_per_step"] == pytest.approx(4.0)
    assert row["seconds_per_step_std"] == pytest.approx(np.std([2, 4, 6]))
    assert row["seconds_per_evaluation"] == pytest.approx(9.0)
    assert row["startup_seconds"] == pytest.approx(100.0 - 12.0 - 18.0)  # wall - steady steps - 2 evaluations
    config = read_json(glue_methods.DEFAULT_CONFIG)
    row["seconds_per_epoch"] = 4.0 * 100
    minutes = glue_cost.estimates(config, "mrpc", row)
    # appB on MRPC: 5 epochs, 2 evaluations per epoch and one at step 0; stage 2: one more epoch, 2 evaluations
    assert minutes["appB"] == pytest.approx(round((70 + 5 * 400 + 11 * 9) / 60, 1))
    assert minutes["appB + isotropy layer stage 2"] == pytest.approx(round(minutes["appB"] + (400 + 18) / 60, 1))
    assert minutes["shrink"] == pytest.approx(round((70 + 10 * 400 + 21 * 9) / 60, 1))
    steps[2]["step"] = 7  # a log with gaps (log-every > 1, or a resumed run) cannot be timed step by step
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    with pytest.raises(ValueError, match="log every step"):
        glue_cost.measure(str(tmp_path))


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


def test_remaining_cost_sums_the_estimates_of_the_runs_without_a_record(tmp_path):
    config = read_json(glue_methods.DEFAULT_CONFIG)
    runs = [r for r in glue_methods.expand(config) if r.task in ("wnli", "rte")]
    selected = {r.key for r in runs if r.task == "wnli"}
    done = next(r for r in runs if r.task == "wnli" and r.protocol == "appB")
    os.makedirs(done.directory(str(tmp_path)))
    Path(done.directory(str(tmp_path)), "results.json").write_text("{}")
    minutes = {"appB": 6.0, "appB + isotropy layer stage 2": 9.0, "shrink": 12.0}
    cost = {"tasks": {"wnli": {"minutes_per_run": minutes}}}  # RTE untimed
    # WNLI: appB 12 methods (the Isotropy Layer's with stage 2) and shrink 3, x 3 seeds, less the finished run:
    # (32 x 6 + 3 x 9 + 9 x 12) / 60 = 5.45 CPU-hours
    assert glue_methods.remaining_cost(runs, selected, cost, str(tmp_path)) == (
        "1 of 90 runs finished; not yet run: 44 in the CPU campaign (about 5 CPU-hours on this CPU by the glue_cost "
        "estimates) and 45 left to an accelerator."
    )
    everything = {r.key for r in runs}  # RTE in the campaign too: its 45 runs have no estimate
    assert glue_methods.remaining_cost(runs, everything, cost, str(tmp_path)) == (
        "1 of 90 runs finished; not yet run: 89 in the CPU campaign (about 5 CPU-hours on this CPU by the glue_cost "
        "estimates; 45 of an untimed task) and 0 left to an accelerator."
    )
    # finished runs that recorded their wall time: the ratio to their estimates, and the hours left at its median
    wall = {"appB": 12.0 * 60, "shrink": 36.0 * 60}  # 2x and 3x their estimates
    for run in [done, next(r for r in runs if r.task == "wnli" and r.protocol == "shrink")]:
        os.makedirs(run.directory(str(tmp_path)), exist_ok=True)
        Path(run.directory(str(tmp_path)), "results.json").write_text("{}")
        with open(os.path.join(run.directory(str(tmp_path)), "campaign.json"), "w") as f:
            json.dump({"wall_seconds": wall[run.protocol]}, f)
    # left: (32 x 6 + 3 x 9 + 8 x 12) / 60 = 5.25 CPU-hours; x 2.5 (the median of 2 and 3) = 13.1
    assert glue_methods.remaining_cost(runs, selected, cost, str(tmp_path)) == (
        "2 of 90 runs finished (their wall time was 2.5x their glue_cost estimate, median of 2; the middle half 2.2x "
        "to 2.8x); not yet run: 43 in the CPU campaign (about 5 CPU-hours on this CPU by the glue_cost estimates, 13 "
        "at the finished runs' median ratio) and 45 left to an accelerator."
    )


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
    assert glue_methods.main([*argv, "method=cosine"]) == 0
    assert glue_methods.main([*argv, "method=cosine"]) == 0  # recorded: not run again
    assert len(calls) == 1
    record = read_json(runs / "p" / "rte" / "cosine" / "seed0" / "campaign.json")
    assert record["diverged"] == error
    pairing = record["pairing"]  # both fingerprints of this code, the masks' first (glue_pairing.pair_key)
    assert pairing["dropout_masks"] == glue_pairing.dropout_masks() and glue_pairing.pair_key(record) in (
        glue_pairing.STREAM_OF_MASKS.get(pairing["dropout_masks"]),
        f"masks {pairing['dropout_masks']}",
    )
    assert pairing["dropout_stream"] == glue_pairing.dropout_stream()
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
        glue_methods.main([*argv, "method=baseline"])


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
        glue_methods, "time", types.SimpleNamespace(monotonic=lambda: clock[0], perf_counter=lambda: clock[0])
    )
    argv = [*_argv(root, path)[:4], "--out", str(tmp_path / "out"), "--cost", str(cost), "--only", "seed=0"]
    # 4 runs: rte baseline and cosine (2 min each), then mrpc's (2.5 min each); 6 minutes hold the two rte runs,
    # then 2 are left and neither mrpc run fits
    dry = [*argv, "--runs-dir", str(tmp_path / "dry"), "--dry-run", "--time-limit", "6"]
    assert glue_methods.main(dry) == 0
    listed = capsys.readouterr().out
    assert [line.split(": python")[0] for line in listed.splitlines() if line.startswith("==")] == [
        "== ('p', 'baseline', 'rte', 0)",
        "== ('p', 'cosine', 'rte', 0)",
    ]
    assert "--time-limit: 2 run(s) left, none estimated to finish in the 2 min left" in listed
    assert glue_methods.main([*argv, "--runs-dir", str(tmp_path / "runs"), "--time-limit", "6"]) == 0
    assert calls == ["rte", "rte"] and clock[0] == 240
    assert "none estimated to finish in the 2 min left" in capsys.readouterr().out
    # 5 minutes from a new start hold both mrpc runs (2.5 + 2.5)
    assert glue_methods.main([*argv, "task=mrpc", "--runs-dir", str(tmp_path / "runs"), "--time-limit", "5"]) == 0
    assert calls == ["rte", "rte", "mrpc", "mrpc"]
    # a machine twice as slow as the table: the first rte run takes 4 of the 7 minutes, and the second, estimated
    # 2 x 2 = 4, no longer fits in the 3 left (unscaled, its 2 would)
    slowdown[0], before = 2.0, clock[0]
    assert glue_methods.main([*argv, "task=rte", "--runs-dir", str(tmp_path / "slow"), "--time-limit", "7"]) == 0
    assert calls[4:] == ["rte"] and clock[0] - before == 240
    assert "--time-limit: 1 run(s) left, none estimated to finish in the 3 min left (estimates x 2.00, as this " in (
        capsys.readouterr().out
    )
    with pytest.raises(SystemExit):
        glue_methods.main([*argv, "--time-limit", "0"])
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
    monkeypatch.setattr(glue_methods, "STOP_MIN_MINUTES", 0.01)
    runs, out = tmp_path / "runs", tmp_path / "out"
    argv = [*_argv(root, path)[:4], "--runs-dir", str(runs), "--out", str(out), "--cost", str(cost)]
    argv += ["--only", "task=rte", "seed=0", "method=baseline"]
    assert glue_methods.main([*argv, "--time-limit", "0.1", "--stop-at-limit"]) == 0
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
    assert glue_methods.main([*argv, "--time-limit", "60", "--stop-at-limit"]) == 0
    for records in (directory, out / "glue_methods_runs" / "p" / "rte" / "baseline" / "seed0"):
        record = read_json(records / "campaign.json")
        assert record["earlier_sittings"] == [first]
        assert record["wall_seconds"] > first["wall_seconds"]  # this sitting's seconds added
        assert (records / "results.json").exists()
    with pytest.raises(SystemExit):
        glue_methods.main([*argv, "--stop-at-limit"])
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
    assert glue_methods.main([*argv, "--only", "task=rte", "seed=0,1", "method=baseline"]) == 0
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
            glue_methods.main([*argv, *extra])
    with pytest.raises(SystemExit):
        glue_methods.main([*argv, "--config", str(tmp_path / "nosuch.json")])
    assert f"error: --config {tmp_path / 'nosuch.json'}: [Errno 2] No such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--protocol", "appb"], "--protocol 'appb' is not in"),  # was a KeyError traceback
        (["--task", "mprc"], "--task 'mprc' is not in"),  # was an empty selection, then a traceback
        (["--repeats", "0"], "argument --repeats: expected an integer >= 1, got '0'"),
    ],
)
def test_the_methods_benchmark_refuses_what_the_campaign_does_not_have(argv, message, capsys):
    from experiments.benchmarks import methods

    with pytest.raises(SystemExit) as exit_:
        methods.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
