"""The campaign's figure: the dev metric over training steps, task by task, from the finished runs' logs."""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np

from experiments.campaign.runner import finished_record
from experiments.campaign.spec import Run


def curves(runs: list[Run], runs_dir: str, records_dirs: tuple, path: str, title: str) -> str | None:
    """One panel per task (three to a row): the first task metric on dev over training steps, mean over seeds, one
    line per protocol/method (from the runs' ``log.jsonl`` eval records), drawn alike in every panel (a colour per
    method, the baseline black; solid App. B, dashed the shrink protocol) and named in one legend below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from isojax.data.glue import glue_task
    from isojax.train.logs import JsonLog, latest_evaluations

    series: defaultdict[str, defaultdict[str, list[list[dict]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        directory = finished_record(run, runs_dir, *records_dirs)
        if directory is not None:
            evaluations = latest_evaluations(JsonLog(os.path.join(directory, "log.jsonl")).read())
            series[run.task][f"{run.protocol}: {run.method}"].append(evaluations)
    if not series:
        return None
    tasks = sorted(series)
    labels = sorted({label for task in tasks for label in series[task]})
    palette = plt.get_cmap("tab20")  # 20 listed colours; palette(i) is the i-th
    methods = sorted({label.split(": ", 1)[1] for label in labels} - {"baseline"})
    style = {
        label: dict(
            color="black" if method == "baseline" else palette(methods.index(method) % palette.N),
            linewidth=2.2 if method == "baseline" else 1.2,
            zorder=3 if method == "baseline" else 2,
            marker="os^Dv<>p"[labels.index(label) % 8],
            linestyle="-" if protocol == "appB" else "--",
        )
        for label in labels
        for protocol, method in [label.split(": ", 1)]
    }  # one look per protocol/method in every panel: the method's colour (baseline black), the protocol's line
    columns = min(3, len(tasks))
    rows = -(-len(tasks) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.6 * rows + 1.2), squeeze=False)
    for ax in axes.flat[len(tasks) :]:
        ax.set_visible(False)
    handles = {}
    for ax, task in zip(axes.flat, tasks):
        metric = glue_task(task).metrics[0]
        for label, seeds in sorted(series[task].items()):
            steps = sorted(set.intersection(*[{r["step"] for r in s} for s in seeds]))
            values = [np.mean([next(r[metric] for r in s if r["step"] == step) for s in seeds]) for step in steps]
            (handles[label],) = ax.plot(steps, values, markersize=3, label=label, **style[label])
        sizes = {len(s) for s in series[task].values()}
        count = "-".join(map(str, sorted({min(sizes), max(sizes)})))
        ax.set(title=f"{task}: {metric} (dev; mean of {count} seeds)", xlabel="step")
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
    fig.legend(
        [handles[label] for label in labels], labels, loc="lower center", ncol=4, fontsize=7, frameon=False
    )  # one legend for every panel, below them
    fig.suptitle(title, fontsize=9)
    legend_rows = -(-len(labels) // 4)
    fig.tight_layout(rect=(0, 0.035 * legend_rows / rows, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
