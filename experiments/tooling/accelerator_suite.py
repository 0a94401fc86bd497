"""The test suite on one JAX backend, as ``python -m experiments.accelerator`` runs it: summary, failures, skips.

``pytest`` runs in a subprocess from the repository root with ``JAX_PLATFORMS`` set to the backend (``cpu``:
``tests/conftest.py`` then gives 8 virtual CPU devices; ``cuda``, ``rocm``, ``tpu``: the real devices) and
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (the tests' own subprocesses share the card) and
``PYTHONUNBUFFERED=1`` (a run killed while it hangs keeps all it printed). The results are read from
its JUnit XML: every failed or erroring test with the first line of its message, and the skips grouped by reason.
A run stopped at its time limit is interrupted as Ctrl-C would (SIGINT to pytest and its workers), so the tests that
ran before the limit are still counted (``timed_out`` marks it); only if pytest has not ended ``INTERRUPT_GRACE_S``
seconds later is it killed (``stopped_by`` says which signal ended it, and a killed run keeps its output's tail).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter

from experiments.tooling.report import ROOT

INTERRUPT_GRACE_S = 120  # pytest's summary and JUnit XML after SIGINT take about a second; a loaded host, far more

# pytest, with SIGINT unblocked and raising KeyboardInterrupt whatever the caller left: a process started in the
# background by a non-interactive shell inherits SIGINT ignored, a thread may have it blocked, and either would make
# the stop at the time limit wait for the tests to end (seen in CI: the sleeping test "passed" after the SIGINT)
_PYTEST_WITH_SIGINT = (
    "import signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "signal.signal(signal.SIGINT, signal.default_int_handler); import pytest; sys.exit(pytest.main(sys.argv[1:]))"
)

_SUMMARY = re.compile(r"\b\d+ (passed|failed|skipped|errors?|deselected|xfailed|xpassed)\b")


def _test_id(case: ET.Element) -> str:
    """``tests/test_x.py::test_name[param]`` (``tests/test_x.py`` for a module that failed or skipped at import)."""
    classname, name = case.get("classname", ""), case.get("name", "")
    if not classname:  # collection: name is the dotted module
        return name.replace(".", "/") + ".py"
    parts = classname.split(".")
    module = "/".join(p for p in parts if not p[:1].isupper())
    return f"{module}.py::" + "::".join([*(p for p in parts if p[:1].isupper()), name])


def _message(outcome: ET.Element) -> str:
    """One line: the outcome's message, or for a module that failed or skipped at import (pytest's message is
    then "collection failure" / "collection skipped"), the error's last ``E`` line / the skip reason."""
    message, text = outcome.get("message") or "", outcome.text or ""
    if message == "collection skipped":
        found = re.search(r"Skipped: (.*)['\"]\)\s*$", text)
        return found.group(1) if found else text.strip()
    if message == "collection failure":
        errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
        return errors[-1] if errors else message
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):  # "AssertionError:" and numpy's message on the next line
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


def parse_junit(path: str) -> dict:
    """Counts (``interrupted``: tests cut short by a stop at the time limit, which pytest writes without a name),
    failures (``[{"test", "kind", "message"}]``) and skips (``[{"reason", "count", "tests"}]``, most
    frequent first, up to 3 test ids each) of a pytest JUnit XML file."""
    root = ET.parse(path).getroot()
    counts: Counter[str] = Counter()
    failures: list[dict] = []
    skipped: dict[str, list[str]] = {}
    for case in root.iter("testcase"):
        if not case.get("name"):  # a test that a stop at the time limit interrupted: no outcome
            counts["interrupted"] += 1
            continue
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            counts["passed"] += 1
            continue
        kind = {"failure": "failed", "error": "errors"}.get(outcome.tag, "skipped")
        counts[kind] += 1
        if kind in ("failed", "errors"):
            failures.append({"test": _test_id(case), "kind": kind, "message": _message(outcome)})
        else:
            skipped.setdefault(_message(outcome), []).append(_test_id(case))
    skips = [
        {"reason": reason, "count": len(tests), "tests": tests[:3]}
        for reason, tests in sorted(skipped.items(), key=lambda kv: -len(kv[1]))
    ]
    return {"counts": dict(counts), "failures": failures, "skips": skips}


def summary_line(output: str) -> str:
    """pytest's last line of counts (``12 passed, 3 skipped in 40.1s``), without the ``=`` padding."""
    lines = [line.strip(" =") for line in output.splitlines() if _SUMMARY.search(line)]
    return lines[-1] if lines else ""


def run_suite(
    platform: str, args: str = "tests", *, env: dict | None = None, timeout: float | None = None, log=print
) -> dict:
    """Run ``pytest <args>`` (a shell-quoted string) on ``platform`` (``cpu``, ``cuda``, ``rocm``, ``tpu``) with
    the extra environment ``env``; return the command, summary line, counts, failures, skips, return code and
    seconds (``timed_out`` when it ran past ``timeout`` seconds: then the tests that ran by then, and ``stopped_by``,
    ``SIGINT`` or, if that did not end it within ``grace_s`` = ``INTERRUPT_GRACE_S`` seconds, ``SIGKILL``)."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "junit.xml")
        command = [
            sys.executable,
            "-c",
            _PYTEST_WITH_SIGINT,
            "-q",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            f"--junitxml={junit}",
            *shlex.split(args),
        ]
        full_env = {
            **os.environ,
            **(env or {}),
            "JAX_PLATFORMS": platform,
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            "PYTHONUNBUFFERED": "1",
        }
        log(f"tests: JAX_PLATFORMS={platform} pytest {args}")
        start = time.perf_counter()
        # A new session, so that at the limit SIGINT reaches pytest and its xdist workers at once, as Ctrl-C would:
        # pytest then stops, prints its summary and writes the JUnit XML of the tests that ran.
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        stopped_by = None
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stopped_by = "SIGINT"
            os.killpg(proc.pid, signal.SIGINT)
            try:
                stdout, stderr = proc.communicate(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                stopped_by = "SIGKILL"
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
        result = {
            "command": f"JAX_PLATFORMS={platform} pytest {args}",
            "returncode": proc.returncode,
            "seconds": time.perf_counter() - start,
            "summary": summary_line(stdout),
            "extra_env": dict(env or {}),
        }
        if stopped_by:
            result.update(timed_out=True, timeout_s=timeout, stopped_by=stopped_by, grace_s=INTERRUPT_GRACE_S)
        if os.path.exists(junit):
            result.update(parse_junit(junit))
        if not os.path.exists(junit) or stopped_by == "SIGKILL":
            # pytest stopped before it ran anything (a usage error, say) or before it could write the XML, or hung
            result["output_tail"] = (stdout + stderr)[-4000:]
        log(f"tests: {result['summary'] or 'no summary'} (exit {proc.returncode})")
        return result
