"""The isojax command end to end on the bundled default model (small inputs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from conftest import require

from isojax.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_analyze_writes_table_figures_and_json(tmp_path, capsys, default_model_path):
    out = tmp_path / "out"
    assert main(["analyze", "--limit", "24", "--out", str(out), "--json", str(tmp_path / "a.json"), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "TokenUni" in text and "input embedding matrix W: I1 " in text
    result = json.loads((tmp_path / "a.json").read_text())
    assert 0 < result["input_embeddings"]["I1"] <= 1 and 0 < result["input_embeddings"]["I2"] < 1
    assert result["layers"] == list(range(7)) and len(result["cdf"]) == 7
    assert all(0 <= v <= 1 for v in result["cdf"][3]) and result["cdf"][3][-1] == pytest.approx(1.0)
    assert (out / "sv_cdf.png").stat().st_size > 1000 and (out / "layers.png").stat().st_size > 1000


def test_wordsim_with_a_user_file(tmp_path, capsys, default_model_path):
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("# my pairs\ncat\tdog\t8.0\ncar bus 6.5\napple pear 7\ncat car 1.5\nking queen 8.5\n")
    assert (
        main(
            [
                "wordsim",
                "--data",
                "ws353",
                "--file",
                str(pairs),
                "--methods",
                "raw,center",
                "--similarity",
                "cosine",
                "--json",
                str(tmp_path / "w.json"),
            ]
        )
        == 0
    )
    rows = json.loads((tmp_path / "w.json").read_text())["rows"]
    assert {(r["method"], r["data"]) for r in rows} == {
        ("raw", "ws353"),
        ("center", "ws353"),
        ("raw", "pairs"),
        ("center", "pairs"),
    }
    assert all(r["pairs_used"] == 5 for r in rows if r["data"] == "pairs")


def test_sts_rejects_unknown_method(tmp_path, capsys):
    assert main(["sts", "--methods", "raw,nonsense", "--no-isotropy", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("isojax sts: error: unknown STS method")


@pytest.mark.parametrize(
    "argv, flag, value",
    [
        (["sts", "--flow-steps", "0"], "--flow-steps", "0"),
        (["sts", "--limit", "-1"], "--limit", "-1"),  # was head(-1): every pair but the last, silently
        (["sts", "--batch-size", "0"], "--batch-size", "0"),  # was "range() arg 3 must not be zero"
        (["sts", "--whiten-k", "0"], "--whiten-k", "0"),
        (["sts", "--abtt-d", "-2"], "--abtt-d", "-2"),
        (["analyze", "--tokens-per-text", "-1"], "--tokens-per-text", "-1"),
        (["analyze", "--max-length", "1"], "--max-length", "1"),
        (["analyze", "--limit", "ten"], "--limit", "ten"),
        (["sts", "--seed", "-1"], "--seed", "-1"),
    ],
)
def test_a_bad_count_or_address_is_a_usage_error_that_names_its_flag(argv, flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    expected = "HOST:PORT" if flag == "--coordinator" else "an integer >= "
    assert err.startswith(f"isojax {argv[0]}: error: argument {flag}: expected {expected}") and repr(value) in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-processes", "0", "--process-id", "0"], "--num-processes: expected an integer >= 1, got 0"),
        (["--num-processes", "2", "--process-id", "-1"], "--process-id: expected an integer >= 0, got -1"),
        (["--coordinator", "nohost"], "--coordinator: expected HOST:PORT with a port in 1..65535, got 'nohost'"),
        (["--coordinator", "host:http"], "--coordinator: expected HOST:PORT"),
        (["--coordinator", ":1234"], "--coordinator: expected HOST:PORT"),
    ],
)
def test_a_bad_multi_process_option_is_one_line_that_names_it(argv, message, capsys):
    assert main(["finetune", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("isojax finetune: error: ") and message in err and err.count("\n") == 1


def test_a_coordinator_address_keeps_its_host():
    from isojax.argtypes import host_port

    assert [host_port(a) for a in ("localhost:1234", "[::1]:8476", "10.0.0.2:1")] == [
        "localhost:1234",
        "[::1]:8476",
        "10.0.0.2:1",
    ]


def test_finetune_refuses_bad_settings_before_a_multi_process_job_starts(monkeypatch, capsys):
    import isojax.train.parallel

    def started(*args, **kwargs):  # process 1 of 2 would wait here for the coordinator (minutes, then time out)
        raise AssertionError("jax.distributed started before the settings were checked")

    monkeypatch.setattr(isojax.train.parallel, "initialize_distributed", started)
    argv = ["finetune", "--epochs", "0", "--coordinator", "localhost:1", "--num-processes", "2", "--process-id", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("isojax finetune: error: ") and "optim.epochs (--epochs) must be a positive number" in err


@pytest.mark.parametrize(
    "argv, start",
    [
        (["--data", "nosuch"], "--data 'nosuch': name: unknown STS data set 'nosuch'"),
        (
            ["--alpha-data", "stsb:tset"],
            "--alpha-data 'stsb:tset': split: stsb has splits ['train', 'validation', 'test']",
        ),
    ],
)
def test_sts_names_the_option_of_a_bad_set(argv, start, capsys):
    assert main(["sts", *argv, "--methods", "raw,softdecay", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(f"isojax sts: error: {start}")


def test_abtt_label_names_zero_directions():
    from isojax.eval.sts import Transform

    assert Transform("abtt", abtt_D=0).label == "abtt (D=0, centered)"  # was "D=d/100": 0 read as unset
    assert Transform("abtt").label == "abtt (D=d/100, centered)"


def test_help_explains_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["sts", "--help"])
    assert "--alpha" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    out = capsys.readouterr().out
    # the multi-host example keeps its shell line continuations (a plain docstring swallowed them into one line)
    assert "--task stsb \\\n        --coordinator localhost:1234" in out


# Hides an installed PyTorch from transformers' availability check, as on a machine without it (isojax needs none).
HIDE_TORCH = """
import sys


class _HideTorch:
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


sys.meta_path[:] = [_HideTorch(f) for f in sys.meta_path]
"""


def _run(args, tmp_path):
    (tmp_path / "site").mkdir(exist_ok=True)
    (tmp_path / "site" / "sitecustomize.py").write_text(HIDE_TORCH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_sts_over_several_sets_end_to_end_without_the_pytorch_notice(shared_data_dir, tmp_path, default_model_path):
    control = _run(["-c", "import transformers"], tmp_path)
    assert "PyTorch was not found" in control.stderr  # transformers alone prints it here
    done = _run(
        [
            "-m",
            "isojax.cli",
            "sts",
            "--data",
            "stsb,sts12,sickr:all",
            "--data-dir",
            str(shared_data_dir),
            "--limit",
            "40",
            "--methods",
            "raw,softdecay",
            "--quiet",
            "--json",
            str(tmp_path / "s.json"),
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # nothing but what was asked for: no PyTorch notice, no progress bars
    lines = done.stdout.splitlines()
    assert lines[0].startswith("default, mean pooling") and "pairs: stsb 40, sts12 40, sickr:all 40" in lines[0]
    assert lines[1].startswith("SoftDecay alpha search on stsb validation (40 pairs)")
    assert lines[2].split() == ["method", "stsb", "sts12", "sickr:all", "avg"]
    result = json.loads((tmp_path / "s.json").read_text())
    assert list(result["sets"]) == ["stsb", "sts12", "sickr:all"]
    assert [(s["name"], s["split"], s["pairs"]) for s in result["sets"].values()] == [
        ("stsb", "test", 40),
        ("sts12", "test", 40),
        ("sickr", "all", 40),
    ]
    alpha = result["alpha_search"]["best"]
    for label, values in zip(result["sets"], zip(*(line.split()[-4:-1] for line in lines[3:5]))):
        rows = result["sets"][label]["rows"]
        assert [r["method"] for r in rows] == ["raw", f"softdecay (alpha={alpha:g})"]
        assert [f"{r['spearman']:.2f}" for r in rows] == list(values)  # the table shows the JSON's numbers
        assert {"token_uni", "rbf_dis", "ev1", "isoscore", "lsds", "pearson"} <= set(rows[0])
    raw = [s["rows"][0]["spearman"] for s in result["sets"].values()]
    assert result["average"]["raw"] == pytest.approx(np.mean(raw))
    # The same first 40 STS12 pairs, embedded and scored in this process, give the same raw Spearman.
    import isojax
    from isojax.data import load_sts
    from isojax.eval import sts

    data = load_sts("sts12", data_dir=shared_data_dir).head(40)
    a, b = sts.embed_pairs(*isojax.from_pretrained("default"), data)
    assert raw[1] == pytest.approx(
        100 * scipy.stats.spearmanr(sts.cosine_scores(a, b), data.scores).statistic, abs=1e-6
    )


def test_sts_rejects_unknown_sets_before_loading_the_model(capsys):
    require("datasets")  # STS-B is read (through datasets) before the unknown name is reached
    assert main(["sts", "--data", "stsb,sts17", "--quiet"]) == 2
    assert "unknown STS data set 'sts17'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def untokenized_model(tmp_path_factory):
    """A tiny random BERT saved without tokenizer files (what ``save_pretrained`` writes when given none)."""
    import jax
    import jax.numpy as jnp

    from isojax.models import TransformerConfig, build_encoder, save_pretrained

    cfg = TransformerConfig(
        vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    module = build_encoder(cfg)
    params = module.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
    return save_pretrained(module, params, str(tmp_path_factory.mktemp("untokenized") / "model"))


@pytest.mark.parametrize(
    "argv, purpose",
    [  # each was an AttributeError traceback ('NoneType' object has no attribute ...) once the model had loaded
        (["analyze", "--limit", "5"], "isojax analyze"),
        (["sts", "--limit", "5", "--methods", "raw", "--quiet", "--no-isotropy"], "isojax sts"),
        (["wordsim", "--data", "ws353"], "isojax wordsim"),
    ],
)
def test_a_model_without_tokenizer_files_is_named(untokenized_model, argv, purpose, capsys):
    assert main([*argv, "--model", untokenized_model]) == 2
    assert capsys.readouterr().err == (
        f"isojax {argv[0]}: error: model {untokenized_model!r} has no tokenizer files (tokenizer.json, vocab.txt, "
        f"...); {purpose} needs one\n"
    )
