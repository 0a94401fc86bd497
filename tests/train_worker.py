"""A fine-tuning process for the tests that kill and resume runs (test_train_loop, test_train_multihost):
``isojax.cli`` with probes, started by :func:`launch`.

    python tests/train_worker.py STALL RECORDS finetune ...

* ``STALL > 0``: once the checkpoint of step STALL is written, print ``STALLED`` and wait to be killed, or with
  ``TRAIN_WORKER_CONTINUE_ON=PATH`` in the environment until the file PATH exists, then go on.
* ``TRAIN_WORKER_SIGTERM_AT=N`` in the environment: right after its step N the process sends itself SIGTERM (as a
  scheduler would), before the loop asks whether to stop (:mod:`isojax.train.preemption`).
* ``TRAIN_WORKER_SIGINT_AT=N``: the same with SIGINT (Ctrl-C); with ``TRAIN_WORKER_SIGINT_SAVING=K`` also K more SIGINTs
  once the checkpoint of step N has started to be written.
* ``TRAIN_WORKER_SIGTERM_LOADING=1``: the process sends itself SIGTERM once the model and data are loaded, before
  the checkpoint to resume from is looked for.
* ``RECORDS``: a directory where the process appends, for every tokenizer call of :mod:`isojax.train.feed`, one
  JSON line with the first texts of the rows it tokenised (``tokenised_<process>.jsonl``), and writes the final
  parameters of the run (``final_<process>.npz``, leaves in tree order).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def launch(stall: int, records, argv, *, stdout, **env) -> subprocess.Popen:
    """Start a worker in its own process group, importing this checkout's isojax, with the extra environment
    variables ``env``. It reads and writes the run's persistent compilation cache (tests/conftest.py names it in
    ``JAX_COMPILATION_CACHE_DIR``), every program it compiles included: a resumed worker reads back what the killed
    one compiled, and a worker what the in-process reference run of its test compiled."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        **env,
    )
    Path(records).mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, __file__, str(stall), str(records), *argv],
        stdout=stdout,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


def kill_when_stalled(child: subprocess.Popen, timeout: float = 300) -> None:
    """Read a worker's output until it prints ``STALLED`` (AssertionError with its output if it does not within
    ``timeout`` seconds), then SIGKILL it, wait for it and close its output pipe."""
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = child.stdout.readline()
        lines.append(line)
        if "STALLED" in line or not line:
            break
    assert "STALLED" in lines[-1], "".join(lines)[-3000:]
    os.kill(child.pid, signal.SIGKILL)
    child.communicate()


def _main(stall: int, records: str, argv: list[str]) -> int:
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    import numpy as np

    from isojax.cli import main
    from isojax.train import checkpoint, feed, loop, preemption

    tokenize = feed.tokenize

    def recording_tokenize(tokenizer, texts_a, texts_b=None, **kwargs):
        with open(os.path.join(records, f"tokenised_{jax.process_index()}.jsonl"), "a") as f:
            f.write(json.dumps(texts_a) + "\n")
        return tokenize(tokenizer, texts_a, texts_b, **kwargs)

    feed.tokenize = recording_tokenize
    if stall:
        save = checkpoint.Checkpoints.save

        def stalling_save(self, step, *args, **kwargs):
            started = save(self, step, *args, **kwargs)
            if step == stall:
                self.wait()
                print("STALLED", flush=True)
                go_on = os.environ.get("TRAIN_WORKER_CONTINUE_ON")
                deadline = time.time() + 600
                while time.time() < deadline and not (go_on and os.path.exists(go_on)):
                    time.sleep(0.1)
            return started

        checkpoint.Checkpoints.save = stalling_save
    for signum in (signal.SIGTERM, signal.SIGINT):
        if at := int(os.environ.get(f"TRAIN_WORKER_{signum.name}_AT", "0")):
            reached = preemption.StopRequest.reached

            def signalled_reached(self, step, at=at, signum=signum, reached=reached):
                if step == at:
                    os.kill(os.getpid(), signum)
                return reached(self, step)

            preemption.StopRequest.reached = signalled_reached
    if more := int(os.environ.get("TRAIN_WORKER_SIGINT_SAVING", "0")):
        save, at = checkpoint.Checkpoints.save, int(os.environ["TRAIN_WORKER_SIGINT_AT"])

        def interrupted_save(self, step, *args, **kwargs):
            started = save(self, step, *args, **kwargs)
            for _ in range(more if step == at else 0):
                os.kill(os.getpid(), signal.SIGINT)
            return started

        checkpoint.Checkpoints.save = interrupted_save
    if os.environ.get("TRAIN_WORKER_SIGTERM_LOADING"):
        prepare = loop.prepare

        def terminated_prepare(config):
            prepared = prepare(config)
            os.kill(os.getpid(), signal.SIGTERM)
            return prepared

        loop.prepare = terminated_prepare
    fit = loop.fit

    def fit_and_save(config):
        result = fit(config)
        np.savez(os.path.join(records, f"final_{jax.process_index()}.npz"), *jax.tree.leaves(result.params))
        return result

    loop.fit = fit_and_save
    return main(argv)


if __name__ == "__main__":
    sys.exit(_main(int(sys.argv[1]), sys.argv[2], sys.argv[3:]))
