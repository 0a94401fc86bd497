"""Peak memory of ``isojax analyze`` on 2,000 and on 20,000 texts: the streamed analysis keeps per-layer sums, not
the token states, so the peak should not grow with the corpus.

    python -m experiments.benchmarks.analyze_memory [--model default] [--small 2000] [--large 20000]
                                                    [--data-dir ../shared/data]

The texts are the first sentences of GLUE SST-2's training set (one per line, written to a temporary file). Each
size runs ``isojax analyze --model M --texts FILE --json OUT --quiet`` in its own process under ``/usr/bin/time -v``,
whose "Maximum resident set size" is the peak; prints both, the ratio large / small (goal: <= 1.3) and the seconds.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

from experiments.tooling.report import SHARED_DATA
from isojax.argtypes import int_at_least
from isojax.data.glue import load_glue


def peak_rss_mib(model: str, texts_file: str, out: str) -> tuple[float, float]:
    """(peak RSS MiB, seconds) of one ``isojax analyze`` process on ``texts_file``."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "isojax.cli", "analyze", "--model", model]
    command += ["--texts", texts_file, "--json", out, "--quiet"]
    began = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    if match is None:
        raise SystemExit("/usr/bin/time -v printed no maximum resident set size")
    return int(match.group(1)) / 1024, seconds


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--small", type=int_at_least(2), default=2000)
    ap.add_argument("--large", type=int_at_least(2), default=20000)
    ap.add_argument("--data-dir", default=SHARED_DATA)
    args = ap.parse_args(argv)
    if not os.path.exists("/usr/bin/time"):
        raise SystemExit("needs GNU time: apt-get install -y time")
    sentences = [s.strip() for s in load_glue("sst2", "train", data_dir=args.data_dir).texts_a if s.strip()]
    if len(sentences) < args.large:
        raise SystemExit(f"SST-2 train has {len(sentences)} sentences, fewer than --large {args.large}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (args.small, args.large):
            path = os.path.join(tmp, f"texts_{n}.txt")
            with open(path, "w") as f:
                f.write("\n".join(sentences[:n]) + "\n")
            rows.append((n, *peak_rss_mib(args.model, path, os.path.join(tmp, f"analysis_{n}.json"))))
    for n, mib, seconds in rows:
        print(f"{n:>6} texts: peak RSS {mib:,.0f} MiB, {seconds:.0f} s")
    print(f"ratio {args.large} / {args.small} texts: {rows[1][1] / rows[0][1]:.3f} (goal <= 1.3)")


if __name__ == "__main__":
    main()
