"""Faults that lose nothing, each met by a real ``isojax finetune`` process: a second run on the same output
directory, a torn last line of ``log.jsonl``, a flipped byte in the latest checkpoint, training data edited between
sittings, a full disk and a read-only output directory.

Reference: the uninterrupted run of the same command (a tiny random BERT on 32 synthetic RTE rows, 8 steps, a
checkpoint every 2). A run that meets a fault and is rerun ends with its parameters bit for bit and logs its losses.
The full disk and the read-only directory are tmpfs mounts in a mount namespace of their own (``unshare``); where the
machine allows none, those tests skip, saying so.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import train_worker
import transformers
from conftest import read_json, read_jsonl, save_tiny_encoder

from isojax.cli import EXIT_ENVIRONMENT

WORDS = "the a cat dog sat ran on under mat log big small red".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_model_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path))
    return save_tiny_encoder(tmp_path_factory.mktemp("tiny") / "model", tokenizer)


def _rte(path: Path, rows: int, seed: int) -> None:
    """A GLUE RTE file of ``rows`` random sentence pairs, labels alternating."""
    rng = np.random.default_rng(seed)
    lines = ["index\tsentence1\tsentence2\tlabel"]
    for i in range(rows):
        pair = " ".join(rng.choice(WORDS, 6)), " ".join(rng.choice(WORDS, 4))
        lines.append(f"{i}\t{pair[0]}\t{pair[1]}\t{('entailment', 'not_entailment')[i % 2]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    _rte(root / "glue" / "RTE" / "train.tsv", 32, seed=0)
    _rte(root / "glue" / "RTE" / "dev.tsv", 16, seed=1)
    return root


def _argv(model, data, out, *extra):
    return [
        "finetune",
        *("--task", "rte", "--model", str(model), "--data-dir", str(data), "--out", str(out)),
        *("--max-length", "32", "--batch-size", "8", "--eval-batch-size", "8", "--steps", "8", "--lr", "1e-3"),
        *("--save-every", "2", "--keep-checkpoints", "10", "--log-every", "1", "--devices", "1", "--no-progress"),
        *extra,
    ]


def _finish(child: subprocess.Popen, status: int = 0) -> str:
    output, _ = child.communicate(timeout=600)
    assert child.returncode == status, output[-3000:]
    return output


def _cli(argv, *, wrap=(), timeout=300) -> subprocess.CompletedProcess:
    """``isojax ARGV`` in a new process (this checkout's isojax), stdout and stderr apart; ``wrap``: a command line
    that runs it (``unshare ...``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(train_worker.REPO), os.environ.get("PYTHONPATH", "")]))
    command = [*wrap, sys.executable, "-m", "isojax.cli", *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def reference(tiny, data_dir, tmp_path_factory):
    """The uninterrupted run: its directory, final parameters and train records."""
    records = tmp_path_factory.mktemp("reference")
    _finish(train_worker.launch(0, records, _argv(tiny, data_dir, records / "run"), stdout=subprocess.PIPE))
    return records / "run", dict(np.load(records / "final_0.npz")), _losses(records / "run")


def _losses(out) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(out / "log.jsonl") if r["kind"] == "train"}


def _assert_reference_parameters(records: Path, reference) -> None:
    got, want = np.load(records / "final_0.npz"), reference[1]
    assert sorted(got.files) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def _run_until(out: Path, reference, last: int) -> None:
    """``out`` as a run killed after the checkpoint of step ``last`` leaves it: the reference's checkpoints up to
    there, and its log up to there."""
    for step in range(2, last + 1, 2):
        shutil.copytree(reference[0] / "checkpoints" / str(step), out / "checkpoints" / str(step))
    lines = (reference[0] / "log.jsonl").read_text().splitlines(keepends=True)
    (out / "log.jsonl").write_text("".join(line for line in lines if json.loads(line)["step"] <= last))


def test_a_second_run_on_the_same_directory_is_refused_at_once_and_the_first_finishes_intact(
    tiny, data_dir, reference, tmp_path
):
    out, go_on = tmp_path / "run", tmp_path / "go-on"
    first = train_worker.launch(
        2, tmp_path, _argv(tiny, data_dir, out), stdout=subprocess.PIPE, TRAIN_WORKER_CONTINUE_ON=str(go_on)
    )
    try:
        lines = [first.stdout.readline()]
        while lines[-1] and "STALLED" not in lines[-1]:  # the checkpoint of step 2 is on disk: the run is under way
            lines.append(first.stdout.readline())
        assert "STALLED" in lines[-1], "".join(lines)[-3000:]
        second = _cli(_argv(tiny, data_dir, out))
    finally:
        go_on.touch()
    assert second.returncode == EXIT_ENVIRONMENT, second.stderr[-3000:]
    assert second.stderr == (
        f"isojax finetune: error: {out} is in use by another process (pid {first.pid} on {socket.gethostname()}): "
        "wait for it to end, or choose another directory\n"
    )
    _finish(first)
    _assert_reference_parameters(tmp_path, reference)
    assert _losses(out) == reference[2]
    assert [r["kind"] for r in read_jsonl(out / "log.jsonl")].count("eval") == 2  # steps 0 and 8, each once


def test_a_torn_last_log_line_is_cut_off_and_the_rerun_finishes_with_results(tiny, data_dir, reference, tmp_path):
    out = tmp_path / "run"
    _run_until(out, reference, 8)
    torn = '{"kind": "train", "step": 9, "lo'
    with open(out / "log.jsonl", "a") as f:
        f.write(torn)
    output = _finish(train_worker.launch(0, tmp_path, _argv(tiny, data_dir, out), stdout=subprocess.PIPE))
    assert f"{out / 'log.jsonl'}: its last line was cut short ({len(torn)} bytes" in output
    records = read_jsonl(out / "log.jsonl")  # every line whole
    assert [r["step"] for r in records if r["kind"] == "resume"] == [8]
    assert read_json(out / "results.json")["stages"] == read_json(reference[0] / "results.json")["stages"]
    _assert_reference_parameters(tmp_path, reference)


def test_a_flipped_byte_in_the_latest_checkpoint_is_named_set_aside_and_the_run_ends_as_if_uninterrupted(
    tiny, data_dir, reference, tmp_path
):
    out = tmp_path / "run"
    _run_until(out, reference, 6)
    files = [p for p in (out / "checkpoints" / "6" / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    flipped = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    output = _finish(train_worker.launch(0, tmp_path, _argv(tiny, data_dir, out), stdout=subprocess.PIPE))
    assert (
        f"checkpoint step 6 in {out / 'checkpoints'} cannot be read (CorruptCheckpoint: {flipped} does not match the "
        "sha256 recorded when it was written)"
    ) in output
    assert [p.name.split(".")[:2] for p in (out / "checkpoints").iterdir() if "unreadable" in p.name] == [
        ["6", "unreadable"]
    ]
    assert [r["step"] for r in read_jsonl(out / "log.jsonl") if r["kind"] == "resume"] == [4]
    _assert_reference_parameters(tmp_path, reference)
    assert _losses(out) == reference[2]  # steps 5 and 6 logged twice, with the same losses


def test_resuming_on_edited_training_rows_is_refused_naming_the_file_unless_accepted(
    tiny, data_dir, reference, tmp_path
):
    out, train = tmp_path / "run", data_dir / "glue" / "RTE" / "train.tsv"
    _run_until(out, reference, 6)
    rows = train.read_text()
    train.write_text(rows.replace("\tentailment\n", "\tnot_entailment\n", 1))  # one label changed
    try:
        refused = _cli(_argv(tiny, data_dir, out))
        accepted = _cli(_argv(tiny, data_dir, out, "--accept-changed-data")) if refused.returncode == 2 else None
    finally:
        train.write_text(rows)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr == (
        f"isojax finetune: error: the train rows ({train}: 32 rows) differ from those the checkpoints in "
        f"{out / 'checkpoints'} were written with ({train}: 32 rows); restore the data, choose a new output_dir, or "
        "resume on these rows with logging.accept_changed_data (--accept-changed-data)\n"
    )
    assert accepted is not None and accepted.returncode == 0, accepted and accepted.stderr[-3000:]
    assert f"WARNING the train rows ({train}: 32 rows) differ" in accepted.stderr
    assert [r["step"] for r in read_jsonl(out / "log.jsonl") if r["kind"] == "resume"] == [6]


@pytest.mark.parametrize("size", ["2m", "3m"])  # the disk fills in the first or in the second save
def test_a_full_disk_while_checkpointing_exits_74_with_one_line(tiny, data_dir, tmp_path, tmpfs, size):
    """One line, also when orbax's other writes fail after it (their reports come as the process ends)."""
    small = tmp_path / "small"
    small.mkdir()
    result = _cli(_argv(tiny, data_dir, small / "run"), wrap=tmpfs(f"size={size}", small))
    assert result.returncode == EXIT_ENVIRONMENT, result.stderr[-3000:]
    assert result.stderr.startswith("isojax finetune: error: [Errno 28] ") and result.stderr.count("\n") == 1
    assert "No space left on device" in result.stderr and f"{small / 'run' / 'checkpoints'}" in result.stderr


def test_a_read_only_output_directory_is_refused_before_the_model_loads(data_dir, tmp_path, tmpfs):
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    missing_model = tmp_path / "no-such-model"  # were it loaded first, the error would name it
    result = _cli(_argv(missing_model, data_dir, frozen / "run"), wrap=tmpfs("ro,size=1m", frozen))
    assert result.returncode == EXIT_ENVIRONMENT, result.stderr[-3000:]
    assert result.stderr == f"isojax finetune: error: {frozen / 'run'} cannot be written (Read-only file system)\n"


def test_digests_are_recorded_for_the_steps_a_process_saved_and_never_for_an_earlier_process_steps(tmp_path):
    """Each step saved is vouched for by the sha256 of its files (computed here with hashlib); a step of an earlier
    process that ended before recording its digests stays without them rather than being vouched for later."""
    import hashlib

    from isojax.train.checkpoint import MANIFEST, Checkpoints

    state = {"w": np.arange(6, dtype=np.float32), "b": np.ones(2, np.float32)}
    with Checkpoints(str(tmp_path)) as checkpoints:
        checkpoints.save(1, state, {"stage": 0})
    (tmp_path / "1" / MANIFEST).unlink()  # as if that process had been killed before recording them
    with Checkpoints(str(tmp_path)) as checkpoints:
        checkpoints.save(2, state, {"stage": 0})
    assert not (tmp_path / "1" / MANIFEST).exists()
    files = sorted(p for p in (tmp_path / "2").rglob("*") if p.is_file() and p.name != MANIFEST)
    assert files and read_json(tmp_path / "2" / MANIFEST) == {
        p.relative_to(tmp_path / "2").as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
    }
