"""Readers of the original SemEval releases: the STS 2012–2016 test folders and SICK 2014.

**STS 2012–2016** (one folder per year). Each sub-corpus ``<name>`` is a pair of files:
``STS.input.<name>.txt`` (tab-separated ``sentence1, sentence2``; STS16 names its files
``STS2016.input.<name>.txt`` and adds two source columns) and ``STS.gs.<name>.txt`` (one gold score in
[0, 5] per line, aligned with the input; an empty line marks an unscored pair, which is skipped and counted
in the log). A gold file without its input file (STS12's ``STS.gs.ALL.txt``, the concatenation of the others;
STS13's ``SMT``, whose text was never redistributed) is skipped with a logged note. A year pools the pairs of
all its sub-corpora (the MTEB and SentEval "all" convention).

**SICK 2014** (SemEval-2014 task 1): ``SICK_train.txt`` (4500 pairs), ``SICK_trial.txt`` (500),
``SICK_test_annotated.txt`` (4927), tab-separated with a header ``pair_ID, sentence_A, sentence_B,
relatedness_score, entailment_judgment``; relatedness lies in [1, 5].

Sentences are kept verbatim. A malformed file (a line with the wrong number of fields, a score that is not a
number in the set's range, an empty sentence, text that is not UTF-8) is a ``ValueError`` naming the file and
line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from isojax.data.tables import Table
from isojax.data.tsv import read_tsv
from isojax.data.utf8 import utf8_lines

__all__ = ["SICK_FILES", "read_sick", "read_sts_pair", "read_sts_release", "sts_release_files"]

log = logging.getLogger(__name__)

SICK_FILES = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
_GOLD = re.compile(r"(?P<prefix>STS\w*)\.gs\.(?P<name>.+)\.txt")


def read_sts_pair(input_path, gold_path) -> tuple[list[str], list[str], np.ndarray]:
    r"""One SemEval STS sub-corpus: the scored pairs of an input file and its gold file.

    The input file has ``n`` lines of 2 (or, STS16, 4) tab-separated fields; the gold file has the same
    ``n`` lines, each a score in [0, 5] or empty (unscored: the pair is left out, and the count logged). The
    sentences of a scored pair must hold text.

    Args:
      input_path: the ``STS*.input.<name>.txt`` file.
      gold_path: the ``STS*.gs.<name>.txt`` file.

    Returns:
      ``(sentences1, sentences2, scores)``: two lists of ``n`` texts and ``[n]`` float64 scores.

    Examples:
      >>> import tempfile
      >>> folder = Path(tempfile.mkdtemp())
      >>> _ = (folder / "in.txt").write_text("a\tb\tsrc1\tsrc2\nc\td\n")
      >>> _ = (folder / "gs.txt").write_text("\n2.5\n")
      >>> read_sts_pair(folder / "in.txt", folder / "gs.txt")
      (['c'], ['d'], array([2.5]))
    """
    inputs = read_tsv(input_path, ("sentence1", "sentence2"), extra=("source1", "source2"))
    gold_path = Path(gold_path)
    lines = "".join(utf8_lines(gold_path)).split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    if len(lines) != len(inputs):
        raise ValueError(
            f"{gold_path}: {len(lines)} lines, but its input file {input_path} has {len(inputs)}; "
            "each input line needs one gold line (empty when unscored)"
        )
    scored = [i for i, line in enumerate(lines) if line.strip()]
    if len(scored) < len(lines):
        log.info(
            "%s: %d of %d pairs unscored (empty gold line), left out", gold_path, len(lines) - len(scored), len(lines)
        )
    gold = Table.from_file(str(gold_path), {"score": [lines[i] for i in scored]}, [i + 1 for i in scored])
    scores = gold.number("score", low=0.0, high=5.0)
    inputs = inputs.take(scored)
    return inputs.sentences("sentence1"), inputs.sentences("sentence2"), scores


def sts_release_files(directory) -> dict[str, tuple[Path, Path | None]]:
    """The sub-corpora of a SemEval STS release folder, by name.

    Raises ``FileNotFoundError`` for a missing folder or one without any ``STS*.gs.<name>.txt`` file.

    Args:
      directory: the release folder.

    Returns:
      ``{name: (gold file, input file or None)}``, sorted by file name.

    Examples:
      >>> import tempfile
      >>> folder = Path(tempfile.mkdtemp())
      >>> for name in ("STS2016.gs.news.txt", "STS2016.input.news.txt", "STS.gs.forum.txt"):
      ...     _ = (folder / name).write_text("")
      >>> {name: (gold.name, None if inputs is None else inputs.name)
      ...  for name, (gold, inputs) in sts_release_files(folder).items()}
      {'forum': ('STS.gs.forum.txt', None), 'news': ('STS2016.gs.news.txt', 'STS2016.input.news.txt')}
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such directory (a SemEval STS release folder)")
    found = {}
    for gold in sorted(directory.iterdir()):
        match = _GOLD.fullmatch(gold.name)
        if match and gold.is_file():
            inputs = directory / f"{match['prefix']}.input.{match['name']}.txt"
            found[match["name"]] = (gold, inputs if inputs.is_file() else None)
    if not found:
        raise FileNotFoundError(
            f"{directory}: no SemEval STS gold files (STS.gs.<name>.txt or STS2016.gs.<name>.txt) in this directory"
        )
    return found


def read_sts_release(directory, subsets: Sequence[str] | None = None) -> tuple[list[str], list[str], np.ndarray]:
    r"""The scored pairs of the sub-corpora ``subsets`` of a SemEval STS folder, pooled in that order.

    ``subsets=None`` reads every sub-corpus that has both files, in name order. A gold file without its input
    file is skipped with a logged note; a named sub-corpus that lacks either file is a ``FileNotFoundError``.

    Args:
      directory: the release folder (``STS*.input.<name>.txt`` and ``STS*.gs.<name>.txt`` files).
      subsets: sub-corpus names, or None.

    Returns:
      ``(sentences1, sentences2, scores)``: two lists of ``n`` texts and ``[n]`` float64 scores; unscored pairs (empty
      gold lines) are left out.

    Examples:
      >>> import tempfile, pathlib
      >>> folder = pathlib.Path(tempfile.mkdtemp())
      >>> _ = (folder / "STS.input.news.txt").write_text("a\tb\nc\td\n")
      >>> _ = (folder / "STS.gs.news.txt").write_text("3.5\n\n")
      >>> _ = (folder / "STS.input.forum.txt").write_text("e\tf\n")
      >>> _ = (folder / "STS.gs.forum.txt").write_text("1\n")
      >>> read_sts_release(folder)  # forum before news; news's second pair is unscored
      (['e', 'a'], ['f', 'b'], array([1. , 3.5]))
    """
    found = sts_release_files(directory)
    for gold_file, input_file in found.values():
        if input_file is None:
            log.info("%s: skipped, no input file %s", gold_file, gold_file.name.replace(".gs.", ".input.", 1))
    if subsets is None:
        subsets = [name for name, (_, inputs) in found.items() if inputs is not None]
    s1, s2, scores = [], [], []
    for name in subsets:
        gold, inputs = found.get(name, (None, None))
        if inputs is None:
            missing = f"STS*.gs.{name}.txt" if gold is None else gold.name.replace(".gs.", ".input.", 1)
            raise FileNotFoundError(
                f"{Path(directory) / missing}: not found; sub-corpus {name!r} needs its input and gold files"
            )
        a, b, s = read_sts_pair(inputs, gold)
        s1 += a
        s2 += b
        scores.append(s)
    return s1, s2, np.concatenate(scores)


def read_sick(directory, split: str) -> tuple[list[str], list[str], np.ndarray]:
    r"""SICK 2014 pairs with relatedness scores in [1, 5].

    Args:
      directory: the folder of ``SICK_train.txt``, ``SICK_trial.txt`` and ``SICK_test_annotated.txt``.
      split: ``train`` (4500 pairs), ``trial`` (500), ``test`` (4927, the SentEval convention) or ``all``
        (9927 = train + trial + test in that order, MTEB's SICK-R).

    Returns:
      ``(sentences1, sentences2, scores)``: two lists of ``n`` texts and ``[n]`` float64 relatedness scores.

    Examples:
      >>> import tempfile, pathlib
      >>> folder = pathlib.Path(tempfile.mkdtemp())
      >>> header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
      >>> _ = (folder / "SICK_trial.txt").write_text(header + "1\tA dog runs.\tA dog is running.\t4.9\tENTAILMENT\n")
      >>> read_sick(folder, "trial")
      (['A dog runs.'], ['A dog is running.'], array([4.9]))
    """
    names = list(SICK_FILES) if split == "all" else [split]
    if split != "all" and split not in SICK_FILES:
        raise ValueError(f"split: SICK has splits {[*SICK_FILES, 'all']}, got {split!r}")
    s1, s2, scores = [], [], []
    for name in names:
        table = read_tsv(Path(directory) / SICK_FILES[name])
        s1 += table.sentences("sentence_A")
        s2 += table.sentences("sentence_B")
        scores.append(table.number("relatedness_score", low=1.0, high=5.0))
    return s1, s2, np.concatenate(scores)
