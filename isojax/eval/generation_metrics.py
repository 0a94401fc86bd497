"""BLEU (sacrebleu) and ROUGE (rouge-score) of generated texts against references, x100 as the papers report them.

Both packages are the references; this module fixes how they are called:

* :func:`bleu` — sacrebleu's BLEU (Papineni et al. 2002; Post 2018). ``level="corpus"``: one score from the
  n-gram counts of the whole corpus (``sacrebleu.corpus_bleu``, what WMT and isotropy-calibration-evaluation
  Table 2 report); ``level="sentence"``: the mean of per-sentence BLEU with sacrebleu's sentence-level settings
  (``effective_order=True``, exponential smoothing). Tokenisation ``"13a"`` (sacrebleu's and WMT's default),
  case-sensitive unless ``lowercase``. sacrebleu already reports x100.
* :func:`rouge` — rouge-score's ROUGE-N and ROUGE-L F-measure (Lin 2004), Porter stemming on (as rouge-score's
  and Hugging Face's summarisation scripts use it), averaged over the examples and x100
  (isotropy-calibration-evaluation Tables 3 and 5 report R-1, R-2, R-L). ``rougeL`` is the sentence-level
  longest common subsequence (rouge-score's ``rougeL``; ``rougeLsum`` splits summaries at newlines first).
  rouge-score's tokeniser keeps only ``[a-z0-9]`` after lowercasing (English text).

``references[i]`` is the reference of hypothesis ``i``, or a list of its references (BLEU: every hypothesis the
same number; ROUGE: the best-scoring reference counts, rouge-score's ``score_multi``).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["BLEU_LEVELS", "ROUGE_TYPES", "bleu", "generation_metrics", "rouge"]

BLEU_LEVELS = ("corpus", "sentence")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def _check(hypotheses, references) -> tuple[list[str], list[list[str]]]:
    """Hypotheses as a list of str and references as one list of references per hypothesis."""
    if isinstance(hypotheses, str) or not isinstance(hypotheses, Sequence):
        raise TypeError(f"hypotheses must be a sequence of strings, got {type(hypotheses).__name__}")
    if isinstance(references, str) or not isinstance(references, Sequence):
        raise TypeError(
            f"references must be a sequence of strings (or of lists of strings), got {type(references).__name__}"
        )
    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses ({len(hypotheses)}) and references ({len(references)}) must have the same length")
    if not hypotheses:
        raise ValueError("hypotheses must hold at least one text")
    refs = [[r] if isinstance(r, str) else list(r) for r in references]
    for i, (h, rs) in enumerate(zip(hypotheses, refs)):
        if not isinstance(h, str):
            raise TypeError(f"hypotheses[{i}] must be a string, got {type(h).__name__}")
        if not rs or not all(isinstance(r, str) for r in rs):
            raise TypeError(f"references[{i}] must be a string or a non-empty list of strings, got {references[i]!r}")
    return list(hypotheses), refs


def bleu(hypotheses, references, *, level: str = "corpus", tokenize: str = "13a", lowercase: bool = False) -> float:
    """BLEU x100 of ``hypotheses [N]`` against ``references [N]`` (module docstring), computed by sacrebleu.

    Args:
      hypotheses: ``N`` generated texts.
      references: ``N`` references, each a string or a list of strings (the same number for every hypothesis).
      level: ``"corpus"`` (one score of the pooled n-gram counts) or ``"sentence"`` (the mean of sentence BLEU with
        effective order); see :data:`BLEU_LEVELS`.
      tokenize: sacrebleu's tokenizer (``"13a"``, WMT's).
      lowercase: compare lowercased texts.

    Returns:
      A float in [0, 100].

    Examples:
      Against "the cat sat on a mat", "the cat sat on the mat" matches 5/6 unigrams, 3/5 bigrams, 2/4 trigrams and
      1/3 four-grams, and has the reference's length (no brevity penalty): BLEU = 100 (1/12)^(1/4):

      >>> round(bleu(["the cat sat on the mat"], ["the cat sat on a mat"]), 4), round(100 * (1 / 12) ** 0.25, 4)
      (53.7285, 53.7285)
    """
    from sacrebleu.metrics import BLEU

    hypotheses, refs = _check(hypotheses, references)
    if level not in BLEU_LEVELS:
        raise ValueError(f"level must be one of {BLEU_LEVELS}, got {level!r}")
    counts = {len(r) for r in refs}
    if len(counts) != 1:
        raise ValueError(f"references: BLEU needs the same number of references for every hypothesis, got {counts}")
    if level == "corpus":
        streams = [list(stream) for stream in zip(*refs)]  # sacrebleu: one list per reference "stream"
        return float(BLEU(tokenize=tokenize, lowercase=lowercase).corpus_score(hypotheses, streams).score)
    metric = BLEU(tokenize=tokenize, lowercase=lowercase, effective_order=True)
    return float(sum(metric.sentence_score(h, r).score for h, r in zip(hypotheses, refs)) / len(hypotheses))


def rouge(
    hypotheses, references, *, types: Sequence[str] = ("rouge1", "rouge2", "rougeL"), use_stemmer: bool = True
) -> dict[str, float]:
    """Mean ROUGE F-measure x100 of each of ``types`` (module docstring), computed by rouge-score.

    Args:
      hypotheses: ``N`` generated texts.
      references: ``N`` references, each a string or a list of strings (the best-scoring one counts).
      types: some of :data:`ROUGE_TYPES`.
      use_stemmer: Porter-stem the words before matching.

    Returns:
      ``{type: mean F-measure x100}``.

    Examples:
      "the cat sat" against "the cat ran": 2 of 3 words, 1 of 2 bigrams, a longest common subsequence of 2 words:

      >>> {k: round(v, 2) for k, v in rouge(["the cat sat"], ["the cat ran"]).items()}
      {'rouge1': 66.67, 'rouge2': 50.0, 'rougeL': 66.67}
    """
    from rouge_score import rouge_scorer

    hypotheses, refs = _check(hypotheses, references)
    unknown = sorted(set(types) - set(ROUGE_TYPES))
    if unknown or not types:
        raise ValueError(f"types must be some of {ROUGE_TYPES}, got {list(types)}")
    scorer = rouge_scorer.RougeScorer(list(types), use_stemmer=use_stemmer)
    totals = dict.fromkeys(types, 0.0)
    for h, rs in zip(hypotheses, refs):
        scores = scorer.score_multi(rs, h)
        for t in types:
            totals[t] += scores[t].fmeasure
    return {t: 100 * total / len(hypotheses) for t, total in totals.items()}


def generation_metrics(names: Sequence[str], hypotheses, references) -> dict[str, float]:
    """The metrics ``names`` (``bleu`` — corpus BLEU — and ROUGE types) of ``hypotheses`` against ``references``.

    Args:
      names: metric names, ``"bleu"`` and/or ROUGE types; an unknown one is a ``ValueError``.
      hypotheses: ``N`` generated texts, as for :func:`bleu` and :func:`rouge`.
      references: ``N`` references, each a string or a list of strings, as for :func:`bleu` (the same number for
        every hypothesis) and :func:`rouge` (the best-scoring one counts).

    Returns:
      ``{name: score x100}``.

    Examples:
      An exact copy scores 100 on both:

      >>> scores = generation_metrics(["bleu", "rouge2"], ["the cat sat on the mat"], ["the cat sat on the mat"])
      >>> {k: round(v, 6) for k, v in scores.items()}
      {'bleu': 100.0, 'rouge2': 100.0}
    """
    unknown = sorted(set(names) - {"bleu", *ROUGE_TYPES})
    if unknown:
        raise ValueError(f"unknown generation metric(s) {unknown}; expected some of {['bleu', *ROUGE_TYPES]}")
    out = {"bleu": bleu(hypotheses, references)} if "bleu" in names else {}
    types = [n for n in names if n != "bleu"]
    return {**out, **(rouge(hypotheses, references, types=types) if types else {})}
