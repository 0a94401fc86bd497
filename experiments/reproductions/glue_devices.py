"""The same GLUE run on two devices: each run that both record directories hold, its dev metrics side by side.

    python -m experiments.reproductions.glue_devices --a experiments/results/glue_methods_runs
        --b experiments/results/glue_methods_h200_runs [--name glue_methods_h200_check] [--out experiments/results]

A run is ``<protocol>/<task>/<method>/seed<seed>`` under each directory (the campaign's run records:
:mod:`experiments.campaign`); one that both hold had the same configuration, data order and
dropout keys, so its metrics differ only by the devices' arithmetic, and by the masks where the two records' pair
keys differ (:func:`experiments.reproductions.glue_pairing.pair_key`; a record without a mask fingerprint is keyed
by its commit, so such keys that differ do not prove other masks). For each
run the table gives the task's metrics (:func:`isojax.data.glue.glue_task`'s ``metrics``) and the dev IsoScore on
both devices with their difference, the steps, the seconds per epoch and their ratio, and the pair keys; per task
and method, the largest ``|b − a|`` of the first metric beside the sample standard deviation (n − 1) of ``a``'s
seeds of that method (all of ``a``'s records of it), the scale of what the campaign compares.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from experiments.reproductions.glue_pairing import pair_key
from experiments.tooling.report import RESULTS, markdown_table, provenance, write_result


def records(root: str) -> dict[str, dict]:
    """``{"<protocol>/<task>/<method>/seed<s>": {"results", "campaign"}}`` of the finished runs under ``root``."""
    out = {}
    for path in sorted(Path(root).glob("*/*/*/seed*/results.json")):
        run = path.parent
        out[str(run.relative_to(root))] = {
            "results": json.loads(path.read_text()),
            "campaign": json.loads((run / "campaign.json").read_text()),
        }
    return out


def _dev(record: dict) -> dict:
    """The evaluated stage's dev figures (the last stage: the Isotropy Layer's second)."""
    return list(record["results"]["stages"].values())[-1]


def compare(a: dict[str, dict], b: dict[str, dict]) -> dict:
    """Rows for the runs in both ``a`` and ``b`` (:func:`records`), and per (task, method) the largest difference
    of the task's first metric beside the std of ``a``'s seeds."""
    from isojax.data.glue import glue_task

    rows: list[dict] = []
    spread: dict[str, dict] = {}
    for run in sorted(a.keys() & b.keys()):
        protocol, task, method, seed = run.split("/")
        metrics = [*glue_task(task).metrics, "isoscore"]
        ra, rb = a[run], b[run]
        da, db = _dev(ra), _dev(rb)
        sa = ra["results"]["timing"]["finetune"]["seconds_per_epoch"]
        sb = rb["results"]["timing"]["finetune"]["seconds_per_epoch"]
        rows.append(
            {
                "run": run,
                "metrics": {m: {"a": da[m], "b": db[m], "diff": db[m] - da[m]} for m in metrics},
                "steps": [ra["results"]["step"], rb["results"]["step"]],
                "seconds_per_epoch": [sa, sb],
                "speedup": sa / sb,
                "pair_keys": [pair_key(ra["campaign"]), pair_key(rb["campaign"])],
                "machines": [ra["campaign"]["machine"], rb["campaign"]["machine"]],
            }
        )
        key = f"{protocol}/{task}/{method}"
        first = glue_task(task).metrics[0]
        seeds = [_dev(r)[first] for k, r in a.items() if k.rsplit("/", 1)[0] == key]
        entry = spread.setdefault(
            key,
            {
                "metric": first,
                "largest_diff": 0.0,
                "runs": 0,
                "std_a": statistics.stdev(seeds) if len(seeds) > 1 else None,
                "seeds_a": len(seeds),
            },
        )
        entry["largest_diff"] = max(entry["largest_diff"], abs(db[first] - da[first]))
        entry["runs"] += 1
    return {"rows": rows, "spread": spread}


def sections(result: dict, a: str, b: str) -> list[str]:
    """The per-run table and the per-method spread, as Markdown."""
    rows = [
        [
            r["run"],
            "; ".join(
                f"{m} {v['a']:.2f} / {v['b']:.2f} ({v['diff']:+.2f})"
                for m, v in r["metrics"].items()
                if m != "isoscore"
            ),
            f"{r['metrics']['isoscore']['a']:.4f} / {r['metrics']['isoscore']['b']:.4f}",
            " / ".join(map(str, r["steps"])),
            f"{r['seconds_per_epoch'][0]:.1f} / {r['seconds_per_epoch'][1]:.1f} ({r['speedup']:.0f}×)",
            " / ".join(r["pair_keys"]),
        ]
        for r in result["rows"]
    ]
    machines = sorted({m for r in result["rows"] for m in r["machines"]})
    spread = [
        [
            key,
            s["metric"],
            f"{s['largest_diff']:.2f} over {s['runs']} run(s)",
            "–" if s["std_a"] is None else f"{s['std_a']:.2f} over {s['seeds_a']} seeds",
        ]
        for key, s in result["spread"].items()
    ]
    return [
        f"Runs recorded in both `{a}` (a) and `{b}` (b): same configuration, data order and dropout keys "
        "(the masks are the same where the pair keys agree; a key that is a commit, not a mask fingerprint, says "
        "nothing of the masks). "
        f"Machines: {'; '.join(f'`{m}`' for m in machines)}.",
        "## Per run\n\n"
        + markdown_table(
            ["run", "dev metrics, a / b (b − a)", "IsoScore a / b", "steps", "s / epoch a / b", "pair key a / b"],
            rows,
        ),
        "## Against the seed-to-seed spread\n\n"
        + markdown_table(
            ["protocol / task / method", "metric", "largest abs(b − a)", "std of a's seeds (n − 1)"], spread
        ),
    ]


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="one device's run records")
    ap.add_argument("--b", required=True, help="the other device's run records")
    ap.add_argument("--name", default="glue_methods_devices", help="report name (default glue_methods_devices)")
    ap.add_argument("--out", default=RESULTS, help="where the report goes (default experiments/results)")
    args = ap.parse_args(argv)
    for root in (args.a, args.b):
        if not os.path.isdir(root):
            raise SystemExit(f"{root}: no such directory of run records")
    result = compare(records(args.a), records(args.b))
    if not result["rows"]:
        raise SystemExit(f"no run is recorded in both {args.a} and {args.b}")
    title = "The same GLUE runs on two devices"
    path = write_result(
        args.name, title, sections(result, args.a, args.b), result, provenance("glue_devices"), directory=args.out
    )
    print(path)
    return path


if __name__ == "__main__":
    main()
