"""Tables 1-3 of too-much-in-common-centering.txt: isotropy I(W) of input embeddings and word similarity.

    python -m experiments.reproductions.too_much_in_common [--models default]

Table 1: I(W), I(W_c) (centered), I(W_r) (ceil(d/100) top directions removed), avg ||e(w)||, ||mu|| and their ratio.
Tables 2-3: Pearson r x100 on SimLex-999, MEN, WordSim353 and Stanford Rare Words (pairs of single-token words),
cosine and inner product, raw / centered / centered-scaled / post-processed (all-but-the-top, eq. 11).
Writes experiments/results/too_much_in_common.{md,json}. With a reachable Hub, pass e.g.
--models bert-base-uncased,bert-base-cased,roberta-base (or gpt2,gpt2-medium for the GPT-2 rows).
"""

from __future__ import annotations

import argparse

import numpy as np

import isojax
from experiments.tooling.report import display_name, markdown_table, write_result
from isojax.data.wordsim import load_wordsim
from isojax.eval import wordsim

SETS = ("simlex999", "men", "ws353", "rw")
LABELS = {"raw": "", "center": "+ Centered", "scaled_center": "+ Centered-Scaled", "abtt": "+ Post-Process"}
PAPER_TABLE1 = {  # I(W), I(W_c), I(W_r), avg norm, ||mu||, ratio
    "BERT-base-uncased": [0.39, 0.98, 0.998, 1.40, 0.94, 0.67],
    "BERT-base-cased": [0.59, 0.98, 0.996, 1.29, 0.50, 0.39],
    "RoBERTa-base": [0.50, 0.87, 0.959, 3.65, 0.57, 0.16],
    "GPT-2 (12 layers)": [0.12, 0.91, 0.969, 3.96, 2.05, 0.52],
    "GPT-2 (24 layers)": [0.52, 0.95, 0.981, 3.68, 2.04, 0.55],
}
PAPER_TABLE2 = {  # BERT-base-cased, average Pearson x100: cosine, inner product
    "raw": [62.29, 60.91],
    "center": [60.44, 60.08],
    "scaled_center": [62.32, 62.41],
    "abtt": [65.57, 66.10],
}


def run(model_name: str) -> dict:
    _, params, tokenizer = isojax.from_pretrained(model_name)
    w = wordsim.input_embeddings(params)
    data = [load_wordsim(name) for name in SETS]
    rows = []
    for method in LABELS:
        wt = wordsim.transform_embeddings(w, method)
        for similarity in ("cosine", "inner"):
            rows += [
                {"method": method, **wordsim.evaluate_wordsim(wt, tokenizer, d, similarity=similarity)} for d in data
            ]
    return {"model": display_name(model_name), "isotropy": wordsim.embedding_isotropy(w), "wordsim": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=lambda s: [t for t in s.split(",") if t], default=["default"])
    args = ap.parse_args(argv)
    runs = [run(m) for m in args.models]
    keys = ("I1", "I1_centered", "I1_abtt", "avg_norm", "mean_norm", "mean_norm_ratio")
    t1 = [[r["model"], *(r["isotropy"][k] for k in keys)] for r in runs]
    t1 += [[f"{k} (paper)", *v] for k, v in PAPER_TABLE1.items()]
    sections = [
        "## Table 1: isotropy of the input embedding matrix\n\n"
        + markdown_table(["model", "I(W)", "I(W_c)", "I(W_r)", "avg ‖e(w)‖", "‖μ‖", "ratio"], t1)
    ]
    for r in runs:
        by = {(x["method"], x["similarity"], x["data"]): x for x in r["wordsim"]}
        t2 = [
            [
                f"{r['model']} {LABELS[m]}".strip(),
                *(float(np.mean([by[m, s, d]["pearson"] for d in SETS])) for s in ("cosine", "inner")),
            ]
            for m in LABELS
        ]
        t3 = [
            [f"{LABELS[m] or 'raw'} ({s})", *(by[m, s, d]["pearson"] for d in SETS)]
            for m in LABELS
            for s in ("cosine", "inner")
        ]
        used = ", ".join(
            f"{d} {by['raw', 'cosine', d]['pairs_used']}/{by['raw', 'cosine', d]['pairs_total']}" for d in SETS
        )
        sections.append(
            f"## Table 2: {r['model']}, average Pearson r x100 over {', '.join(SETS)}\n\n"
            f"Pairs of single-token words used: {used}.\n\n" + markdown_table(["model", "CosSim", "<.,.>"], t2)
        )
        sections.append(
            f"## Table 3: {r['model']}, Pearson r x100 per data set\n\n" + markdown_table(["method", *SETS], t3)
        )
    sections.append(
        "## The paper's Table 2, BERT-base-cased (needs the Hub)\n\n"
        + markdown_table(
            ["method", "CosSim", "<.,.>"], [[LABELS[k] or "BERT-base-cased", *v] for k, v in PAPER_TABLE2.items()]
        )
    )
    print(
        write_result(
            "too_much_in_common",
            "Too much in common: I(W) and word similarity (too-much-in-common-centering.txt Tables 1-3)",
            sections,
            {"runs": runs, "paper_table1": PAPER_TABLE1, "paper_table2": PAPER_TABLE2},
        )
    )


if __name__ == "__main__":
    main()
