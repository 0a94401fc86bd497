"""The ``isojax`` command.

    isojax analyze [--model default] [--data stsb] [--split test] [--out outputs/analyze] [--json PATH]
"""
from __future__ import annotations

import argparse
import logging
import os
import sys


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="local Hugging Face model directory, Hub id, or 'default' (all-MiniLM-L6-v2, bundled)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass (default 32)")
    p.add_argument("--max-length", type=int, default=128, help="truncate sentences to this many tokens (128)")


def _texts(args) -> list[str]:
    from isojax.data.sts import load_sts

    data = load_sts(args.data, args.split)
    texts = list(dict.fromkeys(data.sentences1 + data.sentences2))  # unique, first-seen order
    return texts[: args.limit] if args.limit else texts


def cmd_analyze(args) -> int:
    import isojax
    from isojax.eval import analysis

    module, params, tokenizer = isojax.from_pretrained(args.model)
    texts = _texts(args)
    os.makedirs(args.out, exist_ok=True)
    result = analysis.analyze_layers(module, params, tokenizer, texts, batch_size=args.batch_size,
                                     max_length=args.max_length, progress=not args.quiet)
    result.update(model=args.model, data=args.data, split=args.split)
    print(f"{args.model} on {args.data} {args.split}: {len(texts)} sentences (mean over sentences; "
          "layer 0 = embedding output)")
    print(analysis.format_table(result))
    png = analysis.plot_cdf(result, os.path.join(args.out, "sv_cdf.png"),
                            title=f"{args.model}: singular-value CDF per layer ({args.data} {args.split})")
    print(f"figure: {png}")
    if args.json:
        print(f"json: {analysis.save_json(result, args.json)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="isojax", description="Isotropy analysis and calibration of "
                                     "BERT-family encoders (JAX/Flax).")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("analyze", help="layer-wise token uniformity: TokenUni, EV_1, singular-value CDF",
                       description="Per layer (0 = embeddings): mean pairwise cosine of token states (TokenUni), "
                       "EV_1 = s1^2 / sum s^2, median and skewness of normalised singular values s/s1 of each "
                       "sentence's token matrix, averaged over sentences; and a PNG of the per-layer CDF of "
                       "normalised singular values (Figure 1 of the SoftDecay paper).")
    _add_model_options(p)
    p.add_argument("--data", default="stsb", help="STS set whose sentences are analysed: stsb, sts12..sts16, "
                   "sickr (default stsb)")
    p.add_argument("--split", default="test", help="split of --data (default test)")
    p.add_argument("--limit", type=int, default=0, help="analyse only the first N unique sentences (0 = all)")
    p.add_argument("--out", default="outputs/analyze", help="directory for figures (default outputs/analyze)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_analyze)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
