"""The typed configuration (:mod:`isojax.train.config`) and the one ``isojax`` command (:mod:`isojax.cli`): JSON round
trip, dotted overrides, the finetune options derived from the fields, choices taken from the constants, what may
change on resume, the flat records of earlier runs, and one error convention (a line, exit status 2) everywhere."""

import dataclasses
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from conftest import read_json

from isojax.cli import build_parser, main
from isojax.models.encoder import TRANSFORM_PLACEMENTS
from isojax.models.heads import POOLINGS
from isojax.models.stack import REMAT_POLICIES
from isojax.train.cli import config_from_argv
from isojax.train.config import (
    METHOD_ALIASES,
    METHODS,
    PARALLEL_MODES,
    RESUMABLE,
    FlowConfig,
    LoggingConfig,
    MethodConfig,
    ModelConfig,
    OptimConfig,
    PlacementConfig,
    Seq2SeqConfig,
    TaskConfig,
    TrainConfig,
)
from isojax.train.loop import _check_resumable
from isojax.train.methods import RegularizerSpec
from isojax.train.model import make_flow
from isojax.train.objective import COMBINATIONS
from isojax.train.optim import SCHEDULES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _help() -> str:
    """``isojax finetune --help`` as printed (tyro), on one line per option."""
    out = subprocess.run(
        [sys.executable, "-m", "isojax.cli", "finetune", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "400", "PYTHONPATH": ROOT},
        check=True,
    ).stdout
    return out


def _changed_everywhere() -> TrainConfig:
    """A configuration with every section away from its defaults (schedules and regularisers included)."""
    return TrainConfig(
        task=TaskConfig("wmt16_en_ro", max_length=64, train_limit=100, eval_limit=10, data_source="pairs/"),
        model=ModelConfig("facebook/bart-base", dtype="bfloat16", dropout=False),
        method=MethodConfig(
            "cosine",
            regularizers=(RegularizerSpec.parse("spectrum_pol=linear:0:1:500@tokens,gamma=-0.4"),),
            combine="weighted",
            joint_alpha="linear:1:0.5:300",
            balancer_smoothing=0.3,
        ),
        optim=OptimConfig(learning_rate=3e-5, schedule="cosine", steps=7, batch_size=16, grad_accumulation=2),
        placement=PlacementConfig(devices=4, model_parallel=2, fsdp=True),
        logging=LoggingConfig("runs/x", save_every=5, log_gradients=True, progress=False),
        seq2seq=Seq2SeqConfig(max_target_length=32, label_smoothing=0.0, num_beams=4, generation_max_length=33),
        flow=FlowConfig(levels=2, depth=1, hidden=8, init_batches=2),
        seed=5,
    )


def test_json_round_trip_keeps_every_setting():
    config = _changed_everywhere()
    data = json.loads(json.dumps(config.to_json()))
    assert data["method"]["joint_alpha"] == "linear:1.0:0.5:300"
    assert data["method"]["regularizers"][0]["weight"] == "linear:0.0:1.0:500"
    assert TrainConfig.from_json(data) == config
    assert TrainConfig.from_json(json.loads(json.dumps(TrainConfig().to_json()))) == TrainConfig()


def test_every_section_is_present_and_the_flow_is_built_for_method_flow_only():
    assert TrainConfig().seq2seq == Seq2SeqConfig() and TrainConfig().flow == FlowConfig()
    assert make_flow(TrainConfig()) is None
    assert make_flow(TrainConfig(method=MethodConfig("flow"), flow=FlowConfig(levels=2))).levels == 2


def test_a_section_recorded_as_null_reads_as_its_defaults():
    data = {**TrainConfig().to_json(), "seq2seq": None, "flow": None}
    assert TrainConfig.from_json(data) == TrainConfig()


def test_dotted_overrides_take_json_values():
    config = TrainConfig().override(
        {
            "task.name": "RTE",
            "task.buckets": [64, 16, 32],
            "optim.learning_rate": 3e-5,
            "optim.steps": 12,
            "optim.epochs": 2,
            "placement.devices": None,
            "model.scan_layers": True,
            "method.regularizers": ["isoscore=0.5@cls", {"name": "cosine", "weight": 2.0}],
            "method.balancer_smoothing": "warmup:0.2:10",
            "flow.levels": 2,
            "seed": 4,
        }
    )
    assert config.task.name == "rte" and config.optim.learning_rate == 3e-5 and config.optim.steps == 12
    assert config.task.buckets == (16, 32, 64)  # sorted
    assert isinstance(config.optim.epochs, float) and config.optim.epochs == 2.0
    assert config.placement.devices is None and config.model.scan_layers is True and config.seed == 4
    assert config.method.regularizers == (RegularizerSpec("isoscore", 0.5, "cls"), RegularizerSpec("cosine", 2.0))
    assert config.method.balancer_smoothing == "warmup:0.2:10"
    assert config.flow == FlowConfig(levels=2)
    assert config.optim.batch_size == OptimConfig().batch_size  # untouched settings keep their defaults


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"optim.lr": 1}, r"unknown setting 'optim.lr'; the settings of optim are \[.*'learning_rate'"),
        ({"optim.steps": "ten"}, r"optim.steps \(--steps\) must be an integer, got 'ten'"),
        ({"optim.steps": 2.5}, r"optim.steps \(--steps\) must be an integer, got 2.5"),
        ({"optim.learning_rate": "3e-5"}, r"optim.learning_rate \(--lr\) must be a number, got '3e-5'"),
        ({"model.dropout": "maybe"}, r"model.dropout \(--dropout\) must be true or false, got 'maybe'"),
        ({"optim.batch_size": 0}, r"optim.batch_size \(--batch-size\) must be a positive integer, got 0"),
        (
            {"method.regularizers": ["entropy=1"]},
            r"method.regularizers \(--reg\): regulariser 'entropy=1': unknown regulariser 'entropy'",
        ),
        ({"method.balancer_smoothing": 0.0}, r"method.balancer_smoothing \(--balancer-smoothing\) must be in \(0, 1\]"),
        ({"optim.warmup_ratio": 1.0}, r"optim.warmup_ratio \(--warmup-ratio\) must be in \[0, 1\), got 1.0"),
        ({"model.pooling": "max"}, r"model.pooling \(--pooling\) must be one of \['cls', 'last', 'pooler'"),
        ({"task.buckets": [16, "x"]}, r"task.buckets \(--buckets\) must be an integer, got 'x'"),
        ({"task.buckets": [0, 32]}, r"task.buckets \(--buckets\) must be positive integers, got \(0, 32\)"),
        ({"task.buckets": 32}, r"task.buckets \(--buckets\) must be a list, got 32"),
        ({"task.eval_limit": 1}, r"task.eval_limit \(--eval-limit\) must be 0 \(all rows\) or at least 2"),
        ({"seq2seq.length_penalty": float("nan")}, r"seq2seq.length_penalty \(--length-penalty\) must be finite"),
    ],
)
def test_bad_overrides_name_the_setting_and_its_flag(overrides, message):
    with pytest.raises((TypeError, ValueError), match=message):
        TrainConfig().override(overrides)


def test_sections_must_have_their_type():
    with pytest.raises(TypeError, match="TrainConfig.optim must be a OptimConfig, got dict"):
        TrainConfig(optim={"learning_rate": 1e-3})


def test_every_setting_is_one_finetune_option_with_its_short_alias():
    """tyro derives the options from the dataclasses: each leaf has its dotted flag, the short flag of earlier
    versions beside it (``--lr``), and its field docstring as help; the short flags are distinct."""
    hints = typing.get_type_hints(TrainConfig)
    sections = {name: kind for name, kind in hints.items() if dataclasses.is_dataclass(kind)}
    assert list(sections) == ["task", "model", "method", "optim", "placement", "logging", "seq2seq", "flow"]
    leaves = [(name, f.name) for name, cls in sections.items() for f in dataclasses.fields(cls)]
    assert len(leaves) == 56
    text = _help()
    aliases = []
    for section, name in leaves:
        label = sections[section].label(name)
        alias = label.split("(")[1].rstrip(")")
        aliases.append(alias)
        dotted = f"--{section}.{name.replace('_', '-')}"
        assert re.search(
            rf"{re.escape(alias)}( [^,\u2502\n]+| \{{[^}}]*\}})?(, --no-[\w-]+)?, {re.escape(dotted)}\b", text
        ), (section, name)
    assert len(set(aliases)) == len(aliases) and "--seed" in text
    assert config_from_argv(["finetune", "--balancer-smoothing", "0.4"]).method.balancer_smoothing == 0.4
    assert config_from_argv(["finetune", "--method.balancer_smoothing", "0.4"]).method.balancer_smoothing == 0.4
    assert config_from_argv(["finetune", "--buckets", "48", "16"]).task.buckets == (16, 48)


def test_every_choice_list_is_its_constant():
    """The choices the configuration offers are the names the library's modules use."""
    from isojax.train import config

    assert config.POOLINGS == POOLINGS and config.TRANSFORM_PLACEMENTS == TRANSFORM_PLACEMENTS
    assert config.REMATS == ("none", *REMAT_POLICIES)
    assert set(typing.get_args(config.MethodName)) == {*METHODS, *METHOD_ALIASES}
    assert config.COMBINATIONS == COMBINATIONS and config.SCHEDULES == SCHEDULES
    assert config.PARALLEL_MODES == PARALLEL_MODES
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert tuple(next(a for a in sub.choices["sts"]._actions if a.dest == "pooling").choices) == POOLINGS


def test_renamed_flags_name_their_new_spelling(capsys):
    assert main(["finetune", "--quiet"]) == 2
    assert capsys.readouterr().err == "isojax finetune: error: --quiet is now spelled --no-progress\n"
    for argv in (["--buckets", "16,32"], ["--buckets=16,32"]):
        assert main(["finetune", *argv]) == 2
        assert "--buckets takes widths separated by spaces now" in capsys.readouterr().err


def test_flags_build_the_same_config_as_python():
    argv = shlex.split(
        "finetune --task rte --model m --method isotropy_layer --reg istar=1.0@cls,c0=data --pooling mean "
        "--lr 3e-5 --steps 8 --stage2-steps 2 --no-dropout --scan-layers --remat dots --devices 8 --fsdp "
        "--out runs/y --no-progress --log-gradients --seed 2 --flow-levels 2 --joint-alpha 0.25 --combine weighted"
    )
    assert config_from_argv(argv) == TrainConfig(
        task=TaskConfig("rte"),
        model=ModelConfig("m", pooling="mean", scan_layers=True, remat="dots", dropout=False),
        method=MethodConfig(
            "isotropy_layer", (RegularizerSpec("istar", 1.0, "cls", (("c0", "data"),)),), "weighted", joint_alpha=0.25
        ),
        optim=OptimConfig(learning_rate=3e-5, steps=8, stage2_steps=2),
        placement=PlacementConfig(devices=8, fsdp=True),
        logging=LoggingConfig("runs/y", log_gradients=True, progress=False),
        flow=FlowConfig(levels=2),
        seed=2,
    )
    assert config_from_argv(argv[:1] + ["--reg", "isoscore"]).method.regularizers == (RegularizerSpec("isoscore"),)


def test_config_file_with_flags_on_top(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_changed_everywhere().to_json()))
    config = config_from_argv(["finetune", "--config", str(path), "--lr", "1e-4", "--num-beams", "2"])
    assert config == _changed_everywhere().override({"optim.learning_rate": 1e-4, "seq2seq.num_beams": 2})
    assert config_from_argv(["finetune", f"--config={path}", "--lr", "1e-4", "--num-beams", "2"]) == config


def _documented_commands() -> list[list[str]]:
    """Every ``isojax finetune --...`` command line of the README and the docs (guides, getting started)."""
    pages = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)]
    text = "\n".join(Path(p).read_text() for p in pages if not p.endswith("changelog.md")).replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        m = re.search(r"isojax finetune (--[^`|]*)", line)
        if m and "<" not in m.group(1) and "--help" not in m.group(1):
            commands.append(["finetune", *shlex.split(m.group(1).strip())])
    return commands


def test_every_documented_finetune_command_line_still_parses(tmp_path):
    commands = _documented_commands()
    assert len(commands) >= 8
    saved = tmp_path / "run.json"  # what a documented --config FILE names: a saved configuration
    saved.write_text(json.dumps(TrainConfig().to_json()))
    for argv in commands:
        if "--config" in argv:
            argv[argv.index("--config") + 1] = str(saved)
        config_from_argv(argv)  # raises on an option or value it does not know


def test_what_may_change_on_resume_is_the_field_metadata():
    """The settings that were RESUMABLE_CHANGES (flat names) before the sections, plus placement.fsdp and
    logging.accept_changed_data."""
    assert RESUMABLE == {
        "placement.devices",
        "placement.parallel",
        "placement.model_parallel",
        "placement.fsdp",
        "logging.progress",
        "logging.output_dir",
        "logging.save_every",
        "logging.keep_checkpoints",
        "logging.eval_every",
        "logging.log_every",
        "logging.log_gradients",
        "logging.max_nonfinite_steps",
        "logging.accept_changed_data",
        "logging.export",
        "optim.eval_batch_size",
        "task.eval_limit",
        "seq2seq.num_beams",
        "seq2seq.length_penalty",
        "seq2seq.generation_max_length",
    }


def _committed_records() -> list[str]:
    return sorted(
        glob.glob(os.path.join(ROOT, "experiments/results/glue_methods_runs/**/results.json"), recursive=True)
    )


def test_the_configs_of_committed_runs_are_read_back_as_written():
    """Every committed record holds ``TrainConfig.to_json()`` and reads back as written; a setting added later reads
    as its default, a section recorded as null as its defaults."""
    records = {path: read_json(path)["config"] for path in _committed_records()}
    assert records and all(isinstance(recorded.get("task"), dict) for recorded in records.values())
    defaults = json.loads(json.dumps(TrainConfig().to_json()))
    for path, recorded in records.items():
        read = json.loads(json.dumps(TrainConfig.from_json(recorded).to_json()))
        for section, values in read.items():
            if section != "seed" and recorded.get(section) is None:
                assert values == defaults[section], path
                recorded = {**recorded, section: values}
            elif section != "seed":
                for name in set(values) - set(recorded[section]):  # added after the record was written
                    assert values[name] == defaults[section][name], (path, name)
                    recorded = {**recorded, section: {**recorded[section], name: values[name]}}
        assert read == recorded, path


def test_a_flat_configuration_is_refused_with_each_keys_new_spelling():
    flat = {"task": "rte", "model": "default", "learning_rate": 2e-05, "flow_levels": 3}
    with pytest.raises(ValueError, match="flat configuration") as refused:
        TrainConfig.from_json(flat)
    for spelled in ("task -> task.name", "model -> model.name", "learning_rate -> optim.learning_rate"):
        assert spelled in str(refused.value)
    assert "flow_levels -> flow.levels" in str(refused.value)


def test_resume_compares_by_setting_and_refuses_a_flat_checkpoint_config():
    flat = {"task": "rte", "model": "default", "learning_rate": 2e-05}
    same = TrainConfig.from_json({}).override({"task.name": flat["task"], "optim.learning_rate": 2e-5})
    with pytest.raises(ValueError, match=r"flat configuration .* not read.*learning_rate -> optim.learning_rate"):
        _check_resumable(same, {"config": flat}, "d")
    nested = same.to_json()
    _check_resumable(
        same.override({"logging.output_dir": "elsewhere", "placement.devices": 2}), {"config": nested}, "d"
    )
    with pytest.raises(ValueError, match=r"different configuration \(optim.learning_rate: 2e-05 -> 0.001\)"):
        _check_resumable(same.override({"optim.learning_rate": 1e-3}), {"config": nested}, "d")
    with pytest.raises(ValueError, match=r"\(model.pooling: 'cls' -> 'mean'\)"):
        _check_resumable(same.override({"model.pooling": "mean"}), {"config": nested}, "d")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["analyze", "--model", "/nonexistent/model", "--limit", "2"], "cannot find model '/nonexistent/model'"),
        (["sts", "--data", "sts17", "--quiet"], "unknown STS data set 'sts17'"),
        (["sts", "--alpha", "abc"], "--alpha must be 'search' or a number in [-1, 0), got abc"),
        (["wordsim", "--model", "/nonexistent/model"], "cannot find model '/nonexistent/model'"),
        (
            ["finetune", "--steps", "ten"],
            "--steps/--optim.steps: no type matching {None}|INT could be instantiated from ['ten']",
        ),
        (
            ["finetune", "--config", "/nonexistent/run.json"],
            "--config /nonexistent/run.json: cannot be read (No such file",
        ),
        (["finetune", "--config", os.path.join(ROOT, "README.md")], "README.md: not JSON (Expecting value"),
        (["finetune", "--task", "rte", "--model-parallel", "2", "--parallel", "pmap"], "needs parallel='mesh'"),
        (["finetune", "--remat", "sometimes"], "--remat/--model.remat"),
        (["wordsim", "--similarity"], "argument --similarity: expected one argument"),
    ],
)
def test_a_users_mistake_is_one_line_and_exit_status_2(argv, message, capsys):
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's own errors, through the same one-line error
        status = e.code
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith(f"isojax {argv[0]}: error: ") and message in err and err.count("\n") == 1


def test_a_config_file_that_is_not_an_object_is_refused(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text("[1, 2]")
    assert main(["finetune", "--config", str(path)]) == 2
    assert f"--config {path}: expected a JSON object of settings, got list" in capsys.readouterr().err


def test_the_command_line_prints_no_traceback_and_verbose_shows_one():
    env = {**os.environ, "PYTHONPATH": ROOT}
    argv = [sys.executable, "-m", "isojax.cli", "finetune", "--lr", "-1"]
    quiet = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    assert quiet.stderr.strip().splitlines()[-1] == (
        "isojax finetune: error: Error parsing run.optim: optim.learning_rate (--lr) must be a positive number, got -1.0"
    )
    loud = subprocess.run([*argv[:3], "-v", *argv[3:]], capture_output=True, text=True, env=env)
    assert loud.returncode == 1 and "Traceback" in loud.stderr


def test_the_configuration_module_imports_no_jax_numpy_model_or_data():
    """Reading or writing a configuration is plain Python: importing it loads no JAX, NumPy, model or data code."""
    import subprocess
    import sys

    code = (
        "import sys, isojax.train.config; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'numpy', 'flax', 'optax') "
        "or m.startswith(('isojax.models', 'isojax.data'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_configurations_task_names_and_buckets_are_those_of_the_data_modules():
    """The leaf keeps copies of the data modules' task names and default buckets; they must stay the same."""
    from isojax.data.batching import DEFAULT_BUCKETS
    from isojax.data.glue import GLUE_TASKS
    from isojax.data.seq2seq import SEQ2SEQ_TASKS
    from isojax.train import config

    assert set(config.GLUE_TASK_NAMES) == set(GLUE_TASKS) and set(config.SEQ2SEQ_TASK_NAMES) == set(SEQ2SEQ_TASKS)
    assert config.DEFAULT_BUCKETS == DEFAULT_BUCKETS
