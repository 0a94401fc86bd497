"""Sequence-to-sequence training steps (label-smoothed token loss, a regulariser on the output embeddings and one
on the decoder states, the flow's likelihood) and decoding give the same losses, parameters and tokens on 1
device, on 8 virtual devices under the mesh (data, and data x model) and under pmap; a killed flow run resumes to
the parameters of an uninterrupted one.

References: the single-device run; the uninterrupted run (as tests/test_train_loop.py does for classification).
"""

import subprocess

import chex
import jax
import numpy as np
import pytest
import seq2seq_helpers
import train_worker
from conftest import read_jsonl, require
from test_train_parallel import _run, assert_same_training

from isojax.calibrate import Flow
from isojax.models import from_pretrained
from isojax.train.objective import Regularizer
from isojax.train.optim import make_optimizer
from isojax.train.state import create_state
from isojax.train.tasks.seq2seq import (
    IGNORE_INDEX,
    Seq2SeqModel,
    Seq2SeqObjective,
    init_variables,
    make_generate_step,
    shift_tokens_right,
)

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest gives 8 virtual CPUs)")

B, S, T, STEPS = 16, 10, 8, 3


def _batch(i):
    r = np.random.default_rng(i)
    source = (np.arange(S) < r.integers(3, S + 1, B)[:, None]).astype(np.int32)
    target = (np.arange(T) < r.integers(2, T + 1, B)[:, None]).astype(np.int32)
    labels = np.where(target == 1, r.integers(4, 14, (B, T)), IGNORE_INDEX).astype(np.int32)
    return {
        "input_ids": np.where(source == 1, r.integers(4, 14, (B, S)), 1).astype(np.int32),
        "attention_mask": source,
        "decoder_input_ids": shift_tokens_right(labels, 1, 2),
        "decoder_attention_mask": target,
        "labels": labels,
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    network, params, _ = from_pretrained(seq2seq_helpers.tiny_bart(tmp_path_factory.mktemp("bart") / "m"))
    model = Seq2SeqModel(network, flow=Flow(levels=2, depth=2, hidden=8))
    b = _batch(100)
    h, mask = model.apply({"params": {"encoder": params}}, *(b[k] for k in model.INPUTS), method="flow_features")
    variables = init_variables(model, params, jax.random.key(2), np.asarray(h)[np.asarray(mask)])
    objective = Seq2SeqObjective(
        14, (Regularizer("cosine", 1.0, "embedding"), Regularizer("istar", 0.3, "tokens")), label_smoothing=0.1
    )
    optimizer = make_optimizer(
        variables["params"],
        learning_rate=3e-3,
        transform_learning_rate=1e-2,
        weight_decay=0.01,
        total_updates=STEPS,
        warmup_steps=1,
    )
    state = create_state(variables, optimizer, seed=0)
    predict = lambda m: make_generate_step(m, max_length=T)  # noqa: E731
    runs = {"initial_bias": np.asarray(params["final_logits_bias"])}
    for args in (("mesh", 1), ("mesh", 8), ("mesh", 8, 2), ("pmap", 8)):
        history, host, runner, placed = _run((model, objective, optimizer, state), *args, predict=predict, batch=_batch)
        runs[args] = history, host, runner.predict(placed, _batch(7))["sequences"]  # host numpy, every row
    return runs


@pytest.mark.parametrize("args", [("mesh", 8), ("mesh", 8, 2), ("pmap", 8)], ids=["mesh8", "mesh4x2", "pmap8"])
@pytest.mark.slow
def test_seq2seq_steps_and_decoding_match_single_device(setup, args):
    ref_history, ref_state, ref_sequences = setup[("mesh", 1)]
    history, state, sequences = setup[args]
    assert set(history[0]) == {"loss", "task", "cosine@embedding", "istar@tokens", "flow", "grad_norm"}
    assert_same_training(history, ref_history, state, ref_state)
    chex.assert_trees_all_close(state.constants, ref_state.constants, atol=0, rtol=0)
    np.testing.assert_array_equal(sequences, ref_sequences)
    # BART's final_logits_bias is a buffer: never trained
    np.testing.assert_array_equal(state.params["encoder"]["final_logits_bias"], setup["initial_bias"])


def _argv(model, data, out):
    return [
        "finetune",
        "--task",
        "seq2seq",
        "--data-source",
        data,
        "--model",
        model,
        "--method",
        "flow",
        "--out",
        str(out),
        "--max-length",
        "16",
        "--max-target-length",
        "16",
        "--batch-size",
        "16",
        "--eval-batch-size",
        "32",
        "--eval-limit",
        "8",
        "--train-limit",
        "64",
        "--steps",
        "12",
        "--save-every",
        "4",
        "--keep-checkpoints",
        "10",
        "--lr",
        "3e-3",
        "--log-every",
        "1",
        "--devices",
        "1",
        "--no-progress",
        "--flow-levels",
        "2",
        "--flow-depth",
        "2",
    ]


def _worker(stall, records, argv):
    return train_worker.launch(stall, records, argv, stdout=subprocess.PIPE)


@pytest.mark.slow
def test_killed_flow_run_resumes_to_the_uninterrupted_parameters(tmp_path):
    """Dropout on, a flow (its constants in the checkpoint): killed right after the checkpoint of step 8 of 12,
    then resumed, the run ends with the parameters of an uninterrupted run (both in tests/train_worker.py
    processes)."""
    require("datasets")  # the local JSONL files are read through it
    model = seq2seq_helpers.tiny_bart(tmp_path / "m", dropout=0.1)
    data = seq2seq_helpers.reversal_task(tmp_path, train=64, dev=8)
    reference = _worker(0, tmp_path / "reference", _argv(model, data, tmp_path / "reference" / "out"))
    output, _ = reference.communicate(timeout=600)
    assert reference.returncode == 0, output[-3000:]
    argv = _argv(model, data, tmp_path / "run")
    train_worker.kill_when_stalled(_worker(8, tmp_path, argv))
    resumed = _worker(0, tmp_path, argv)
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output[-3000:]
    got, want = np.load(tmp_path / "final_0.npz"), np.load(tmp_path / "reference" / "final_0.npz")
    assert len(got.files) == len(want.files)
    for name in want.files:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6)
    records = read_jsonl(tmp_path / "run" / "log.jsonl")
    assert [r["step"] for r in records if r["kind"] == "resume"] == [8]
    assert sorted({r["step"] for r in records if r["kind"] == "train"}) == list(range(1, 13))
