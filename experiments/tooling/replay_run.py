"""Replay the start of a recorded fine-tuning run and compare its train records with the recorded ones.

    python -m experiments.tooling.replay_run experiments/results/glue_methods_runs/appB/cola/baseline/seed0 \
        --records 20 [--devices 1] [--parallel mesh|pmap] [--fsdp] [--data-dir DIR]

Runs ``isojax finetune --config`` on the record's ``results.json`` configuration (output to a temporary directory;
``--devices``, ``--parallel``, ``--fsdp`` change only the placement, which a run may change on resume), stops it with
``SIGTERM`` (the command's own stop: it checkpoints and exits) once ``--records`` train records are logged, and
compares each record's ``loss`` and ``grad_norm`` with the recording: exactly, or within ``--atol`` for another
placement. Prints one line per record and exits 1 when a record differs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

KEYS = ("loss", "grad_norm")


def train_records(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in map(json.loads, filter(str.strip, f)) if r.get("kind") == "train"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a recorded run's directory (results.json and log.jsonl)")
    ap.add_argument("--records", type=int, default=20, help="train records to compare (default 20)")
    ap.add_argument("--devices", type=int, default=None, help="placement.devices of the replay")
    ap.add_argument("--parallel", choices=("mesh", "pmap"), default=None, help="placement.parallel of the replay")
    ap.add_argument("--fsdp", action="store_true", help="placement.fsdp of the replay")
    ap.add_argument("--data-dir", default=None, help="task.data_dir of the replay (default: the record's)")
    ap.add_argument("--atol", type=float, default=0.0, help="tolerance (default 0: equal to the bit)")
    args = ap.parse_args(argv)

    with open(os.path.join(args.run, "results.json")) as f:
        config = json.load(f)["config"]
    recorded = train_records(os.path.join(args.run, "log.jsonl"))[: args.records]
    if len(recorded) < args.records:
        raise SystemExit(f"{args.run}: the record has {len(recorded)} train records, fewer than --records")
    placement = {"devices": args.devices, "parallel": args.parallel, "fsdp": args.fsdp}
    config["placement"] = {**config["placement"], **{k: v for k, v in placement.items() if v}}
    if args.data_dir:
        config["task"]["data_dir"] = args.data_dir
    with tempfile.TemporaryDirectory() as tmp:
        config["logging"] = {**config["logging"], "output_dir": os.path.join(tmp, "run"), "progress": False}
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        log = os.path.join(tmp, "run", "log.jsonl")
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "isojax.cli", "finetune", "--config", path])
        while proc.poll() is None and len(train_records(log)) < args.records:
            time.sleep(1)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait()
        replayed = train_records(log)[: args.records]
    print(f"replayed {len(replayed)} train records in {time.perf_counter() - started:.0f} s")
    differ = 0
    for want, got in zip(recorded, replayed):
        diffs = {k: abs(got[k] - want[k]) for k in KEYS}
        same = got["step"] == want["step"] and all(d <= args.atol for d in diffs.values())
        differ += not same
        shown = "  ".join(f"{k} {want[k]!r} -> {got[k]!r}" for k in KEYS)
        print(f"step {want['step']:>5}  {'equal' if same else 'DIFFERS'}  {shown}")
    if len(replayed) < len(recorded):
        print(f"the replay stopped after {len(replayed)} records")
        return 1
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
