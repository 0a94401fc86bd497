"""The ``isojax`` command: ``analyze``, ``sts``, ``wordsim``, ``finetune`` (:mod:`isojax.train.cli`) and ``export``
(:mod:`isojax.export`); ``analyze`` and ``sts`` also read a fine-tuning run directory (its newest checkpoint).

Every command prints a table and, with ``--json PATH``, writes the same numbers as JSON. A user's mistake (a bad
option value, a missing file, an invalid configuration: ``ValueError``, ``TypeError``, ``OSError``) prints one line
``isojax COMMAND: error: ...`` on stderr and exits with status 2, as argparse does for its own errors; a run whose
numbers stopped being finite (``FloatingPointError``: ``finetune`` stops after ``max_nonfinite_steps`` non-finite
steps in a row, :class:`isojax.train.loop.NonFiniteTrainingError`) prints the same one line and exits with status
3 (``EXIT_NONFINITE``), so that a script tells a diverged run from a mistake or a crash (status 1); a run stopped by
``SIGTERM`` or Ctrl-C (:mod:`isojax.train.preemption`: checkpointed, resumed by the same command) prints where it
stopped and exits with status 143 (``EXIT_STOPPED``, 128 + SIGTERM, as a shell reports a process the signal ended) or
130 (``EXIT_INTERRUPTED``, 128 + SIGINT). A fault of the machine rather than of the command (a full disk or quota, a
read-only or forbidden output directory, an I/O error, an output directory another run holds, processes of a
multi-process run that never connected: an ``OSError`` of those kinds anywhere in the exception's causes,
:func:`environment_fault`) prints one line naming it and exits with status 74 (``EXIT_ENVIRONMENT``, sysexits'
``EX_IOERR``): the same command may succeed elsewhere or later. ``isojax -v`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from isojax._files import DirectoryInUse, write_json
from isojax.argtypes import int_at_least
from isojax.host import reuse_freed_memory
from isojax.train.cli import cmd_finetune
from isojax.train.preemption import TrainingStopped

EXIT_NONFINITE = 3  # exit status of a run stopped by non-finite numbers (module docstring)
EXIT_STOPPED = 128 + 15  # exit status of a run stopped by SIGTERM at a checkpoint (module docstring)
EXIT_INTERRUPTED = 128 + 2  # exit status of a run stopped by SIGINT (Ctrl-C) at a checkpoint
EXIT_ENVIRONMENT = 74  # exit status of a fault of the machine, not of the command (module docstring)
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO})

STS_SETS_HELP = (
    "stsb, sts12, sts13, sts14, sts15, sts16, sickr, or a SemEval sub-corpus such as sts12/MSRpar; "
    "NAME:SPLIT picks a split (sickr:all = MTEB's 9927 pairs); stsb works offline, the others need "
    "--data-dir or the Hub"
)


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="default",
        help="local Hugging Face model directory, Hub id, 'default' (all-MiniLM-L6-v2, bundled), or an isojax "
        "finetune output directory (its newest checkpoint's encoder)",
    )
    p.add_argument("--batch-size", type=_positive, default=64, help="sentences per forward pass (default 64)")
    p.add_argument(
        "--max-length", type=int_at_least(2), default=128, help="truncate sentences to this many tokens (128)"
    )
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_data_dir(p: argparse.ArgumentParser) -> None:
    from isojax.data.datadir import DATA_DIR_HELP

    p.add_argument("--data-dir", default=None, metavar="DIR", help=DATA_DIR_HELP)


_positive = int_at_least(1)
_count = int_at_least(0)  # a limit or a number of directions, 0 meaning "all" or "none"


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _write_json(path: str | None, payload) -> None:
    if path:
        write_json(Path(path), payload)
        print(f"json: {path}")


def read_texts(path: str, *, field: str = "text", limit: int = 0) -> list[str]:
    """The texts of ``path``: one per line (blank lines skipped), or for a ``.jsonl`` file the string ``field`` of the
    JSON object on each non-blank line; the first ``limit`` only when ``limit > 0``. ``ValueError`` naming the file
    and line for a line that is not such an object, or when the file holds no text."""
    texts: list[str] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if limit and len(texts) >= limit:
                break
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            if path.endswith(".jsonl"):
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"--texts {path}, line {number}: not JSON ({e.msg})") from None
                if not isinstance(value, dict) or not isinstance(value.get(field), str):
                    raise ValueError(f"--texts {path}, line {number}: no string field {field!r} (set --field)")
                line = value[field]
            texts.append(line)
    if not texts:
        raise ValueError(f"--texts {path} holds no text")
    return texts


def cmd_analyze(args) -> int:
    import isojax
    from isojax.data.sts import load_sts
    from isojax.eval import analysis, wordsim
    from isojax.export import pretrained_or_run
    from isojax.models import require_tokenizer

    if args.texts and args.dataset:
        raise ValueError("give --texts FILE or --dataset NAME, not both")
    if args.texts:
        texts = read_texts(args.texts, field=args.field, limit=args.limit)
        source = args.texts
    elif args.dataset:
        from isojax.data.tables import load_table

        table = load_table(args.dataset, args.split, config=args.dataset_config)
        texts = [t for t in table.text(args.field) if t.strip()]  # blank rows skipped, as blank lines of --texts
        texts = texts[: args.limit] if args.limit else texts
        if not texts:
            raise ValueError(f"--dataset {args.dataset} [{args.split}]: column {args.field!r} holds no text")
        source = f"{args.dataset} {args.split}"
    else:
        data = load_sts(args.data, args.split, data_dir=args.data_dir)
        texts = list(dict.fromkeys(data.sentences1 + data.sentences2))  # unique, first-seen order
        texts = texts[: args.limit] if args.limit else texts
        source = f"{args.data} {args.split}"
    with pretrained_or_run(args.model) as model:
        module, params, tokenizer = isojax.from_pretrained(model)
    require_tokenizer(tokenizer, args.model, "isojax analyze")
    result = analysis.analyze_layers(
        module,
        params,
        tokenizer,
        texts,
        batch_size=args.batch_size,
        max_length=args.max_length,
        tokens_per_text=args.tokens_per_text or None,
        progress=not args.quiet,
        attention_sinks=args.attention_sinks,
        twonn_tokens=args.twonn_tokens,
    )
    if args.texts:
        result.update(model=args.model, texts=args.texts)
    elif args.dataset:
        result.update(model=args.model, data=args.dataset, split=args.split, field=args.field)
    else:
        result.update(model=args.model, data=args.data, split=args.split)
    print(
        f"{args.model} on {source}: {len(texts)} texts; per-sentence measures averaged over "
        f"the {result['num_sentence_texts']} with 2 or more tokens, "
        f"corpus measures on {result['num_tokens']} content tokens; layer 0 = embedding output"
    )
    print(analysis.format_table(result))
    result["input_embeddings"] = wordsim.embedding_isotropy(wordsim.input_embeddings(params))
    print("input embedding matrix W: " + ", ".join(f"{k} {v:.4f}" for k, v in result["input_embeddings"].items()))
    os.makedirs(args.out, exist_ok=True)
    name = f"{args.model} ({os.path.basename(args.texts) if args.texts else source})"
    print(
        "figures:",
        analysis.plot_cdf(result, os.path.join(args.out, "sv_cdf.png"), title=f"{name}: singular-value CDF per layer"),
        analysis.plot_layers(result, os.path.join(args.out, "layers.png"), title=f"{name}: per layer"),
    )
    if args.report:
        from isojax.eval.report import write_report

        print("report:", write_report(result, args.report, title=f"Anisotropy analysis: {name}"))
    _write_json(args.json, result)
    return 0


def _sts_spec(text: str, split: str) -> tuple[str, str]:
    """``"sickr:all"`` -> ``("sickr", "all")``; ``"sts12"`` -> ``("sts12", split)``."""
    name, _, own = text.partition(":")
    return name, own or split


def cmd_sts(args) -> int:
    import isojax
    from isojax.data.sts import load_sts
    from isojax.eval import sts
    from isojax.export import pretrained_or_run
    from isojax.models import require_kind, require_tokenizer

    search = args.alpha == "search"
    try:
        alpha = -0.6 if search else float(args.alpha)
    except ValueError:
        alpha = math.nan
    if not -1 <= alpha < 0:
        raise ValueError(f"--alpha must be 'search' or a number in [-1, 0), got {args.alpha}")
    transforms = [
        sts.Transform(
            method,
            whiten_k=args.whiten_k,
            abtt_D=args.abtt_d,
            abtt_mode=args.abtt_mode,
            alpha=alpha,
            flow_steps=args.flow_steps,
            seed=args.seed,
        )
        for method in args.methods
    ]  # a bad method fails before model work

    def load(spec, flag):
        try:
            data = load_sts(*_sts_spec(spec, args.split), data_dir=args.data_dir)
        except ValueError as e:  # say which option named the set
            raise ValueError(f"{flag} {spec!r}: {e}") from e
        return data.head(args.limit) if args.limit else data

    sets = {}
    for spec in args.data:
        data = load(spec, "--data")
        sets[data.name if data.split == "test" else f"{data.name}:{data.split}"] = data
    dev = load(args.alpha_data, "--alpha-data") if search and "softdecay" in args.methods else None
    with pretrained_or_run(args.model) as model:
        module, params, tokenizer = isojax.from_pretrained(model)
    require_kind(module.config, ("encoder",), "isojax sts (sentence embeddings)")
    require_tokenizer(tokenizer, args.model, "isojax sts")
    embedded = sts.embed_sets(
        module,
        params,
        tokenizer,
        [*sets.values(), *([dev] if dev else [])],
        poolings=(args.pooling,),
        max_length=args.max_length,
        batch_size=args.batch_size,
        progress=not args.quiet,
    )[args.pooling]
    pairs = {label: (a, b, data.scores) for (label, data), (a, b) in zip(sets.items(), embedded)}
    result = sts.evaluate_sets(
        pairs, transforms, dev=(*embedded[-1], dev.scores) if dev else None, isotropy=not args.no_isotropy
    )
    print(
        f"{args.model}, {args.pooling} pooling: Spearman x100 of the cosine of each pair's embeddings; pairs: "
        + ", ".join(f"{label} {len(data)}" for label, data in sets.items())
    )
    if dev:
        found = result["alpha_search"]
        print(
            f"SoftDecay alpha search on {dev.name} {dev.split} ({len(dev)} pairs): "
            + ", ".join(f"{k}: {v:.2f}" for k, v in found["spearman"].items())
            + f" -> alpha = {found['best']:g}"
        )
    print(sets_table(result))
    if not args.no_isotropy:
        print("\nPer set: Spearman/Pearson x100 and the isotropy of the 2N transformed sentence embeddings")
        for label, rows in result["sets"].items():
            print(f"[{label}]\n{sts_table(rows)}")
    result["sets"] = {
        label: {"name": data.name, "split": data.split, "pairs": len(data), "rows": result["sets"][label]}
        for label, data in sets.items()
    }
    _write_json(args.json, {"model": args.model, "pooling": args.pooling, "data_dir": args.data_dir, **result})
    return 0


def sets_table(result: dict) -> str:
    """Aligned text table of :func:`isojax.eval.sts.evaluate_sets`: Spearman x100, a row per transform, a column
    per set and the average over the sets."""
    labels = list(result["sets"])
    methods = list(result["average"])
    width = max(len(m) for m in methods) + 2
    cols = [max(9, len(label) + 2) for label in labels]
    out = [f"{'method':<{width}}" + "".join(f"{label:>{w}}" for label, w in zip(labels, cols)) + f"{'avg':>9}"]
    for i, method in enumerate(methods):
        out.append(
            f"{method:<{width}}"
            + "".join(f"{result['sets'][label][i]['spearman']:>{w}.2f}" for label, w in zip(labels, cols))
            + f"{result['average'][method]:>9.2f}"
        )
    return "\n".join(out)


def sts_table(rows: list[dict]) -> str:
    """Aligned text table of :func:`isojax.eval.sts.evaluate_pairs` rows."""
    cols = [c for c in ("spearman", "pearson", "token_uni", "rbf_dis", "ev1", "isoscore", "lsds") if c in rows[0]]
    width = max(len(r["method"]) for r in rows) + 2
    out = [f"{'method':<{width}}" + "".join(f"{c:>10}" for c in cols)]
    out += [
        f"{r['method']:<{width}}" + "".join(f"{r[c]:>10.{2 if c in ('spearman', 'pearson') else 4}f}" for c in cols)
        for r in rows
    ]
    return "\n".join(out)


def cmd_export(args) -> int:
    from isojax.export import export_run

    described = export_run(args.run, args.out)
    print(f"wrote {args.out} from {args.run}, checkpoint step {described['checkpoint']}")
    for note in described["transformers"]:
        print(f"transformers: {note}")
    return 0


def cmd_wordsim(args) -> int:
    import isojax
    from isojax.data.wordsim import load_wordsim
    from isojax.eval import wordsim
    from isojax.models import require_tokenizer

    _, params, tokenizer = isojax.from_pretrained(args.model)
    require_tokenizer(tokenizer, args.model, "isojax wordsim")
    sets = [load_wordsim(name) for name in args.data] + [load_wordsim(path) for path in args.file]
    w = wordsim.input_embeddings(params)
    rows = []
    for method in args.methods:
        wt = wordsim.transform_embeddings(w, method)
        for similarity in args.similarity:
            for data in sets:
                rows.append({"method": method, **wordsim.evaluate_wordsim(wt, tokenizer, data, similarity=similarity)})
    print(f"{args.model}: word similarity on the input embedding matrix (pairs of single-token words), x100")
    print(f"{'method':<14}{'sim':<8}{'data':<12}{'pairs':>11}{'pearson':>9}{'spearman':>9}")
    for r in rows:
        print(
            f"{r['method']:<14}{r['similarity']:<8}{r['data']:<12}{r['pairs_used']:>5}/{r['pairs_total']:<5}"
            f"{r['pearson']:>9.2f}{r['spearman']:>9.2f}"
        )
    _write_json(args.json, {"model": args.model, "rows": rows})
    return 0


def build_parser() -> argparse.ArgumentParser:
    from isojax.eval.sts import METHODS
    from isojax.eval.wordsim import EMBEDDING_METHODS, SIMILARITIES
    from isojax.models.heads import POOLINGS

    parser = _Parser(prog="isojax", description="Isotropy analysis and calibration of BERT-family encoders (JAX/Flax).")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "analyze",
        help="layer-wise token uniformity and isotropy, singular-value CDF, I(W)",
        description="Per layer (0 = embeddings), averaged over sentences: TokenUni (mean pairwise "
        "cosine of token states), RBF_dis, EV_1..3, median and skewness of normalised singular "
        "values s/s1 of each sentence's token matrix, max|h|/median|h|; streamed over all content tokens "
        "(special tokens left out): IsoScore, the anisotropy s1^2/sum s^2 raw and centered, the mean cosine, "
        "the rogue-dimension shares of the top 1 and 3 dimensions, the largest |h| (massive activations), the "
        "TwoNN intrinsic dimension of a token sample; attention sinks (α₁, Sink_0.3) for causal LMs. "
        "Also I(W) of the input embedding matrix raw, centered and all-but-the-top. Figures: the per-layer CDF of normalised singular values "
        "(Figure 1 of the SoftDecay paper) and per-layer curves.",
    )
    _add_model_options(p)
    p.add_argument("--data", default="stsb", help=f"STS set whose sentences are analysed: {STS_SETS_HELP}")
    p.add_argument("--split", default="test", help="split of --data (default test)")
    _add_data_dir(p)
    p.add_argument(
        "--texts",
        default=None,
        metavar="FILE",
        help="analyse the texts of FILE instead of --data: one text per line (blank lines skipped), or a .jsonl "
        "file with one JSON object per line whose --field holds the text",
    )
    p.add_argument(
        "--dataset",
        default=None,
        metavar="NAME",
        help="analyse the --field column of the --split split of a Hugging Face dataset instead of --data: a Hub id "
        "(through the datasets package, where the Hub is reachable or cached) or a local CSV/TSV/JSON Lines/Parquet "
        "file or directory in the Hub's layout",
    )
    p.add_argument("--dataset-config", default=None, metavar="NAME", help="the configuration of --dataset, if any")
    p.add_argument(
        "--field", default="text", help="the field holding the text in a .jsonl --texts file or a --dataset (text)"
    )
    p.add_argument(
        "--limit",
        type=_count,
        default=0,
        help="analyse only the first N texts (unique sentences of --data, lines of --texts; 0 = all)",
    )
    p.add_argument("--max-texts", dest="limit", type=_count, default=0, help="the same as --limit")
    p.add_argument(
        "--tokens-per-text",
        type=_count,
        default=0,
        help="count only the first N content tokens of each text in the corpus measures (IsoScore, anisotropy, "
        "...); 0 (default) = all of them, streamed",
    )
    p.add_argument(
        "--twonn-tokens",
        type=_count,
        default=2000,
        help="content tokens sampled uniformly from the whole corpus for the TwoNN intrinsic dimension per layer "
        "(default 2000; 0 = no TwoNN)",
    )
    p.add_argument(
        "--attention-sinks",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mean attention to the first token (α₁) and Sink_0.3 per layer, from the attention probabilities "
        "(default: for causal LMs)",
    )
    p.add_argument("--out", default="outputs/analyze", help="directory for figures (default outputs/analyze)")
    p.add_argument(
        "--report", default=None, metavar="PATH", help="also write one self-contained HTML page of it all to PATH"
    )
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser(
        "sts",
        help="unsupervised STS with post-hoc transforms (whitening, flow, SoftDecay, ...)",
        description="Embed both sides of every pair of every set (each distinct sentence once), fit "
        "each transform on all 2N embeddings of a set (SoftDecay: on each side's [N, d] matrix, with "
        "one alpha for all sets, chosen on --alpha-data), score pairs by cosine. Prints Spearman x100 "
        "with a row per transform and a column per set plus their average (the SoftDecay paper's "
        "Table 1), then per set Spearman and Pearson x100 and the isotropy of the transformed "
        "embeddings (TokenUni, RBF_dis, EV_1, IsoScore, LSDS against the raw embeddings: Figure 4).",
    )
    _add_model_options(p)
    p.add_argument(
        "--data",
        type=_csv,
        default=["stsb"],
        help=f"comma-separated STS sets (default stsb): {STS_SETS_HELP}; e.g. "
        "stsb,sts12,sts13,sts14,sts15,sts16,sickr for the SoftDecay paper's Table 1",
    )
    p.add_argument("--split", default="test", help="split of the --data sets that name none (default test)")
    _add_data_dir(p)
    p.add_argument("--limit", type=_count, default=0, help="use only the first N pairs of each set (0 = all)")
    p.add_argument(
        "--pooling",
        default="mean",
        choices=POOLINGS,
        help="sentence pooling (default mean)",
    )
    p.add_argument(
        "--methods",
        type=_csv,
        default=list(METHODS),
        help=f"comma-separated transforms, default all: {','.join(METHODS)}",
    )
    p.add_argument(
        "--alpha",
        default="search",
        help="SoftDecay alpha < 0, or 'search' (best of -0.2..-1.0 on --alpha-data; default)",
    )
    p.add_argument(
        "--alpha-data",
        default="stsb:validation",
        help="NAME:SPLIT of the set on which alpha is searched (default stsb:validation, as the paper)",
    )
    p.add_argument("--whiten-k", type=_positive, default=None, help="whitening: keep k dimensions (default all)")
    p.add_argument("--abtt-d", type=_count, default=None, help="all-but-the-top: D directions (default ceil(d/100))")
    p.add_argument(
        "--abtt-mode",
        default="centered",
        choices=("centered", "raw"),
        help="all-but-the-top: project the centered (eq. 11) or the raw vectors (Mu & Viswanath)",
    )
    p.add_argument("--flow-steps", type=_positive, default=300, help="flow: maximum-likelihood steps (default 300)")
    p.add_argument("--seed", type=_count, default=0, help="flow initialisation and batch seed")
    p.add_argument("--no-isotropy", action="store_true", help="skip the isotropy columns")
    p.set_defaults(func=cmd_sts)

    p = sub.add_parser(
        "wordsim",
        help="word similarity on the input embedding matrix (too-much-in-common §5)",
        description="Score word pairs by cosine or inner product of their rows of the input "
        "embedding matrix, raw and post-processed; pairs with a word split into several tokens "
        "are skipped.",
    )
    _add_model_options(p)
    p.add_argument(
        "--data",
        type=_csv,
        default=["ws353", "simlex999", "men", "rw"],
        help="comma-separated sets: ws353, ws353_sim, ws353_rel, simlex999, men, rw, mturk287, rg65 "
        "(default ws353,simlex999,men,rw)",
    )
    p.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH",
        help="your own word-pair file ('word1 word2 score', tab or space separated; repeatable)",
    )
    p.add_argument(
        "--methods",
        type=_csv,
        default=list(EMBEDDING_METHODS),
        help=f"comma-separated post-processing, default all: {','.join(EMBEDDING_METHODS)}",
    )
    p.add_argument(
        "--similarity", type=_csv, default=list(SIMILARITIES), help="comma-separated: cosine, inner (default both)"
    )
    p.set_defaults(func=cmd_wordsim)
    p = sub.add_parser(
        "export",
        help="write a fine-tuning run as a Hugging Face folder (encoder, classification head, tokenizer)",
        description="Write the newest checkpoint of an isojax finetune run as a Hugging Face folder: config.json, "
        "model.safetensors (BertForSequenceClassification / AlbertForSequenceClassification names where the "
        "architecture has them), the tokenizer, and isojax_extra.safetensors with what only isojax runs "
        '(SoftDecay, flow, IsoBN, Isotropy Layer), described under config.json\'s "isojax" key. Prints what '
        "transformers' class leaves out.",
    )
    p.add_argument("run", metavar="RUN_DIR", help="the run's output directory (--out of isojax finetune)")
    p.add_argument("out", metavar="OUT_DIR", help="the folder to write")
    p.set_defaults(func=cmd_export)
    sub.add_parser(  # listed here; its own arguments are parsed by tyro (isojax.train.cli)
        "finetune",
        add_help=False,
        help="fine-tune on a GLUE task or a sequence-to-sequence task with an isotropy method (SoftDecay, "
        "regularisers, IsoBN, Isotropy Layer, flow); mesh or pmap, checkpoints, resume (isojax finetune --help)",
    )
    return parser


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are the one line ``PROG: error: MESSAGE`` (exit status 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def environment_fault(error: BaseException) -> OSError | None:
    """The fault of the machine behind ``error``, or None: the first exception in its chain of causes (``error``
    itself, its ``__cause__`` or unsuppressed ``__context__``, ...; ``raise ... from None`` ends the chain) that is
    an ``OSError`` with an errno of :data:`ENVIRONMENT_ERRNOS` (or a tensorstore error naming one as
    ``[os_error_code='28']``), a :class:`~isojax._files.DirectoryInUse` or a ``TimeoutError`` (processes that did not
    connect).

    Examples:
      >>> try:
      ...     try:
      ...         raise OSError(errno.ENOSPC, "No space left on device")
      ...     except OSError as e:
      ...         raise RuntimeError("checkpoint step 4 failed") from e
      ... except RuntimeError as e:
      ...     environment_fault(e)
      OSError(28, 'No space left on device')
      >>> environment_fault(FileNotFoundError(errno.ENOENT, "No such file")) is None  # a mistake of the command
      True
    """
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, DirectoryInUse | TimeoutError):
            return cause
        if isinstance(cause, OSError) and cause.errno in ENVIRONMENT_ERRNOS:
            return cause
        code = re.search(r"\[os_error_code='(\d+)'\]", str(cause))  # how tensorstore (orbax's writer) says it
        if code and int(code[1]) in ENVIRONMENT_ERRNOS:
            return OSError(int(code[1]), str(cause))
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return None


def _quiet_background_reports() -> Callable[[], None]:
    """Make a failure without ``-v`` print the command's one line only, not the reports of orbax's writes still in
    flight when the failure stopped the run: its writer threads' tracebacks (logged through absl, whose records below
    ``CRITICAL`` show only with ``-v``), asyncio's "exception was never retrieved" for their futures, "coroutine ...
    was never awaited" and "Event loop is closed". Returns the function that undoes the setting; :func:`main` leaves
    it in place after a failure it reports, since those writes end, and report, as the process ends."""

    def drop_background(record: logging.LogRecord) -> bool:
        if record.name == "asyncio":
            return "exception was never retrieved" not in record.getMessage()
        return record.name != "absl" or record.levelno >= logging.CRITICAL

    def unraisable(report) -> None:
        if not (isinstance(report.exc_value, RuntimeError) and str(report.exc_value) == "Event loop is closed"):
            default(report)

    def undo() -> None:
        sys.unraisablehook = default
        kept_warnings.__exit__(None, None, None)
        for handler in handlers:
            handler.removeFilter(drop_background)

    default, handlers, kept_warnings = sys.unraisablehook, logging.getLogger().handlers, warnings.catch_warnings()
    for handler in handlers:
        handler.addFilter(drop_background)
    sys.unraisablehook = unraisable
    kept_warnings.__enter__()
    warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
    return undo


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    head = argv[: argv.index("finetune")] if "finetune" in argv else None
    if head is not None and all(a in ("-v", "--verbose") for a in head):
        command, verbose = "finetune", bool(head)
        rest = argv[len(head) + 1 :]
        run = lambda: cmd_finetune(rest)  # noqa: E731 - tyro parses finetune's arguments
    else:
        args = parser.parse_args(argv)
        command, verbose = args.command, args.verbose
        run = lambda: args.func(args)  # noqa: E731
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s")
    undo_quiet = (lambda: None) if verbose else _quiet_background_reports()
    try:
        status = run()
    except TrainingStopped as e:
        print(f"{parser.prog} {command}: {e}", file=sys.stderr)
        return 128 + e.signum
    except Exception as e:
        fault = environment_fault(e)
        if verbose or not (fault or isinstance(e, (ValueError, TypeError, OSError, FloatingPointError))):
            undo_quiet()
            raise
        print(f"{parser.prog} {command}: error: {fault or e}", file=sys.stderr)
        return EXIT_ENVIRONMENT if fault else EXIT_NONFINITE if isinstance(e, FloatingPointError) else 2
    undo_quiet()
    return status


def console() -> int:
    """The ``isojax`` program (and ``python -m isojax.cli``): :func:`main`, glibc's ``malloc`` first set to reuse freed
    memory, before JAX starts (:func:`isojax.host.reuse_freed_memory`; a process-wide setting, so not made by
    :func:`main`, which tests and notebooks call in their own process)."""
    reuse_freed_memory()
    return main()


if __name__ == "__main__":
    sys.exit(console())
