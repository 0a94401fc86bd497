"""The shipped GLUE and sequence-to-sequence run configurations expand into valid ``isojax finetune`` runs with the papers' settings.

References: the hyperparameters stated in the papers (isotropy-calibration App. B, shrink-the-longest Table 1),
written out here; the grid sizes are the products of the papers' model/task/method/seed lists.
"""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

CONFIG_DIR = Path(__file__).resolve().parent.parent / "experiments" / "reproductions" / "configs"
CAMPAIGNS = ("glue_methods.json",)  # experiments.campaign's format (protocols), checked below
CONFIGS = sorted(p for p in CONFIG_DIR.glob("*.json") if p.name not in CAMPAIGNS)
_spec = importlib.util.spec_from_file_location("configs_run", CONFIG_DIR / "run.py")
_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_run)
expand_runs = _run.expand_runs


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_run_is_a_valid_configuration(path):
    with open(path) as f:
        config = json.load(f)
    runs = expand_runs(config, "x", "/tmp/runs")
    sizes = [len(v) for v in config["grid"].values()]
    assert len(runs) == len({r.logging.output_dir for r in runs}) == math.prod(sizes)


def _runs(name):
    with open(CONFIG_DIR / name) as f:
        return expand_runs(json.load(f), "x")


def test_calibration_settings_follow_appendix_b():
    runs = _runs("isotropy_calibration_glue.json")
    for r in runs:
        assert (r.optim.batch_size, r.optim.schedule, r.optim.warmup_ratio) == (32, "constant", 0.0)
        assert r.optim.epochs == (5 if r.task.name in ("mrpc", "wnli") else 3)
        assert r.optim.learning_rate == (1e-5 if r.model.name == "roberta-base" else 2e-5)
    assert {r.method.name for r in runs} == {"baseline", "cosine", "spectrum_pol", "spectrum_exp"}
    assert len({r.task.name for r in runs}) == 9


def test_shrink_settings_follow_its_table_1():
    for r in _runs("shrink_glue.json"):
        assert (r.optim.batch_size, r.optim.epochs) == (64, 10)
        assert (r.optim.learning_rate, r.optim.weight_decay) == (
            (8e-5, 8e-6) if r.task.name == "mrpc" else (5e-5, 5e-6)
        )


def test_seq2seq_settings_follow_appendix_b_and_section_4():
    """App. B: M-BART and BART lr 3e-5 with polynomial (power 1: linear) decay, batch 48, 5 epochs; mBART on WMT16
    EN-RO and DE-EN, BART on CNN/DM; flow on 50 000 sentence pairs / 20 000 articles, beside the baseline there."""
    full, flow = _runs("isotropy_calibration_seq2seq.json"), _runs("isotropy_calibration_seq2seq_flow.json")
    for r in full + flow:
        assert (r.optim.learning_rate, r.optim.schedule, r.optim.batch_size, r.optim.epochs) == (3e-5, "linear", 48, 5)
        assert r.model.name == (
            "facebook/bart-large" if r.task.name == "cnn_dailymail" else "facebook/mbart-large-cc25"
        )
        assert r.is_seq2seq
    assert {r.task.name for r in full} == {r.task.name for r in flow} == {"wmt16_en_ro", "wmt16_de_en", "cnn_dailymail"}
    assert {r.method.name for r in full} == {"baseline", "cosine", "spectrum_pol", "spectrum_exp"}
    assert {r.method.name for r in flow} == {"baseline", "flow"}
    assert all(r.task.train_limit == 0 for r in full)
    assert all(r.task.train_limit == (20000 if r.task.name == "cnn_dailymail" else 50000) for r in flow)
    glue_flow = _runs("isotropy_calibration_glue_flow.json")
    assert {(r.model.name, r.method.name) for r in glue_flow} == {("bert-base-uncased", "flow")}
    assert all(
        (r.optim.learning_rate, r.optim.batch_size, r.optim.schedule) == (2e-5, 32, "constant") for r in glue_flow
    )


def _write_run(out, stages, timing=None):
    out.mkdir(parents=True)
    (out / "results.json").write_text(
        json.dumps({"config": {}, "step": 1, "stages": stages, **({"timing": timing} if timing else {})})
    )


def test_summary_tabulates_mean_and_std_over_seeds(tmp_path):
    """Reference: numpy mean and population std of the per-seed values written into fake runs."""
    config = {
        "defaults": {"optim": {"epochs": 1}},
        "grid": {
            "model.name": ["m"],
            "task.name": ["mrpc"],
            "method.name": ["baseline", "isotropy_layer"],
            "seed": [0, 1, 2],
        },
    }
    runs = expand_runs(config, "cfg", str(tmp_path))
    rng = np.random.default_rng(0)
    values = {}
    for run in runs[:-1]:  # the last run (isotropy_layer, seed 2) has not finished
        evaluation = {
            "accuracy": float(rng.uniform(60, 90)),
            "f1": float(rng.uniform(60, 90)),
            "isoscore": float(rng.uniform(0, 0.1)),
        }
        stages = {"finetune": evaluation}
        if run.method.name == "isotropy_layer":
            stages["isotropy_layer"] = dict(evaluation, isoscore=evaluation["isoscore"] + 0.5)
        _write_run(Path(run.logging.output_dir), stages)
        for stage, e in stages.items():
            values.setdefault((run.method.name, stage), []).append(e)
    text = _run.summary(runs, "t")
    assert "## mrpc, m\n\n1 run(s) missing" in text
    lines = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines() if line.startswith("| ")
    }
    for (method, stage), evals in values.items():
        label = method if method == "baseline" else f"{method}: {stage}"
        cells = lines[label]
        assert cells[1] == str(len(evals))
        acc = np.array([e["accuracy"] for e in evals])
        iso = np.array([e["isoscore"] for e in evals])
        assert cells[2] == f"{acc.mean():.2f} ± {acc.std():.2f}"
        assert cells[4] == f"{iso.mean():.4f} ± {iso.std():.4f}"
        assert cells[5] == "–"  # ev1 was not recorded in these runs


def test_every_campaign_run_is_a_valid_configuration():
    """experiments/reproductions/configs/glue_methods.json: every run and sweep run is a valid TrainConfig, with App. B's
    settings in protocol appB and the shrink paper's Table 1 in protocol shrink."""
    from experiments.campaign import spec

    with open(CONFIG_DIR / "glue_methods.json") as f:
        config = json.load(f)
    for sweep in (False, True):
        runs = spec.expand(config, sweep=sweep)
        parsed = [(run, run.config("/tmp/runs", "/tmp/data")) for run in runs]
        assert len({c.logging.output_dir for _, c in parsed}) == len(runs)
        for run, c in parsed:
            if run.protocol == "appB":
                o = c.optim
                assert (o.learning_rate, o.batch_size, o.schedule, o.warmup_ratio) == (2e-5, 32, "constant", 0.0)
                assert c.optim.epochs == (5 if c.task.name in ("mrpc", "wnli") else 3)
            else:
                assert (c.optim.batch_size, c.optim.epochs) == (64, 10)
                expected = (8e-5, 8e-6) if c.task.name == "mrpc" else (5e-5, 5e-6)
                assert (c.optim.learning_rate, c.optim.weight_decay) == expected


def test_summary_of_a_seq2seq_task_has_its_generation_metrics_isotropy_and_time(tmp_path):
    config = {"grid": {"model.name": ["m"], "task.name": ["wmt16_en_ro"], "method.name": ["flow"], "seed": [0, 1]}}
    runs = expand_runs(config, "cfg", str(tmp_path))
    for i, run in enumerate(runs):
        _write_run(
            Path(run.logging.output_dir),
            {"finetune": {"bleu": 20.0 + 2 * i, "I1": 0.9, "I2": 0.5}},
            {"finetune": {"seconds_per_epoch": 90.0 + 10 * i}},
        )
    text = _run.summary(runs, "t")
    header = next(line for line in text.splitlines() if line.startswith("| method"))
    assert header.split(" | ")[2:] == ["bleu", "I1(W)", "I2(W)", "s / epoch |"]
    row = next(line for line in text.splitlines() if line.startswith("| flow")).split(" | ")
    assert row[2:] == ["21.00 ± 1.00", "0.90 ± 0.00", "0.50 ± 0.00", "95 ± 5 |"]


def test_only_refuses_a_value_no_run_has(capsys):
    """``--only task.name=mprc`` selected no run and printed "0 runs"; now it names the value and the ones there are."""
    config = str(CONFIG_DIR / "softdecay_glue.json")
    with pytest.raises(SystemExit, match=r"--only: no run has task.name 'mprc'; the values are \[.*'mrpc'"):
        _run.main([config, "--only", "task.name=mprc", "--dry-run"])
    with pytest.raises(SystemExit):
        _run.main(["nosuch.json", "--dry-run"])
    assert "error: config nosuch.json: [Errno 2] No such file" in capsys.readouterr().err
