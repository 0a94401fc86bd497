"""Git tags for the committed results: ``results/<name>`` marks the last commit that reproduces each result in
``experiments/results/`` (the commit whose code made its numbers, with its data), so a page need not explain how
the code differed when it was made: ``git checkout results/<name>`` and run the command the page gives.

Tags may not travel with a copy of the repository; :data:`TAGS` is the record. Run from the repository root::

    python -m experiments.tooling.tag_results          # create the missing tags
    python -m experiments.tooling.tag_results --check  # only say which are missing or point elsewhere

A tag that exists and points at its commit is left alone; one that points elsewhere is refused (exit status 1),
never moved: delete it by hand (``git tag -d results/<name>``) if the table is right.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import NamedTuple

from experiments.tooling.report import ROOT


class Tag(NamedTuple):
    """One result's tag: the commit and why it is that one."""

    commit: str
    why: str


TAGS: dict[str, Tag] = {
    "anisotropy_profiles": Tag(
        "ac7724eb9edd57de9f34776489259e52b878ae65",
        "table and JSON written (run at 251d093; the commits between add benchmark files it does not import)",
    ),
    "compile_time": Tag(
        "39247cff74c37de1c3bd0c8b451af04a55e6425e", "table and JSON written, code as at the run (5241213)"
    ),
    "decompositions": Tag(
        "d7953130e11ce528cc4e2e4fa3487bac5a2dbccd",
        "table and JSON written (run at 1a34c6e; this commit also makes the operator's jvp/vjp broadcast their "
        "input, which the forward decompositions timed here do not use)",
    ),
    "finetune_methods": Tag(
        "942a7ed48611331f1cc2d3ca22fe93482896cb80",
        "table, JSON and curves last written from the runs of 4f4208a; code as at the run (3e9d3e8)",
    ),
    "glue_cost": Tag(
        "dfc71a2972cc29768a492853e8e3ef4fd6609ebf",
        "cost table remeasured with the campaign stopped (timing runs at 1eedca1, table at 405e9ce; the commits "
        "between touch only the GLUE campaign's configuration)",
    ),
    "glue_cost_sst2_buckets": Tag(
        "e819ddfdd6e50740eca423d344e90080096a3c98", "the SST-2 bucket timings committed with the buckets they chose"
    ),
    "glue_cost_retime": Tag(
        "ca5c957dabd0f94a3988b561884a1fa79b4509bb",
        "the CoLA cost run's records and table (timed at 7bd1526, table at 345f1f4; glue_cost.py since only "
        "fixed the crash after the run)",
    ),
    "glue_flow_diagnostic": Tag(
        "398eb40798f06b4446813b36333811e882839c27",
        "the diagnostic run's records in their last shape (config.json beside run.json; run at 54595e2, no "
        "isojax change since)",
    ),
    "glue_methods": Tag(
        "8e9c113bda864b4bd0b6580405ad337862bd1367",
        "a campaign: runs committed over many commits (glue_methods_runs/), the last (SST-2 App. B Isotropy "
        "Layer seed 2) at 3b3ea0a; this commit writes the report from all 191 CPU runs",
    ),
    "glue_methods_sweep": Tag(
        "8e9c113bda864b4bd0b6580405ad337862bd1367",
        "a campaign: the sweeps' runs (glue_methods_sweep_runs/) committed over many commits; the report written "
        "with glue_methods' from the last run (3b3ea0a)",
    ),
    "glue_methods_h200_check": Tag(
        "29454cf43dfe44657aa04c601a8a4f052f24da89",
        "device check regenerated after the MRPC baseline run on the current dropout masks (H200 runs: 074f948)",
    ),
    "llm_memory": Tag(
        "0a70f297a1711435f90986d0faa32c6ed448a3f3",
        "table and JSON written (run at a4b6d2e; the causal LM's optional last-layer transform added between is "
        "off in this benchmark)",
    ),
    "load_memory": Tag(
        "41355e0788961140dd8e6f3e99fc14b9a5a77dbc", "table written (run at 360fea9; only a guide changed between)"
    ),
    "lowering": Tag(
        "0b99866c511ec825b054e9294789d8f92e82c1a4",
        "matrix re-run with the FSDP train-step rows, code as at the run (5e4c3c5)",
    ),
    "scale": Tag(
        "bdc8c963f1ed99a05461b790e5865c1f0f16e4d9",
        "a campaign: cells compiled at 9271866 and 5e4c3c5 are kept (--keep); this commit recompiles the "
        "BART-large and mBART-large cells (run at 3b25803; the head einsum shared between is the same einsum)",
    ),
    "softdecay_sts": Tag(
        "59a4842e50df0c55973246d2854f2cb5181dd780",
        "the code the table was regenerated with; the table was committed later, at 5878d1b, after 28 commits "
        "that changed isojax",
    ),
    "too_much_in_common": Tag(
        "4cf8b18673dcac59f213bb740ea7046ae072a339",
        "the code the tables were made with (from a clean worktree; its 'uncommitted changes' are the "
        "softdecay_sts result files); committed later, at ee88885, after merges that changed isojax",
    ),
    "accelerator/cpu": Tag(
        "82e9cf11593f230cc434d3e3901b5555f68b9d04", "the CPU record written, code as at the run (ea880fa)"
    ),
    "accelerator/nvidia-h200": Tag(
        "ab5c0c22c0af8c133258c2a39d661300e8d24df4",
        "the H200 record committed with the accelerator command it ran (the run's 'uncommitted changes' on 53fe880)",
    ),
}
"""Result name (its page ``experiments/results/<name>.md`` or folder ``experiments/results/<name>/``) -> the
last commit that reproduces it."""


def git(*args: str) -> subprocess.CompletedProcess[str]:
    """``git`` in the repository root, output captured."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def tagged_commit(tag: str) -> str | None:
    """The commit ``tag`` points at, or None if there is no such tag."""
    out = git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}")
    return out.stdout.strip() if out.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    """Create the missing ``results/<name>`` tags (annotated, message = the why); exit status 1 if a tag points
    elsewhere or a commit is absent from this clone."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="create nothing; report missing or moved tags")
    args = parser.parse_args(argv)
    failed = False
    for name, (commit, why) in TAGS.items():
        tag = f"results/{name}"
        if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            print(f"{tag}: commit {commit[:12]} is not in this clone (a shallow copy?)", file=sys.stderr)
            failed = True
            continue
        current = tagged_commit(tag)
        if current == commit:
            print(f"{tag}: {commit[:7]} (already)")
        elif current is not None:
            print(
                f"{tag}: points at {current[:12]}, the table says {commit[:12]}; not moved "
                f"(git tag -d {tag} first if the table is right)",
                file=sys.stderr,
            )
            failed = True
        elif args.check:
            print(f"{tag}: missing ({commit[:7]})", file=sys.stderr)
            failed = True
        else:
            made = git("tag", "-a", tag, commit, "-m", f"{tag}: {why}")
            if made.returncode != 0:
                print(f"{tag}: git tag failed: {made.stderr.strip()}", file=sys.stderr)
                failed = True
            else:
                print(f"{tag}: {commit[:7]} (created)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
