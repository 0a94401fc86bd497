"""``experiments.reproductions.glue_devices``: the runs two record directories share, side by side.

References: hand-computed differences, ratios and a sample standard deviation of planted records."""

import json

import pytest

from experiments.reproductions import glue_devices


def _record(root, run, accuracy, isoscore, seconds, masks, machine):
    d = root / run
    d.mkdir(parents=True)
    stage = {"accuracy": accuracy, "isoscore": isoscore}
    results = {"step": 231, "stages": {"finetune": stage}, "timing": {"finetune": {"seconds_per_epoch": seconds}}}
    (d / "results.json").write_text(json.dumps(results))
    (d / "campaign.json").write_text(json.dumps({"machine": machine, "pairing": {"dropout_masks": masks}}))


@pytest.fixture
def two_devices(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for seed, acc in enumerate([80.0, 82.0, 84.0]):
        _record(a, f"appB/rte/baseline/seed{seed}", acc, 0.2, 200.0, "s1", "cpu")
    _record(b, "appB/rte/baseline/seed0", 81.5, 0.25, 2.0, "s2", "gpu")
    _record(b, "appB/rte/cosine/seed0", 70.0, 0.3, 2.0, "s2", "gpu")  # not in a: left out
    return a, b


def test_only_shared_runs_with_their_differences_and_the_seed_spread(two_devices):
    a, b = two_devices
    result = glue_devices.compare(glue_devices.records(str(a)), glue_devices.records(str(b)))
    (row,) = result["rows"]
    assert row["run"] == "appB/rte/baseline/seed0"
    assert row["metrics"]["accuracy"] == {"a": 80.0, "b": 81.5, "diff": 1.5}
    assert row["metrics"]["isoscore"]["diff"] == pytest.approx(0.05)
    assert (
        row["speedup"] == 100.0 and row["pair_keys"] == ["masks s1", "masks s2"] and row["machines"] == ["cpu", "gpu"]
    )
    spread = result["spread"]["appB/rte/baseline"]
    # sample std of 80, 82, 84: sqrt(((−2)² + 0 + 2²) / 2) = 2
    assert spread == {"metric": "accuracy", "largest_diff": 1.5, "runs": 1, "std_a": 2.0, "seeds_a": 3}


def test_report_written_and_bad_directories_refused(two_devices, tmp_path):
    a, b = two_devices
    path = glue_devices.main(["--a", str(a), "--b", str(b), "--name", "check", "--out", str(tmp_path / "out")])
    text = open(path).read()
    assert "| appB/rte/baseline/seed0 | accuracy 80.00 / 81.50 (+1.50) |" in text and "(100×)" in text
    assert "1.50 over 1 run(s) | 2.00 over 3 seeds |" in text
    with pytest.raises(SystemExit, match="no such directory"):
        glue_devices.main(["--a", str(tmp_path / "absent"), "--b", str(b)])
    with pytest.raises(SystemExit, match="no run is recorded in both"):
        glue_devices.main(["--a", str(b / "appB"), "--b", str(a), "--out", str(tmp_path / "out")])
