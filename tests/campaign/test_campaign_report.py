"""The campaign's report (experiments/campaign/report.py): the tables' marks and regulariser traces, the summary's
effect sizes, paired IsoScore tests and seed matching, and what is left to run with its estimated hours."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from conftest import read_json

from experiments.campaign import report as campaign_report
from experiments.campaign import spec


def test_the_table_marks_the_methods_that_change_the_model():
    """SoftDecay and the Isotropy Layer's second stage change the model (†); a regulariser and the Isotropy Layer's
    first stage (the fine-tuned model itself) do not."""
    protocol = read_json(spec.DEFAULT_CONFIG)["protocols"]["appB"]
    record = {"accuracy": 50.0, "seed": 0, "pair": "s", "seconds_per_epoch": 1.0}
    lines = {
        name: [record]
        for name in ("baseline", "softdecay", "cosine", "isotropy_layer: finetune", "isotropy_layer: isotropy_layer")
    }
    _, rows = campaign_report.task_table("wnli", lines, protocol, {})
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
    trace = campaign_report.term_trace(str(log))
    assert trace == {
        "finetune": {"istar@cls": (0.3, 0.1), "flow": (2.0, 1.0)},
        "isotropy_layer": {"isoscore@head_input": (2.5, 2.5)},
    }
    assert campaign_report.term_trace(str(tmp_path / "missing.jsonl")) == {}

    protocol = read_json(spec.DEFAULT_CONFIG)["protocols"]["appB"]
    record = {"accuracy": 50.0, "pair": "s", "seconds_per_epoch": 1.0}
    lines = {
        "baseline": [{**record, "seed": 0, "isoscore": 0.08, "terms": {}}],
        "istar (C0 = I)": [
            {**record, "seed": 0, "isoscore": 0.05, "terms": {"istar@cls": (0.3, 0.1)}},
            {**record, "seed": 1, "isoscore": 0.03, "terms": {"istar@cls": (0.1, 0.02)}},
        ],
    }
    text, payload = campaign_report.task_table("wnli", lines, protocol, {})
    assert payload[1]["terms"] == {
        "istar@cls": {"first": [0.3, 0.1], "last": [0.1, 0.02], "first_mean": 0.2, "last_mean": pytest.approx(0.06)}
    }
    baseline_line, istar_line = (line for line in text.splitlines() if line.startswith(("| baseline", "| istar")))
    assert "| istar@cls 0.2 → 0.06 |" in istar_line
    assert "| – | 1 |" in baseline_line  # no term; then s / epoch
    config = read_json(spec.DEFAULT_CONFIG)
    config["summaries"] = [{"paper": "P", "claim": "C", "protocol": "appB", "methods": ["istar (C0 = I)"]}]
    text = campaign_report.summary(config, [{"task": "wnli", "protocol": "appB", "rows": payload}])
    assert "2 vs 1 seeds; IsoScore 0.04 vs 0.08, istar@cls 0.2 → 0.06 in training)." in text


def test_summary_states_effect_sizes_and_why_a_paired_p_is_missing():
    """The summary line of a method: difference of means, Cohen's d over the pooled sample std (numpy), both
    p-values (scipy); where every pair of seeds differs alike (ttest_rel undefined), it says by how much."""
    config = read_json(spec.DEFAULT_CONFIG)
    protocol = config["protocols"]["appB"]
    # WNLI dev accuracies (71 examples): cosine gets one more right in every seed, flow two more in seed 2 only
    base, cosine, flow = ([100 * k / 71 for k in right] for right in ([16, 20, 24], [17, 21, 25], [16, 20, 26]))

    def records(values):
        return [{"accuracy": v, "seed": k, "pair": "s", "seconds_per_epoch": 1.0} for k, v in enumerate(values)]

    lines = {"baseline": records(base), "cosine": records(cosine), "flow": records(flow), "isobn": records(base)}
    _, rows = campaign_report.task_table("wnli", lines, protocol, {})
    config["summaries"] = [
        {"paper": "P", "claim": "C", "protocol": "appB", "methods": ["cosine", "flow", "isobn"]},
    ]
    text = campaign_report.summary(config, [{"task": "wnli", "protocol": "appB", "rows": rows}])
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
    config = read_json(spec.DEFAULT_CONFIG)
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
    _, rows = campaign_report.task_table("wnli", lines, config["protocols"]["appB"], {})
    config["summaries"] = [{"paper": "P", "claim": "C", "protocol": "appB", "methods": ["isobn", "flow", "cosine"]}]
    text = campaign_report.summary(config, [{"task": "wnli", "protocol": "appB", "rows": rows}])
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


def test_summary_compares_a_method_with_fewer_seeds_with_the_baselines_same_seeds():
    """A method with one finished seed (seed 2) is compared with the baseline's seed 2, not its three-seed mean:
    the difference, Cohen's d and the dev IsoScore; the two-sample p still uses every seed (scipy)."""
    config = read_json(spec.DEFAULT_CONFIG)
    base = [
        {"accuracy": 100 * k / 71, "seed": s, "pair": "s", "isoscore": 0.1 * (s + 1)}
        for s, k in enumerate((16, 20, 30))
    ]
    one = [{"accuracy": 100 * 27 / 71, "seed": 2, "pair": "s", "isoscore": 0.5}]
    _, rows = campaign_report.task_table("wnli", {"baseline": base, "isobn": one}, config["protocols"]["appB"], {})
    config["summaries"] = [{"paper": "P", "claim": "C", "protocol": "appB", "methods": ["isobn"]}]
    text = campaign_report.summary(config, [{"task": "wnli", "protocol": "appB", "rows": rows}])
    # 27/71 - 30/71 = -4.23 (against the three-seed mean, 22/71, it would read +7.04)
    assert (
        "- isobn vs baseline: wnli accuracy -4.23 (d –, p –, paired p – over 1 pair; 1 vs 3 seeds; difference, d and "
        "IsoScore against the baseline's seeds 2; IsoScore 0.5 vs 0.3)." in text
    )


def test_remaining_cost_sums_the_estimates_of_the_runs_without_a_record(tmp_path):
    config = read_json(spec.DEFAULT_CONFIG)
    runs = [r for r in spec.expand(config) if r.task in ("wnli", "rte")]
    selected = {r.key for r in runs if r.task == "wnli"}
    done = next(r for r in runs if r.task == "wnli" and r.protocol == "appB")
    os.makedirs(done.directory(str(tmp_path)))
    Path(done.directory(str(tmp_path)), "results.json").write_text("{}")
    minutes = {"appB": 6.0, "appB + isotropy layer stage 2": 9.0, "shrink": 12.0}
    cost = {"tasks": {"wnli": {"minutes_per_run": minutes}}}  # RTE untimed
    # WNLI: appB 12 methods (the Isotropy Layer's with stage 2) and shrink 3, x 3 seeds, less the finished run:
    # (32 x 6 + 3 x 9 + 9 x 12) / 60 = 5.45 CPU-hours
    assert campaign_report.remaining_cost(runs, selected, cost, str(tmp_path)) == (
        "1 of 90 runs finished; not yet run: 44 in the CPU campaign (about 5 CPU-hours on this CPU by the glue_cost "
        "estimates) and 45 left to an accelerator."
    )
    everything = {r.key for r in runs}  # RTE in the campaign too: its 45 runs have no estimate
    assert campaign_report.remaining_cost(runs, everything, cost, str(tmp_path)) == (
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
    assert campaign_report.remaining_cost(runs, selected, cost, str(tmp_path)) == (
        "2 of 90 runs finished (their wall time was 2.5x their glue_cost estimate, median of 2; the middle half 2.2x "
        "to 2.8x); not yet run: 43 in the CPU campaign (about 5 CPU-hours on this CPU by the glue_cost estimates, 13 "
        "at the finished runs' median ratio) and 45 left to an accelerator."
    )
