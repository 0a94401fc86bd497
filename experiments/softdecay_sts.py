"""Table 1 and the Figure-4 metrics of softdecay-token-uniformity.txt: unsupervised STS with SoftDecay.

    python -m experiments.softdecay_sts [--models default] [--pooling last2avg,mean] [--sets stsb,sts12,...]

For each model and pooling: Spearman x100 on each STS set for the raw embeddings, whitening, flow and SoftDecay
(alpha searched over -0.2..-1.0 on STS-B dev, then fixed), and the Figure-4 measures (TokenUni, RBF_dis, EV_1,
IsoScore, LSDS) of the transformed STS-B test embeddings. Sets that cannot be loaded here (STS12-16 and SICK-R need
the Hub) are listed as missing. Writes experiments/results/softdecay_sts.{md,json} next to the paper's numbers.
With a reachable Hub: --models bert-base-cased,distilbert-base-uncased,albert-base-v2,roberta-base.
"""
from __future__ import annotations

import argparse

import numpy as np

import isojax
from experiments.report import display_name, markdown_table, write_result
from isojax.data.sts import load_sts
from isojax.eval import sts

SETS = ("stsb", "sts12", "sts13", "sts14", "sts15", "sts16", "sickr")
PAPER = {  # Table 1, BERT-base-cased rows (Spearman x100): STSB, STS12-16, SICK-R, avg
    "BERT-base-cased (paper)": [59.05, 57.72, 58.38, 61.97, 70.28, 69.63, 63.75, 62.97],
    "+ BERT-flow (NLI) (paper)": [58.56, 59.54, 64.69, 64.66, 72.92, 71.84, 65.44, 65.38],
    "+ BERT-whitening (NLI) (paper)": [68.19, 61.69, 65.70, 66.02, 75.11, 73.11, 63.60, 67.63],
    "+ SoftDecay (paper)": [72.41, 65.16, 72.10, 69.49, 77.09, 77.05, 65.55, 71.26],
}


def _csv(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def run(model_name: str, pooling: str, sets, *, max_length: int, flow_steps: int) -> dict:
    module, params, tokenizer = isojax.from_pretrained(model_name)
    embed = lambda data: sts.embed_pairs(module, params, tokenizer, data, pooling=pooling,  # noqa: E731
                                         max_length=max_length, progress=True)
    dev = load_sts("stsb", "validation")
    alpha, search = sts.search_alpha(*embed(dev), dev.scores)
    transforms = [sts.Transform("raw"), sts.Transform("whiten"), sts.Transform("flow", flow_steps=flow_steps),
                  sts.Transform("softdecay", alpha=alpha)]
    scores, missing, isotropy = {t.label: {} for t in transforms}, [], {}
    for name in sets:
        try:
            data = load_sts(name, "test")
        except (ConnectionError, FileNotFoundError, OSError) as e:
            missing.append(f"{name} ({type(e).__name__})")
            continue
        a, b = embed(data)
        for t in transforms:
            row = sts.evaluate_pairs(a, b, data.scores, t, isotropy=name == "stsb")
            scores[t.label][name] = row["spearman"]
            if name == "stsb":
                isotropy[t.label] = {k: row[k] for k in ("token_uni", "rbf_dis", "ev1", "isoscore", "lsds")}
    return {"model": display_name(model_name), "pooling": pooling, "alpha": alpha, "alpha_search": search, "scores": scores,
            "isotropy_stsb_test": isotropy, "missing": missing}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=_csv, default=["default"])
    ap.add_argument("--pooling", type=_csv, default=["last2avg", "mean"],
                    help="last2avg is the SoftDecay authors' pooling; mean is all-MiniLM-L6-v2's own")
    ap.add_argument("--sets", type=_csv, default=list(SETS))
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--flow-steps", type=int, default=300)
    args = ap.parse_args(argv)
    runs = [run(m, p, args.sets, max_length=args.max_length, flow_steps=args.flow_steps)
            for m in args.models for p in args.pooling]
    sections = []
    for r in runs:
        present = [s for s in args.sets if any(s in v for v in r["scores"].values())]
        rows = [[label] + [v.get(s) for s in present] + [float(np.mean([v[s] for s in present]))]
                for label, v in r["scores"].items()]
        sections.append(f"## {r['model']}, {r['pooling']} pooling: Spearman x100 (test)\n\nSoftDecay alpha = "
                        f"{r['alpha']:g}, best on STS-B dev of " + ", ".join(
                            f"{k:g}: {v:.2f}" for k, v in r["alpha_search"].items())
                        + (f". Not available here: {', '.join(r['missing'])}." if r["missing"] else ".") + "\n\n"
                        + markdown_table(["method", *present, "avg"], rows))
        iso = [[label, *vals.values()] for label, vals in r["isotropy_stsb_test"].items()]
        sections.append(f"Figure-4 measures of the transformed STS-B test sentence embeddings ({r['model']}, "
                        f"{r['pooling']}):\n\n" + markdown_table(["method", "TokenUni", "RBF_dis", "EV_1",
                                                                    "IsoScore", "LSDS"], iso))
    sections.append("## The paper's Table 1 (BERT-base-cased; needs the Hub)\n\n" + markdown_table(
        ["method", *SETS, "avg"], [[k, *v] for k, v in PAPER.items()]))
    print(write_result("softdecay_sts", "SoftDecay, unsupervised STS (softdecay-token-uniformity.txt Table 1, "
                       "Figure 4)", sections, {"runs": runs, "paper": PAPER}))


if __name__ == "__main__":
    main()
