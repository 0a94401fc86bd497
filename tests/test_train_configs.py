"""The shipped GLUE run configurations expand into valid ``isojax finetune`` runs with the papers' settings.

References: the hyperparameters stated in the papers (isotropy-calibration App. B, shrink-the-longest Table 1),
written out here; the grid sizes are the products of the papers' model/task/method/seed lists.
"""
import argparse
import importlib.util
import json
import math
from pathlib import Path

import pytest

from isojax.train.cli import add_finetune_parser, config_from_args

CONFIG_DIR = Path(__file__).resolve().parent.parent / "experiments" / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.json"))
_spec = importlib.util.spec_from_file_location("configs_run", CONFIG_DIR / "run.py")
_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_run)
expand = _run.expand


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_finetune_parser(parser.add_subparsers())
    return config_from_args(parser.parse_args(argv))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_run_is_a_valid_configuration(path):
    with open(path) as f:
        config = json.load(f)
    runs = [_parse(argv) for argv in expand(config, "x", "/tmp/runs")]
    sizes = [len(v) for v in config["grid"].values()]
    assert len(runs) == len({r.output_dir for r in runs}) == math.prod(sizes)


def _runs(name):
    with open(CONFIG_DIR / name) as f:
        return [_parse(argv) for argv in expand(json.load(f), "x")]


def test_calibration_settings_follow_appendix_b():
    runs = _runs("isotropy_calibration_glue.json")
    for r in runs:
        assert (r.batch_size, r.schedule, r.warmup_ratio) == (32, "constant", 0.0)
        assert r.epochs == (5 if r.task in ("mrpc", "wnli") else 3)
        assert r.learning_rate == (1e-5 if r.model == "roberta-base" else 2e-5)
    assert {r.method for r in runs} == {"baseline", "cosine", "spectrum_pol", "spectrum_exp"}
    assert len({r.task for r in runs}) == 9


def test_shrink_settings_follow_its_table_1():
    for r in _runs("shrink_glue.json"):
        assert (r.batch_size, r.epochs) == (64, 10)
        assert (r.learning_rate, r.weight_decay) == ((8e-5, 8e-6) if r.task == "mrpc" else (5e-5, 5e-6))
