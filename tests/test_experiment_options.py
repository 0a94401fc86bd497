"""The experiments' command lines refuse a count or size they cannot use as a usage error that names the option.

Before, they were plain ``int`` options, so such a value reached the benchmark or the model itself.
"""

import importlib

import pytest


@pytest.mark.parametrize(
    "module, argv, low",
    [
        ("experiments.benchmarks.decoding", ["--beams", "0"], 1),
        ("experiments.benchmarks.softdecay", ["--repeats", "0"], 1),
        ("experiments.benchmarks.metrics", ["--points", "1"], 2),
        ("experiments.benchmarks.metrics", ["--sizes", "64", "0"], 2),
        ("experiments.benchmarks.encoder_forward", ["--layers", "0"], 1),
        ("experiments.benchmarks.encode", ["--max-length", "1"], 2),
        ("experiments.benchmarks.decompositions", ["--repeats", "-3"], 1),
        ("experiments.benchmarks.profile_step", ["--heads", "0"], 1),
        ("experiments.benchmarks.compile_time", ["--repeats", "-1"], 0),
        ("experiments.benchmarks.scale", ["--length", "0"], 1),
        ("experiments.reproductions.softdecay_sts", ["--flow-steps", "0"], 1),
        ("experiments.reproductions.finetune_methods", ["--eval-points", "0"], 1),
    ],
)
def test_a_bad_count_is_a_usage_error_naming_its_option(module, argv, low, capsys):
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).main(argv)
    assert exit_.value.code == 2
    flag = [a for a in argv if a.startswith("--")][0]
    assert f"error: argument {flag}: expected an integer >= {low}, got '{argv[-1]}'" in capsys.readouterr().err
