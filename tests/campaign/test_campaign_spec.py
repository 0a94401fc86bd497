"""What the campaign runs (experiments/campaign/spec.py): the committed configuration's runs and sweeps, each run's
TrainConfig, the committed run records against it, and the selections the campaign and its benchmarks refuse."""

from __future__ import annotations

import os

import pytest
from conftest import read_json

from experiments.campaign import report as campaign_report
from experiments.campaign import schedule, spec
from experiments.tooling.report import RESULTS


def test_the_committed_configuration_expands_and_selects():
    config = read_json(spec.DEFAULT_CONFIG)
    runs = spec.expand(config)
    methods = sum(len(p["methods"]) for p in config["protocols"].values())
    assert len(runs) == methods * len(config["tasks"]) * len(config["seeds"])
    cpu = schedule.campaign_selection(runs, config)
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
    cost = schedule.read_cost(os.path.join(RESULTS, "glue_cost.json"))
    capped = schedule.campaign_selection(runs, config, cost)
    assert {r.key for r in cpu} - {r.key for r in capped} == {
        ("shrink", m, "sst2", s) for m in ("baseline", "persistent_entropy (selected bars)") for s in range(3)
    }
    long_run = next(r for r in cpu if (r.protocol, r.task) == ("shrink", "sst2"))
    minutes = schedule.too_long(long_run, config, cost)
    assert minutes > config["cpu_campaign"]["max_run_minutes"] == 180
    assert campaign_report.not_run_reason(long_run, {r.key for r in capped}, cost, config) == (
        f"left to an accelerator: about {minutes:.0f} min per run on this CPU (glue_cost estimate), longer than the "
        "CPU campaign's 180 min (one sitting)"
    )
    sweeps = spec.expand(config, sweep=True)
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
        spec.select(runs, {"model": ["x"]})


def test_every_run_prints_the_settings_that_rebuild_its_config():
    """Before it starts a run the campaign prints the settings that differ from ``TrainConfig()``; applied to the
    defaults they give the run's configuration again."""
    from isojax.train.config import TrainConfig

    config = read_json(spec.DEFAULT_CONFIG)
    runs = spec.expand(config) + spec.expand(config, sweep=True)
    for run in runs:
        ran = run.config("runs", "data", 7)
        changed = spec.changed_settings(ran)
        assert TrainConfig().override(changed) == ran, run.key
        assert changed["logging.eval_every"] == 7 and changed["logging.output_dir"] == run.directory("runs")
    flow = spec.changed_settings(next(r for r in runs if r.method == "flow").config())
    assert flow["method.name"] == "flow"


def test_every_committed_run_record_has_the_settings_its_configuration_gives_it():
    """The configuration is the runs' own: each committed run's ``results.json`` records the settings it ran with
    (made from the finetune command lines the configuration was written in before it took dotted settings, or from
    this configuration); expanding the configuration today gives every one of them again."""
    from isojax.train.config import TrainConfig

    config = read_json(spec.DEFAULT_CONFIG)
    records = os.path.join(RESULTS, "glue_methods_runs")
    compared = 0
    for run in spec.expand(config) + spec.expand(config, sweep=True):
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
    config = read_json(spec.DEFAULT_CONFIG)
    appb = config["protocols"]["appB"]
    appb["overrides"].append({"when": {"method": "softdecay", "task": "cola"}, "set": {"optim.epochs": 2}})
    appb["sweeps"]["values"] = {
        "softdecay": {"optim.transform_learning_rate": [2e-5, 1e-4], "method.softdecay_placement": ["block"]}
    }
    cells = {r.method: r for r in spec.expand(config, sweep=True)}
    assert sorted(cells) == [
        "softdecay",
        "softdecay [method.softdecay_placement=block]",
        "softdecay [optim.transform_learning_rate=0.0001]",
    ]
    table = next(r for r in spec.expand(config) if r.key == cells["softdecay"].key)
    assert cells["softdecay"].config() == table.config()
    for label, rate, placement in (
        ("softdecay [optim.transform_learning_rate=0.0001]", 1e-4, "output"),
        ("softdecay [method.softdecay_placement=block]", 2e-5, "block"),
    ):
        ran = cells[label].config()
        assert ran.method.name == "softdecay" and ran.optim.epochs == 2 and ran.optim.learning_rate == 2e-5
        assert (ran.optim.transform_learning_rate, ran.method.softdecay_placement) == (rate, placement)
        assert ran.logging.output_dir == os.path.join("runs", "appB", "cola", spec.slug(label), "seed0")


def test_a_setting_that_is_not_a_train_config_field_names_the_run():
    config = read_json(spec.DEFAULT_CONFIG)
    config["protocols"]["appB"]["methods"]["cosine"]["optim.learnig_rate"] = 1e-3
    with pytest.raises(ValueError, match="protocol 'appB', method 'cosine'.*optim.learnig_rate"):
        spec.expand(config)


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
