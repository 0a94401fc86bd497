"""The campaign's order and the cost table behind it (experiments/campaign/schedule.py,
experiments/benchmarks/glue_cost.py): cheapest run first, and the cost table measured from a run's own log (reference:
the log's numbers by hand)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import read_json

from experiments.campaign import schedule, spec


def test_campaign_order_is_cheapest_first_then_priority_then_seed():
    config = read_json(spec.DEFAULT_CONFIG)
    runs = spec.select(
        spec.expand(config),
        {"task": ["cola", "wnli"], "protocol": ["appB"], "method": ["cosine", "flow", "isotropy_layer"]},
    )
    cost = {
        "tasks": {
            "wnli": {"minutes_per_run": {"appB": 10.0, "appB + isotropy layer stage 2": 12.0}},
            "cola": {"minutes_per_run": {"appB": 11.0, "appB + isotropy layer stage 2": 15.0}},
        }
    }
    order = [(r.task, r.method, r.seed) for r in schedule.campaign_order(runs, config, cost, {})]
    assert order == [("wnli", m, s) for m in ("flow", "cosine") for s in range(3)] + [
        ("cola", m, s) for m in ("flow", "cosine") for s in range(3)
    ] + [("wnli", "isotropy_layer", s) for s in range(3)] + [("cola", "isotropy_layer", s) for s in range(3)]
    # the sweep's other weights (seed 0 on CoLA) after every table run of their cost; its default weight is the
    # table's run itself
    sweep = [r for r in spec.expand(config, sweep=True) if r.method.startswith("cosine")]
    assert sorted(r.method for r in sweep) == ["cosine", "cosine [cosine=0.1]", "cosine [cosine=10.0]"]
    order = [(r.task, r.method, r.seed) for r in schedule.campaign_order(runs + sweep[:1], config, cost, {})]
    assert order[6:12] == [("cola", "flow", s) for s in range(3)] + [("cola", "cosine", s) for s in range(3)]
    assert order[12] == ("cola", sweep[0].method, 0)


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
    config = read_json(spec.DEFAULT_CONFIG)
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
