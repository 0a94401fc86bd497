"""The campaign's report: per task and protocol one Markdown table line per method (mean ± std over seeds, the
t-tests against the protocol's baseline, the isotropy of the evaluated representation, the regulariser terms, the
seconds per epoch), "not run" and why for a method without a finished run, what is left to run, and the summary
paper by paper with its p-values corrected for their number.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Collection

import numpy as np

from experiments.campaign.curves import curves
from experiments.campaign.runner import campaign_record, copy_records, diverged_record, finished_record, pending
from experiments.campaign.schedule import run_minutes, too_long
from experiments.campaign.spec import Run, base_method
from experiments.campaign.statistics import effect, q_values, ttest
from experiments.reproductions.glue_pairing import MODEL_CHANGES, pair_key, paired_ttest, without_spread
from experiments.reproductions.glue_power import detectable
from experiments.tooling.report import ISOTROPY_COLUMNS, markdown_table, mean_std, write_result

TIME_COLUMN = ("seconds_per_epoch", "s / epoch", 0)
TERMS_COLUMN = "added loss term (unweighted), first → last logged step"


def _stage_rows(method: str, results: dict) -> dict[str, tuple[str, dict, dict]]:
    """Table line(s) of one run: ``{line label: (stage, evaluation, timing)}`` (two lines for a two-stage run)."""
    stages = results["stages"]
    timing = results.get("timing", {})
    if len(stages) == 1:
        ((stage, evaluation),) = stages.items()
        return {method: (stage, evaluation, timing.get(stage, {}))}
    return {f"{method}: {stage}": (stage, evaluation, timing.get(stage, {})) for stage, evaluation in stages.items()}


def term_trace(log_path: str) -> dict[str, dict[str, tuple[float, float]]]:
    """``{stage: {term: (first, last)}}`` from a run's ``log.jsonl``: each regulariser term (a ``name@representation``
    key of the training rows, logged unweighted; scheduled values ``label/...`` left out) and the flow's ``flow``
    term at the first and the last logged training step of each stage. Empty where there is no log."""
    if not os.path.exists(log_path):
        return {}
    trace: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    with open(log_path) as f:
        for row in map(json.loads, f):
            if row.get("kind") != "train":
                continue
            terms = trace[row["stage"]]
            for key, value in row.items():
                if (key == "flow" or "@" in key) and "/" not in key:
                    terms[key] = (terms.get(key, (value, value))[0], value)
    return dict(trace)


def collect(runs: list[Run], runs_dir: str, *records_dirs: str) -> dict:
    """``{(task, protocol): {line: [per-seed record]}}`` of the finished runs; a record is the evaluation plus
    ``seconds_per_epoch``, ``seed``, ``pair`` (the run's dropout stream, :func:`pair_key`) and ``terms`` (the
    stage's regulariser terms at its first and last logged step, :func:`term_trace`)."""
    table: defaultdict[tuple, defaultdict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        directory = finished_record(run, runs_dir, *records_dirs)
        if directory is None:
            continue
        with open(os.path.join(directory, "results.json")) as f:
            results = json.load(f)
        campaign = os.path.join(directory, "campaign.json")
        pair = None
        if os.path.exists(campaign):
            with open(campaign) as f:
                pair = pair_key(json.load(f))
        trace = term_trace(os.path.join(directory, "log.jsonl"))
        for line, (stage, evaluation, timing) in _stage_rows(run.method, results).items():
            table[run.task, run.protocol][line].append(
                {
                    **evaluation,
                    "seconds_per_epoch": timing.get("seconds_per_epoch"),
                    "seed": run.seed,
                    "pair": pair,
                    "terms": trace.get(stage, {}),
                }
            )
    return table


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _p_fmt(p: float | None) -> str:
    """A p-value to three decimals, ``"< 0.001"`` below that (never a p of 0.000), ``"–"`` where undefined."""
    return "< 0.001" if p is not None and p < 0.001 else _fmt(p, ".3f")


def _q_fmt(q: float) -> str:
    """A q-value as the report prints it: like a p-value, * where below 0.05."""
    return _p_fmt(float(q)) + ("*" if q < 0.05 else "")


def _p_text(p: float | None, paired: float | None, seeds: list) -> str:
    """`` (p 0.330; paired 0.210, seeds 1,2)``: the unpaired and the paired p-value (``*`` below 0.05)."""

    def fmt(v):
        return _p_fmt(v) + ("*" if v is not None and v < 0.05 else "")

    pairs = f", seeds {','.join(map(str, seeds))}" if seeds else ""
    return f" (p {fmt(p)}; paired {fmt(paired)}{pairs})"


def task_table(
    task: str, lines: dict[str, list[dict]], protocol: dict, not_run: dict[str, str]
) -> tuple[str, list[dict]]:
    """Markdown table (and its JSON rows) of one task and protocol: each finished line with the t-tests against
    the protocol's baseline line, unpaired (:func:`ttest`) and paired over the seeds whose runs share a dropout
    stream (:func:`experiments.reproductions.glue_pairing.paired_ttest`); then a "not run" line, with its reason, for each
    method in ``not_run`` (``{method: why}``). ``†`` marks a method whose model differs from the baseline's."""
    from isojax.data.glue import glue_task

    metrics = glue_task(task).metrics
    baseline = protocol["baseline"]
    base = lines.get(baseline, [])
    headers = [
        "method",
        "seeds",
        *[f"{m} (p; paired p)" for m in metrics],
        *(h for _, h, _ in ISOTROPY_COLUMNS),
        TERMS_COLUMN,
        TIME_COLUMN[1],
    ]
    rows, payload = [], []
    for line, records in lines.items():
        method, _, stage = line.partition(": ")
        changed = (
            protocol["methods"].get(base_method(method), {}).get("method.name") in MODEL_CHANGES and stage != "finetune"
        )  # a two-stage run's first stage is the baseline's model
        cells = [line + (" †" if changed else ""), len(records)]
        entry: dict[str, object] = {"method": line, "seeds": [r["seed"] for r in records], "model_change": changed}
        for metric in metrics:
            values = [r[metric] for r in records]
            p, paired = None, None
            seeds: list[int] = []
            if line != baseline:
                p = ttest(values, [r[metric] for r in base])
                paired, seeds = paired_ttest(
                    {r["seed"]: (r[metric], r["pair"]) for r in records},
                    {r["seed"]: (r[metric], r["pair"]) for r in base},
                )
            cells.append(mean_std(values, 2) + ("" if line == baseline else _p_text(p, paired, seeds)))
            entry[metric] = {
                "values": values,
                "p_vs_baseline": p,
                "paired_p_vs_baseline": paired,
                "paired_seeds": seeds,
            }
        for key, _, digits in ISOTROPY_COLUMNS:
            entry[key] = column = [r.get(key) for r in records]
            cells.append(mean_std(column, digits))
        entry["terms"] = terms = line_terms(records)
        cells.append("; ".join(_terms_text(terms)) or "–")
        entry[TIME_COLUMN[0]] = times = [r.get(TIME_COLUMN[0]) for r in records]
        cells.append(mean_std(times, TIME_COLUMN[2]))
        rows.append(cells)
        payload.append(entry)
    for method, why in not_run.items():
        rows.append([method, 0, f"not run: {why}", *[""] * (len(headers) - 3)])
        payload.append({"method": method, "seeds": [], "not_run": why})
    return markdown_table(headers, rows), payload


def line_terms(records: list[dict]) -> dict[str, dict]:
    """Per regulariser term of a line's seeds (their ``terms``, :func:`term_trace`): its value at the first and the
    last logged training step, per seed and as means over the seeds that logged it."""
    out = {}
    for key in dict.fromkeys(k for r in records for k in r.get("terms", {})):
        first, last = zip(*(r["terms"][key] for r in records if key in r.get("terms", {})))
        out[key] = {
            "first": list(first),
            "last": list(last),
            "first_mean": float(np.mean(first)),
            "last_mean": float(np.mean(last)),
        }
    return out


def _terms_text(terms: dict[str, dict]) -> list[str]:
    """``["istar@cls 0.0977 → 0.00112", ...]``: each term of :func:`line_terms` from its first to its last mean."""
    return [f"{k} {v['first_mean']:.3g} → {v['last_mean']:.3g}" for k, v in terms.items()]


def _isotropy_text(row: dict, base: dict, pairs: list) -> tuple[str, float | None]:
    """``("; IsoScore 0.0399 vs 0.0849 (paired p 0.012), istar@cls 0.0977 → 0.00112 in training", 0.012)``: the
    mean dev IsoScore of a method's line against the baseline's, with the paired t-test over the seeds ``pairs``
    (those of the task metric's paired test, :func:`experiments.reproductions.glue_pairing.paired_ttest`; shown from
    two pairs on, "–" where the differences are all equal), and its regulariser terms' means at the first and the
    last logged step; and that paired p (None where there is none)."""
    text, p = "", None
    if all(v is not None for v in (*row.get("isoscore", [None]), *base.get("isoscore", [None]))):
        text = f"; IsoScore {np.mean(row['isoscore']):.3g} vs {np.mean(base['isoscore']):.3g}"
        if len(pairs) > 1:
            p, _ = paired_ttest(
                *({s: (v, "") for s, v in zip(line["seeds"], line["isoscore"]) if s in pairs} for line in (row, base))
            )
            text += f" (paired p {_p_fmt(p)})"
    terms = _terms_text(row.get("terms", {}))
    return text + (f", {', '.join(terms)} in training" if terms else ""), p


def _on_seeds(base: dict, seeds: list, metric: str) -> dict:
    """The baseline line ``base`` (a table payload entry) restricted to ``seeds``: its ``metric`` values and dev
    IsoScores of those seeds only, so that a method with fewer finished seeds is compared with the same seeds."""
    keep = [base["seeds"].index(s) for s in seeds]
    return {
        **base,
        "seeds": list(seeds),
        metric: {**base[metric], "values": [base[metric]["values"][i] for i in keep]},
        "isoscore": [base["isoscore"][i] for i in keep] if "isoscore" in base else [None],
    }


def summary(config: dict, tables: list[dict]) -> str:
    """Paper by paper (the configuration's ``summaries``): its claim, then what the finished runs show on each
    task (first metric: difference to the protocol's baseline, Cohen's d, unpaired and paired p; the dev IsoScore
    against the baseline's with its paired p and the regulariser terms' first and last logged values), and the tasks
    where the method was not run; then those p-values corrected for their number (:func:`corrected`) and the
    differences the seeds can detect (:func:`experiments.reproductions.glue_power.detectable`)."""
    from isojax.data.glue import glue_task

    by_cell = {(t["task"], t["protocol"]): {r["method"]: r for r in t["rows"]} for t in tables}
    out, tests = ["## Summary by paper", ""], {}
    for paper in config["summaries"]:
        out.append(f"**{paper['paper']}**. Claim: {paper['claim']}")
        protocol = config["protocols"][paper["protocol"]]
        for method in paper["methods"]:
            shown, missing = [], []
            for task in config["tasks"]:
                rows = by_cell.get((task, paper["protocol"]), {})
                line = method if method in rows else f"{method}: {paper.get('stage', '')}"
                row, base = rows.get(line), rows.get(protocol["baseline"])
                metric = glue_task(task).metrics[0]
                if not row or not row.get("seeds") or not base or not base.get("seeds"):
                    missing.append(task)
                    continue
                seeds_text = f"{len(row['seeds'])} vs {len(base['seeds'])} seeds"
                if set(row["seeds"]) < set(base["seeds"]):  # fewer seeds: compared with the baseline's same seeds
                    base = _on_seeds(base, row["seeds"], metric)
                    seeds_text += (
                        f"; difference, d and IsoScore against the baseline's seeds {','.join(map(str, row['seeds']))}"
                    )
                diff, d = effect(row[metric]["values"], base[metric]["values"])
                p, paired = row[metric]["p_vs_baseline"], row[metric]["paired_p_vs_baseline"]
                pairs = len(row[metric]["paired_seeds"])
                paired_text = _p_fmt(paired)
                if paired is None and pairs > 1:  # every pair differs alike: ttest_rel is undefined
                    by_seed = dict(zip(row["seeds"], row[metric]["values"]))
                    base_by_seed = dict(zip(base["seeds"], base[metric]["values"]))
                    seed = row[metric]["paired_seeds"][0]
                    pair = [by_seed[seed], base_by_seed[seed]]
                    same = without_spread(pair)
                    paired_text += (
                        " (every pair equal)" if same else f" (every pair differs by {pair[0] - pair[1]:+.2f})"
                    )
                isotropy, isotropy_p = _isotropy_text(row, base, row[metric]["paired_seeds"])
                shown.append(
                    f"{task} {metric} {diff:+.2f} (d {_fmt(d, '+.2f')}, p {_p_fmt(p)}, paired p "
                    f"{paired_text} over {pairs} pair{'' if pairs == 1 else 's'}; {seeds_text}{isotropy})"
                )
                tests[f"{method} on {task}"] = {
                    "task metric (unpaired)": p,
                    "task metric (paired)": paired,
                    "dev IsoScore (paired)": isotropy_p,
                }
            text = "; ".join(shown) if shown else "no finished run yet"
            out.append(f"- {method} vs baseline: {text}" + (f". Not run: {', '.join(missing)}." if missing else "."))
        out.append("")
    baselines = {name: protocol["baseline"] for name, protocol in config["protocols"].items()}
    metrics = {task: glue_task(task).metrics[0] for task in config["tasks"]}
    return "\n".join(out + [corrected(tests), detectable(tables, baselines, metrics)])


def corrected(tests: dict[str, dict[str, float | None]]) -> str:
    """The summary's p-values corrected for their number: for each family (``{comparison: {family: p}}``, e.g. the
    task metric's paired p of every method and task), the adjusted p-values (q-values,
    ``scipy.stats.false_discovery_control``) over the comparisons where that p is defined; lists the comparisons
    with p < 0.05 and their q. Benjamini-Hochberg (BH) controls the expected share of false discoveries among those
    with q < 0.05 for independent or positively dependent tests; the comparisons of one task share its baseline's
    runs, so Benjamini-Yekutieli (BY: BH's q times sum_{i<=m} 1/i for m tests, at most 1), which holds under any
    dependence, is given beside it."""
    out = [
        "**Corrected for the number of comparisons**: q-values (scipy.stats.false_discovery_control) over each family "
        "of the summary's p-values, each method and task once: Benjamini-Hochberg (q), and in brackets "
        "Benjamini-Yekutieli (BY), which holds under any dependence between the tests (a task's comparisons share "
        "its baseline); * q < 0.05.",
    ]
    for family in dict.fromkeys(f for ps in tests.values() for f in ps):
        named = {name: p for name, ps in tests.items() if (p := ps.get(family)) is not None}
        if not named:
            continue
        q = q_values(named)
        below = sorted((p, name) for name, p in named.items() if p < 0.05)
        listed = ", ".join(
            f"{name} p {_p_fmt(p)} q {_q_fmt(q['bh'][name])} (BY {_q_fmt(q['by'][name])})" for p, name in below
        )
        out.append(f"- {family}: {len(below)} of {len(named)} p < 0.05" + (f": {listed}." if below else "."))
    return "\n".join(out) + "\n"


def not_run_reason(run: Run, selected: Collection, cost: dict | None, config: dict | None = None) -> str:
    """Why a run has no record: not reached yet by the CPU campaign, or left out of it (by its selections, or as
    longer than its ``max_run_minutes``, :func:`too_long`); with its estimated minutes on this CPU from the cost
    table where the task was timed."""
    minutes = run_minutes(cost, run)
    estimate = "" if minutes is None else f", about {minutes:.0f} min per run on this CPU (glue_cost estimate)"
    if run.key in selected:
        return "in the CPU campaign, not reached yet" + estimate
    if config and too_long(run, config, cost) is not None:
        limit = config["cpu_campaign"]["max_run_minutes"]
        return (
            f"left to an accelerator: about {minutes:.0f} min per run on this CPU (glue_cost estimate), longer than "
            f"the CPU campaign's {limit:g} min (one sitting)"
        )
    return "not in the CPU campaign's selection, left to an accelerator" + estimate


def remaining_cost(runs: list[Run], selected: Collection, cost: dict | None, runs_dir: str, *records_dirs: str) -> str:
    """What is left of ``runs``: how many of the CPU campaign's runs (keys ``selected``) and of the others have no
    record, each with its estimated CPU-hours on the timed machine (the sum of :func:`~experiments.campaign.schedule.run_minutes`;
    runs of an untimed task are counted apart). Runs that non-finite numbers stopped are counted on their own.
    Where finished runs recorded their wall time (``campaign.json``), the ratio of wall time to estimate over them
    (median and middle half) says how far the estimates held on the machine as it was loaded, and the hours left
    are also given at the median ratio."""
    left = [r for r in runs if pending(r, runs_dir, *records_dirs)]
    unfinished = [r for r in runs if finished_record(r, runs_dir, *records_dirs) is None]
    stopped = len(unfinished) - len(left)
    ratios = [
        record["wall_seconds"] / 60 / minutes
        for run in runs
        if (record := campaign_record(run, runs_dir, *records_dirs)) and (minutes := run_minutes(cost, run))
    ]
    median = float(np.median(ratios)) if ratios else None
    parts = []
    for label, group in (
        ("in the CPU campaign", [r for r in left if r.key in selected]),
        ("left to an accelerator", [r for r in left if r.key not in selected]),
    ):
        estimates = [run_minutes(cost, r) for r in group]
        timed = [m for m in estimates if m is not None]
        text = f"{len(group)} {label}"
        if timed:
            text += f" (about {sum(timed) / 60:.0f} CPU-hours on this CPU by the glue_cost estimates"
            text += f", {median * sum(timed) / 60:.0f} at the finished runs' median ratio" if median else ""
            text += f"; {len(estimates) - len(timed)} of an untimed task)" if len(timed) < len(estimates) else ")"
        parts.append(text)
    finished = f"{len(runs) - len(unfinished)} of {len(runs)} runs finished" + (
        f", {stopped} stopped by non-finite numbers" if stopped else ""
    )
    if ratios:
        q1, q3 = np.percentile(ratios, [25, 75])
        finished += (
            f" (their wall time was {median:.1f}x their glue_cost estimate, median of {len(ratios)}; the middle half "
            f"{q1:.1f}x to {q3:.1f}x)"
        )
    return f"{finished}; not yet run: " + " and ".join(parts) + "."


def report(
    config: dict,
    runs: list[Run],
    runs_dir: str,
    out: str,
    name: str,
    prov: dict,
    header: str,
    *,
    selected: Collection = frozenset(),
    cost: dict | None = None,
    records_dirs: tuple = (),
    summarise: bool = True,
) -> str:
    """Write the tables (every method of every task and protocol of ``runs``, "not run" with its reason where no
    seed finished), the summary by paper, the curves and the run records (module docstring); return the
    Markdown path. ``selected``: the keys of the CPU campaign's runs; ``records_dirs``: further places that
    hold committed run records (the sweep's report also finds the table runs it shares); ``summarise``: add the
    summary by paper (not for a sweep, which has no baseline lines)."""
    records_dir = os.path.join(out, f"{name}_runs")
    copy_records(runs, runs_dir, records_dir)
    dirs = (records_dir, *records_dirs)
    table = collect(runs, runs_dir, *dirs)
    sections, payload = [header], []
    for task in config["tasks"]:
        for protocol, spec in config["protocols"].items():
            cell = [r for r in runs if (r.task, r.protocol) == (task, protocol)]
            if not cell:
                continue
            unfinished = [r for r in cell if finished_record(r, runs_dir, *dirs) is None]
            diverged = {r: error for r in unfinished if (error := diverged_record(r, runs_dir, *dirs))}
            lines = table.get((task, protocol), {})
            done = {base_method(line.split(": ")[0]) for line in lines}
            not_run = {}
            for method in dict.fromkeys(r.method for r in unfinished if r.method not in done):
                stopped = [r.seed for r in diverged if r.method == method]
                waiting = [r for r in unfinished if r.method == method and r not in diverged]
                why = (
                    [f"seed{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))} diverged"]
                    if stopped
                    else []
                )
                not_run[method] = "; ".join(
                    why + ([not_run_reason(waiting[0], selected, cost, config)] if waiting else [])
                )
            text, rows = task_table(task, lines, spec, not_run)
            if diverged:
                text += (
                    "\n\nStopped by non-finite numbers (`isojax finetune` exit status 3; not run again): "
                    + "; ".join(
                        f"{r.method} seed {r.seed}: {error.partition('; ')[0]}" for r, error in diverged.items()
                    )
                )
            sections.append(
                f"## {task}, protocol {protocol} ({len(cell) - len(unfinished)} of {len(cell)} runs "
                "finished)\n\n" + text
            )
            payload.append({"task": task, "protocol": protocol, "rows": rows})
    if summarise and config.get("summaries"):
        sections.append(summary(config, payload))
    picture = curves(
        runs,
        runs_dir,
        dirs,
        os.path.join(out, f"{name}_curves.png"),
        title=f"{config['title']}: dev metric over training, mean over seeds",
    )
    if picture:
        sections.append(f"![curves]({os.path.basename(picture)})")
    sections.append(
        f"Run records (results.json, log.jsonl, campaign.json of every finished run): "
        f"`{os.path.basename(records_dir)}/`"
    )
    protocols = {k: v["source"] for k, v in config["protocols"].items()}
    return write_result(
        name, config["title"], sections, {"protocols": protocols, "tables": payload}, prov=prov, directory=out
    )


def commits(runs: list[Run], runs_dir: str, records_dirs: tuple) -> list[str]:
    """The commits the finished runs among ``runs`` were made at (from their ``campaign.json``)."""
    return sorted({record["commit"] for run in runs if (record := campaign_record(run, runs_dir, *records_dirs))})


def header(
    config: dict, runs: list[Run], selected: Collection, cost: dict | None, runs_dir: str, *records_dirs: str
) -> str:
    """The report's opening: what its numbers are and how they were tested, the protocols, the CPU campaign's note,
    the commits the finished runs of ``runs`` were made at, and what is left (:func:`remaining_cost`)."""
    made = commits(runs, runs_dir, records_dirs)
    return (
        f"Model `{config['model']}`; dev sets; mean ± std over seeds (population std); in brackets the "
        "p-values against the protocol's baseline: the two-sample t-test (scipy.stats.ttest_ind, equal "
        "variances) and the paired t-test (scipy.stats.ttest_rel) over the seeds whose runs share the "
        "data order and the dropout stream (listed; `experiments/reproductions/glue_pairing.py` says what pairs two "
        "runs); * p < 0.05, per comparison (of 10 independent tests at the 5% level, at least one falls below "
        "it by chance with probability 0.40; the summary ends with the p-values corrected for the number of "
        "methods and tasks compared, and the smallest differences the seeds can detect). † marks a method whose "
        "model differs from the baseline's (SoftDecay, IsoBN, flow, the Isotropy Layer's stage 2): its runs share "
        "the data order and the per-site dropout "
        "keys, but the masks act on other activations. The added loss terms (a regulariser, or the flow's "
        "negative log-likelihood per dimension) are the mean over seeds of the unweighted term at the first "
        "and the last logged training step: whether the optimiser moved it. s / epoch is each run's own training time per "
        "epoch (evaluation and checkpoints left out): runs made at different times on a shared machine "
        "differ by its load as well; `experiments/results/glue_cost.md` gives the measured cost per "
        'task. A method with no finished seed says "not run" and why. Protocols:\n\n'
        + "\n".join(f"- **{k}**: {v['source']}" for k, v in config["protocols"].items())
        + f"\n\nCPU campaign: {config.get('cpu_campaign', {}).get('note', '–')} Runs made at commit(s) "
        f"{', '.join(made) or '–'}. " + remaining_cost(runs, selected, cost, runs_dir, *records_dirs)
    )
