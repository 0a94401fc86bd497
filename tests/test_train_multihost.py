"""Multi-host fine-tuning simulated with two processes on this machine (a localhost coordinator, four CPU devices
each, Gloo collectives): trained, checkpointed from both processes, killed, resumed, it ends with the parameters
of the same run in one process on eight devices; each process tokenised only its own rows of every batch. SIGTERM to
one process stops both at one step, checkpointed by both, and the resumed pair ends there too. Also,
in one process: the rows that two processes feed make up the single-process batches; bad multi-process options;
a process that reaches no coordinator (a closed localhost port) or reaches it late.

References: the single-process run of the same command (``--devices 8``); the batch order written out here from
its documented rule (``numpy.random.default_rng([seed, epoch]).permutation``, row blocks of the batch sharding)
for the rows each process must have tokenised; :func:`isojax.data.batching.batches` over the whole tokenised split
for the batches that the processes' rows must make up.

Every run is a ``tests/train_worker.py`` subprocess (``python -m isojax.cli finetune`` with probes) in
its own process group, killed in a ``finally``; each wait has a deadline.
"""

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import train_worker
import transformers
from conftest import read_json, read_jsonl
from jax.experimental import multihost_utils

from isojax.cli import EXIT_ENVIRONMENT, EXIT_STOPPED, main
from isojax.data.batching import batches, tokenize
from isojax.data.glue import GlueData, glue_task
from isojax.models import TransformerConfig, build_encoder, save_pretrained
from isojax.train import parallel
from isojax.train.feed import Split, batch_indices, process_batches
from isojax.train.parallel import initialize_distributed, select_devices

DEADLINE_S = 420  # for the whole run: 1.5 min on two quiet cores, 3.5 min when other jobs load them (load 8)
SEED, BATCH, STEPS, STALL, N_TRAIN, N_DEV = 3, 8, 6, 4, 24, 12
WORDS = "the a cat dog sat on mat ran far away quickly under old tree river bank green small house near".split()


def _rows(split: str, n: int) -> list[dict]:
    """STS-B rows: short pairs, and every eighth row long (over 32 tokens), so that batch widths differ (32 or 64)
    and, within a batch, between the processes' halves."""
    rng = np.random.default_rng(len(split))
    return [
        {
            "sentence1": f"{split} {i} "
            + " ".join(rng.choice(WORDS, rng.integers(30, 40) if i % 8 == 5 else rng.integers(2, 10))),
            "sentence2": " ".join(rng.choice(WORDS, rng.integers(2, 8))),
            "label": float(rng.uniform(0, 5)),
            "idx": i,
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    return transformers.AutoTokenizer.from_pretrained(str(default_model_path))


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    """A tiny random BERT with the bundled tokenizer, and STS-B-layout JSON Lines files of :func:`_rows`.
    Returns the data's root, the model path, the first texts and the pairs' token counts of each split."""
    root = tmp_path_factory.mktemp("multihost")
    cfg = TransformerConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    module = build_encoder(cfg)
    params = module.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
    model = save_pretrained(module, params, str(root / "model"), tokenizer=tokenizer)
    (root / "data").mkdir()
    texts, lengths = {}, {}
    for split, n in (("train", N_TRAIN), ("validation", N_DEV)):
        rows = _rows(split, n)
        (root / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        texts[split] = [r["sentence1"] for r in rows]
        lengths[split] = np.array([len(tokenizer(r["sentence1"], r["sentence2"])["input_ids"]) for r in rows])
    return root, model, texts, lengths


def test_two_processes_rows_make_up_the_single_process_batches(tokenizer, monkeypatch):
    """process_batches for each half of every batch, the exchange of lengths played by a stand-in all-gather;
    reference: batches() over the whole split tokenised at once (whose width, the longest row, is max_length)."""
    rows, max_length = _rows("train", N_TRAIN), 40
    data = GlueData(
        [r["sentence1"] for r in rows],
        [r["sentence2"] for r in rows],
        np.array([r["label"] for r in rows], np.float32),
        glue_task("stsb"),
        "train",
    )
    split = Split(data, tokenizer, max_length)
    whole = {**tokenize(tokenizer, data.texts_a, data.texts_b, max_length=max_length), "labels": data.labels}
    assert whole["input_ids"].shape[1] == max_length  # a row is truncated, so batches() also caps at max_length
    position = dict(shuffle=True, seed=SEED, epoch=0, start=1, drop_last=True)  # batches 1 and 2 of epoch 0
    want = list(batches(whole, BATCH, **position))
    order = batch_indices(N_TRAIN, BATCH, **position)
    halves = [np.arange(BATCH // 2), np.arange(BATCH // 2, BATCH)]
    lengths = whole["attention_mask"].sum(1)
    longest = [np.array([[lengths[b[h]].max() for b in order]]) for h in halves]  # [groups=1, batches]
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    got = []
    for p in (0, 1):
        monkeypatch.setattr(
            multihost_utils,
            "process_allgather",
            lambda x, p=p: np.stack([x, longest[1]] if p == 0 else [longest[0], x]),
        )
        got.append(list(process_batches(split, order, halves[p])))
    assert len(got[0]) == len(got[1]) == len(want) == 2
    for g0, g1, w in zip(*got, want):
        assert set(g0) == set(w)
        for key in w:
            np.testing.assert_array_equal(np.concatenate([g0[key], g1[key]]), w[key], err_msg=key)
    widths = [w["input_ids"].shape[1] for w in want]
    assert len(set(widths)) > 1  # the data give batches of different widths ...
    # ... and a half whose own rows are all shorter than its batch's width (it is padded up to it)
    assert any(longest[p].max() < width for p in (0, 1) for width in widths)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--num-processes", "2"], "num_processes and process_id go together"),
        (["--num-processes", "2", "--process-id", "2"], r"process_id must be in [0, num_processes=2), got 2"),
        (["--distributed", "maybe"], "invalid choice 'maybe' for argument '--distributed'"),
        (["--coordinator-timeout", "0"], "--coordinator-timeout: expected an integer >= 1, got 0"),
    ],
)
def test_bad_multi_process_options_fail_before_jax_starts(extra, message, capsys):
    try:
        assert main(["finetune", *extra]) == 2
    except SystemExit as e:  # argparse's own errors
        assert e.code == 2
    assert message in capsys.readouterr().err


def _closed_port() -> int:
    """A localhost port that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jax_initialize(monkeypatch):
    """``jax.distributed.initialize`` replaced by a recorder of its calls (a real one cannot be undone in-process)."""
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: calls.append((a, kw)))
    return calls


def test_a_process_that_reaches_no_coordinator_stops_with_an_error_naming_it(jax_initialize, capsys):
    address = f"127.0.0.1:{_closed_port()}"
    argv = ["finetune", "--coordinator", address, "--num-processes", "2", "--process-id", "1"]
    start = time.monotonic()
    assert main([*argv, "--coordinator-timeout", "2"]) == EXIT_ENVIRONMENT
    waited = time.monotonic() - start
    err = capsys.readouterr().err
    assert err.startswith(f"isojax finetune: error: coordinator {address}: no connection within 2 s (last: ")
    assert "Connection refused" in err and 2 <= waited < 10, (err, waited)
    assert jax_initialize == []  # JAX would have ended the process (DEADLINE_EXCEEDED) without naming the address


def test_a_late_coordinator_is_waited_for_and_jax_gets_the_rest_of_the_timeout(jax_initialize):
    port = _closed_port()
    server = []
    timer = threading.Timer(1.5, lambda: server.append(socket.create_server(("127.0.0.1", port))))
    timer.start()
    try:
        assert initialize_distributed(
            "auto", coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=1, initialization_timeout=20
        )
    finally:
        timer.join()
        for s in server:
            s.close()
    [(args, kwargs)] = jax_initialize
    assert args == (f"127.0.0.1:{port}", 2, 1) and 16 <= kwargs["initialization_timeout"] <= 19, kwargs


def test_process_0_waits_for_the_other_processes_and_jax_gets_the_rest_of_the_timeout(jax_initialize):
    address = f"127.0.0.1:{_closed_port()}"
    late = threading.Timer(1.5, lambda: parallel.wait_for_coordinator(address, 5))  # process 1, 1.5 s late
    late.start()
    try:
        assert initialize_distributed(
            "on", coordinator_address=address, num_processes=2, process_id=0, initialization_timeout=20
        )
    finally:
        late.join()
    [(args, kwargs)] = jax_initialize
    assert args == (address, 2, 0) and 16 <= kwargs["initialization_timeout"] <= 19, kwargs


def test_process_0_whose_peers_never_connect_exits_74_with_one_line(jax_initialize, capsys):
    address = f"127.0.0.1:{_closed_port()}"
    argv = ["finetune", "--coordinator", address, "--num-processes", "3", "--process-id", "0"]
    start = time.monotonic()
    assert main([*argv, "--coordinator-timeout", "2"]) == EXIT_ENVIRONMENT
    assert 2 <= time.monotonic() - start < 10
    assert capsys.readouterr().err == (
        f"isojax finetune: error: coordinator {address}: 0 of the 2 other processes connected within 2 s; are they "
        "all started with this --coordinator and --num-processes 3?\n"
    )
    assert jax_initialize == []  # JAX would have ended the process with SIGABRT and a C++ stack


@pytest.mark.parametrize(
    "timeout, error, message",
    [
        (0, ValueError, "initialization_timeout must be >= 1, got 0"),
        (2.5, TypeError, "initialization_timeout must be a Python int, got float 2.5"),
        (True, TypeError, "initialization_timeout must be a Python int, got bool True"),
    ],
)
def test_initialization_timeout_is_whole_seconds_of_at_least_one(timeout, error, message, jax_initialize):
    with pytest.raises(error, match=message):
        initialize_distributed("on", initialization_timeout=timeout)
    assert jax_initialize == []


def test_a_multi_process_run_uses_every_device(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(
        ValueError,
        match=r"devices: a multi-process run uses every process's devices \(\d+ over 2 "
        r"processes\), got 1",
    ):
        select_devices(1)
    assert select_devices(None) == jax.devices()


def _argv(root, model, out):
    """isoscore regulariser (a whole-batch statistic), dropout on, a (data 4 x model 2) mesh over 8 devices."""
    return [
        "finetune",
        "--task",
        "stsb",
        "--model",
        model,
        "--method",
        "isoscore",
        "--data-source",
        str(root / "data"),
        "--out",
        str(out),
        "--max-length",
        "64",
        "--batch-size",
        str(BATCH),
        "--eval-batch-size",
        str(BATCH),
        "--steps",
        str(STEPS),
        "--save-every",
        str(STALL),
        "--log-every",
        "1",
        "--lr",
        "1e-3",
        "--seed",
        str(SEED),
        "--devices",
        "8",
        "--model-parallel",
        "2",
        "--no-progress",
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """Worker processes, each in its own process group, with their output in files."""

    def __init__(self, root: Path):
        self.root, self.procs = root, []

    def start(self, name, argv, *, devices, stall=0, records, **env):
        with open(self.root / f"{name}.log", "w") as log:
            self.procs.append(
                (
                    name,
                    train_worker.launch(
                        stall,
                        records,
                        argv,
                        stdout=log,
                        JAX_PLATFORMS="cpu",
                        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                        HF_DATASETS_CACHE=str(self.root / "hf-datasets"),
                        **env,
                    ),
                )
            )

    def output(self, name) -> str:
        return (self.root / f"{name}.log").read_text()

    def wait_for(self, names, text, deadline):
        """Until every named worker's output holds ``text`` (a worker that exits first fails the test)."""
        while time.time() < deadline:
            if all(text in self.output(n) for n in names):
                return
            for name, p in self.procs:
                if name in names and p.poll() is not None:
                    pytest.fail(f"{name} exited with {p.returncode}:\n{self.output(name)[-3000:]}")
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {text!r}:\n" + "\n".join(self.output(n)[-2000:] for n in names))

    def finish(self, deadline, status=0):
        """Wait for the running workers to exit; each must exit with ``status``."""
        for name, p in self.procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} timed out:\n{self.output(name)[-3000:]}")
            assert p.returncode == status, f"{name} exited with {p.returncode}:\n{self.output(name)[-3000:]}"
        self.procs = []

    def kill(self) -> list[int]:
        """SIGKILL every worker's process group; returns the workers' exit statuses."""
        for _, p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:  # that group is gone already
                pass
        statuses = [p.wait() for _, p in self.procs]
        self.procs = []
        return statuses


def _two_processes(job, tag, argv, records, stall=0, env1=None):
    """Processes 0 and 1 of one job; ``env1``: extra environment variables of process 1."""
    port = _free_port()
    for pid in (0, 1):
        job.start(
            f"{tag}{pid}",
            argv + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(pid)],
            devices=4,
            stall=stall,
            records=records,
            **((env1 or {}) if pid == 1 else {}),
        )


@pytest.fixture(scope="module")
def single(setup, tmp_path_factory):
    """The reference: the same run in one process on eight devices (its directory, with ``final_0.npz`` under
    ``records``)."""
    root, model, _, _ = setup
    out = tmp_path_factory.mktemp("single")
    job = Job(out)
    try:
        job.start("single", _argv(root, model, out / "run"), devices=8, records=out / "records")
        job.finish(time.time() + DEADLINE_S)
    finally:
        job.kill()
    return out


def _assert_single_parameters(records, single):
    want = np.load(single / "records" / "final_0.npz")
    for process in (0, 1):
        got = np.load(records / f"final_{process}.npz")
        assert got.files == want.files
        for key in want.files:
            np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-6, err_msg=f"process {process} {key}")


def _expected_calls(process):
    """The rows that ``process`` must have tokenised, call by call (split, [row indices]): its rows (a contiguous
    half of each global batch, by the batch sharding over the data axis) of the dev batches at step 0, of epoch 0,
    of epoch 1 (its three batches, before the kill), of epoch 1 from batch 1 (resumed at step 4), and of the final
    dev batches."""
    half = slice(process * BATCH // 2, (process + 1) * BATCH // 2)
    order = [np.random.default_rng([SEED, e]).permutation(N_TRAIN) for e in (0, 1)]
    dev = np.arange(N_DEV)
    dev_call = [dev[:BATCH][half], np.concatenate([dev[BATCH:], np.repeat(dev[BATCH], 2 * BATCH - N_DEV)])[half]]
    train_calls = [
        [order[e][k * BATCH : (k + 1) * BATCH][half] for k in ks]
        for e, ks in ((0, range(3)), (1, range(3)), (1, range(1, 3)))
    ]
    return [("validation", dev_call)] + [("train", c) for c in train_calls] + [("validation", dev_call)]


@pytest.mark.slow
def test_two_processes_killed_and_resumed_end_with_the_single_process_parameters(setup, single, tmp_path):
    root, model, texts, lengths = setup
    # the processes must agree on batch widths: in some batches one half alone would be cut to 32 columns
    halves = [
        (lengths[split][b0].max() > 32, lengths[split][b1].max() > 32)
        for (split, c0), (_, c1) in zip(_expected_calls(0), _expected_calls(1))
        for b0, b1 in zip(c0, c1)
    ]
    assert any(h0 != h1 for h0, h1 in halves), halves
    deadline = time.time() + DEADLINE_S
    job = Job(tmp_path)
    try:
        records, out = tmp_path / "records", tmp_path / "run"
        _two_processes(job, "first", _argv(root, model, out), records, stall=STALL)
        job.wait_for(["first0", "first1"], "STALLED", deadline)
        assert job.kill() == [-signal.SIGKILL] * 2
        assert sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == [STALL]
        shards = sorted(p.name for p in (out / "checkpoints" / str(STALL) / "state").glob("ocdbt.process_*"))
        assert shards == ["ocdbt.process_0", "ocdbt.process_1"]  # both processes wrote their shards
        _two_processes(job, "resumed", _argv(root, model, out), records)
        job.finish(deadline)
    finally:
        job.kill()

    _assert_single_parameters(records, single)

    for process in (0, 1):
        calls = read_jsonl(records / f"tokenised_{process}.jsonl")
        expected = [[texts[split][i] for i in np.concatenate(blocks)] for split, blocks in _expected_calls(process)]
        assert calls == expected, f"process {process}"

    records_written = read_jsonl(out / "log.jsonl")  # by process 0 only: no duplicates
    train_steps = [r["step"] for r in records_written if r["kind"] == "train"]
    assert train_steps == list(range(1, STEPS + 1))
    assert [r["step"] for r in records_written if r["kind"] == "resume"] == [STALL]
    assert [r["step"] for r in records_written if r["kind"] == "eval"] == [0, STEPS]
    losses = {r["step"]: r["loss"] for r in read_jsonl(single / "run" / "log.jsonl") if r["kind"] == "train"}
    assert {r["step"]: r["loss"] for r in records_written if r["kind"] == "train"} == pytest.approx(losses, rel=1e-5)
    assert read_json(out / "results.json")["step"] == STEPS


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_one_process_stops_both_at_one_checkpointed_step_and_they_resume(setup, single, tmp_path, signum):
    """Process 1 gets SIGTERM after step 2 (as a preempted host would), or SIGINT (Ctrl-C, passed on to the service
    as SIGTERM): JAX's preemption service picks one later step for both (``reached_preemption_sync_point``), both
    write their shards of its checkpoint and exit with status 143; the same commands resume there and end with the
    single-process parameters."""
    root, model, _, _ = setup
    deadline = time.time() + DEADLINE_S
    job = Job(tmp_path)
    records, out = tmp_path / "records", tmp_path / "run"
    try:
        _two_processes(job, "first", _argv(root, model, out), records, env1={f"TRAIN_WORKER_{signum.name}_AT": "2"})
        job.finish(deadline, status=EXIT_STOPPED)
        (stop,) = [r for r in read_jsonl(out / "log.jsonl") if r["kind"] == "stop"]
        assert 2 < stop["step"] < STEPS and stop["checkpoint"] == stop["step"], stop
        for name in ("first0", "first1"):
            assert f"stopped on SIGTERM after step {stop['step']}" in job.output(name)
        saved = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
        assert saved == sorted({stop["step"], *([STALL] if stop["step"] >= STALL else [])})
        shards = sorted(p.name for p in (out / "checkpoints" / str(stop["step"]) / "state").glob("ocdbt.process_*"))
        assert shards == ["ocdbt.process_0", "ocdbt.process_1"]
        assert not (out / "results.json").exists()
        _two_processes(job, "resumed", _argv(root, model, out), records)
        job.finish(deadline)
    finally:
        job.kill()
    _assert_single_parameters(records, single)
    written = read_jsonl(out / "log.jsonl")
    assert [r["step"] for r in written if r["kind"] == "resume"] == [stop["step"]]
    assert [r["step"] for r in written if r["kind"] == "train"] == list(range(1, STEPS + 1))
