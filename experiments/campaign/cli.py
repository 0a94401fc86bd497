"""The campaign's command line, ``python -m experiments.campaign`` (options: :mod:`experiments.campaign`)."""

from __future__ import annotations

import argparse
import json
import os

import experiments.campaign
from experiments.campaign.report import header, report
from experiments.campaign.runner import pending, run_sitting
from experiments.campaign.schedule import STOP_MIN_MINUTES, campaign_selection, read_cost, too_long
from experiments.campaign.spec import DEFAULT_CONFIG, DEFAULT_DATA, Run, check_only, expand, parse_only, select
from experiments.tooling.report import RESULTS, provenance

SWEEP_NAME = "glue_methods_sweep"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.campaign",
        description=experiments.campaign.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--data-dir", default=DEFAULT_DATA, help="the offline data (default ../shared/data)")
    ap.add_argument("--only", nargs="*", default=[], metavar="KEY=V1,V2", help="protocol, method, task or seed")
    ap.add_argument(
        "--cpu-campaign", action="store_true", help="the configuration's cpu_campaign selection (and its sweeps)"
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="the sweeps (regulariser weights, the flow's learning rate) instead of the table runs",
    )
    ap.add_argument("--runs-dir", default=os.path.join("runs", "glue_methods"))
    ap.add_argument("--out", default=RESULTS, help="where the report goes (default experiments/results)")
    ap.add_argument(
        "--cost",
        help="the cost table that orders the runs (python -m experiments.benchmarks.glue_cost; default "
        "experiments/results/glue_cost.json, where there is one)",
    )
    ap.add_argument("--name", default="glue_methods", help="name of the table report (default glue_methods)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--report-only", action="store_true", help="tabulate the finished runs, run nothing")
    mode.add_argument("--dry-run", action="store_true", help="print the runs' commands in the campaign's order")
    ap.add_argument(
        "--time-limit",
        type=float,
        metavar="MINUTES",
        help="start a run only where the cost table's estimate fits in what is left of MINUTES since the campaign "
        "started (with --dry-run: what the estimates of the runs listed before it leave), each estimate scaled by how much "
        "longer than theirs this sitting's runs took; stop when none does",
    )
    ap.add_argument(
        "--stop-at-limit",
        action="store_true",
        help="with --time-limit: run the runs in the campaign's order whatever their estimates, stop the one in "
        "progress at the limit (SIGTERM: it checkpoints its step and exits) and leave it to the next sitting, "
        f"which resumes it; no run starts with less than {STOP_MIN_MINUTES:g} min left",
    )
    args = ap.parse_args(argv)
    if args.time_limit is not None and not args.time_limit > 0:
        ap.error(f"--time-limit must be a positive number of minutes, got {args.time_limit}")
    if args.stop_at_limit and args.time_limit is None:
        ap.error("--stop-at-limit needs --time-limit (the limit to stop a run at)")
    # the runs are processes started in the repository root: the paths they are given must not depend on the cwd
    args.runs_dir = os.path.abspath(args.runs_dir)
    args.data_dir = args.data_dir and os.path.abspath(args.data_dir)
    try:
        with open(args.config) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        ap.error(f"--config {args.config}: {e}")
    only = parse_only(args.only)
    cost_required, args.cost = args.cost is not None, args.cost or os.path.join(RESULTS, "glue_cost.json")
    cost = read_cost(args.cost, required=cost_required)
    table_runs, sweep_runs = expand(config), expand(config, sweep=True)
    campaign: dict[str, list[Run]] = {}  # the CPU campaign's table runs and sweep runs
    sweep_name = SWEEP_NAME
    if "cpu_campaign" in config:
        campaign = {
            args.name: campaign_selection(table_runs, config, cost),
            sweep_name: [r for r in sweep_runs if too_long(r, config, cost) is None]
            if config["cpu_campaign"].get("sweep")
            else [],
        }
    selected = {r.key for part in campaign.values() for r in part}
    if args.sweep:
        parts = {sweep_name: sweep_runs}
    elif args.cpu_campaign:
        parts = campaign
    else:
        parts = {args.name: table_runs}
    check_only([r for part in parts.values() for r in part], only)
    parts = {name: select(runs, only) for name, runs in parts.items()}
    records_dirs = tuple(os.path.join(args.out, f"{name}_runs") for name in (args.name, sweep_name))
    prov = provenance("campaign")  # of the code that runs, taken before it runs
    runs = list({r.key: r for part in parts.values() for r in part}.values())  # a sweep's table value: one run
    todo = [r for r in runs if pending(r, args.runs_dir, *records_dirs)]
    print(f"{len(runs)} runs selected, {len(runs) - len(todo)} done, {len(todo)} to run", flush=True)
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.abspath(os.path.join(args.runs_dir, "jax_cache")))
    if not args.report_only and todo:
        run_sitting(
            todo,
            parts,
            config,
            cost_path=args.cost,
            runs_dir=args.runs_dir,
            data_dir=args.data_dir,
            out=args.out,
            prov=prov,
            env=env,
            time_limit=args.time_limit,
            stop_at_limit=args.stop_at_limit,
            dry_run=args.dry_run,
        )
    if args.dry_run:
        return 0
    reports = {sweep_name: select(sweep_runs, only)} if args.sweep else {args.name: select(table_runs, only)}
    if args.cpu_campaign and config["cpu_campaign"].get("sweep"):
        reports[sweep_name] = select(sweep_runs, only)
    for name, runs in reports.items():
        text = header(config, runs, selected, cost, args.runs_dir, *records_dirs)
        path = report(
            config,
            runs,
            args.runs_dir,
            args.out,
            name,
            prov,
            text,
            selected=selected,
            cost=cost,
            records_dirs=records_dirs,
            summarise=name != sweep_name,
        )
        with open(path) as f:
            print(f.read())
    return 0
