"""Word-similarity benchmarks: word pairs with human similarity (or relatedness) ratings.

Known sets, read from the offline assets (``python -m isojax.data.assets``):

==============  ===================================================  =====  ========
name            data set                                             pairs  scale
==============  ===================================================  =====  ========
``ws353``       WordSim-353 (Finkelstein et al., 2002)               353    0–10
``ws353_sim``   WordSim-353 similarity split (Agirre et al., 2009)   203    0–10
``ws353_rel``   WordSim-353 relatedness split                        252    0–10
``simlex999``   SimLex-999 (Hill et al., 2015)                       999    0–10
``men``         MEN (Bruni et al., 2014)                             3000   0–50
``rw``          Stanford Rare Words (Luong et al., 2013)             2034   0–10
``mturk287``    MTurk-287 (Radinsky et al., 2011)                    287    1–5
``rg65``        Rubenstein & Goodenough (1965)                       65     0–4
==============  ===================================================  =====  ========

Any other file in the same plain format is read with :func:`read_word_pairs`. Scores keep the
data set's own scale (Spearman correlation does not depend on it); words keep their case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from isojax.data.utf8 import utf8_lines

__all__ = ["WORDSIM_SETS", "WordSimData", "load_wordsim", "read_word_pairs"]


@dataclass(frozen=True)
class WordSimData:
    """Word pairs ``pairs[i] = (word1, word2)`` with human ratings ``scores[i]``.

    Attributes:
      pairs: the ``n`` word pairs.
      scores: ``[n]`` float64 ratings.
      name: the set's name (a key of :data:`WORDSIM_SETS`, or the file's stem).
    """

    pairs: list[tuple[str, str]]
    scores: np.ndarray
    name: str

    def __len__(self) -> int:
        return len(self.pairs)


# name -> (file in the asset cache, score range)
WORDSIM_SETS: dict[str, tuple[str, tuple[float, float]]] = {
    "ws353": ("wordsim/wordsim353.tsv", (0.0, 10.0)),
    "ws353_sim": ("wordsim/ws353_similarity.txt", (0.0, 10.0)),
    "ws353_rel": ("wordsim/ws353_relatedness.txt", (0.0, 10.0)),
    "simlex999": ("wordsim/simlex999.txt", (0.0, 10.0)),
    "men": ("wordsim/men.txt", (0.0, 50.0)),
    "rw": ("wordsim/rareword.txt", (0.0, 10.0)),
    "mturk287": ("wordsim/mturk.txt", (1.0, 5.0)),
    "rg65": ("wordsim/rg65.txt", (0.0, 4.0)),
}


def read_word_pairs(path, *, score_range: tuple[float, float] | None = None, name: str | None = None) -> WordSimData:
    r"""Read a ``word1 word2 score`` file.

    One pair per line; fields separated by tabs when the line has a tab (so a tab-separated word may
    contain spaces), else by runs of spaces. Blank lines and lines starting with ``#`` are skipped.
    Each line must have exactly three fields and a finite score, within ``score_range`` when given;
    otherwise ``ValueError`` names the file and 1-based line, as it does for text that is not UTF-8.

    Args:
      path: the file.
      score_range: ``(low, high)`` bounds of the scores, or None.
      name: the set's name (None: the file's stem).

    Returns:
      A :class:`WordSimData`.

    Examples:
      >>> import tempfile, pathlib
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "mine.txt"
      >>> _ = path.write_text("# word1 word2 score\ntiger  cat 7.35\nice cream\tdessert\t8\n")
      >>> data = read_word_pairs(path, score_range=(0, 10))
      >>> data.pairs, data.scores, data.name
      ([('tiger', 'cat'), ('ice cream', 'dessert')], array([7.35, 8.  ]), 'mine')
    """
    path = Path(path)
    pairs, scores = [], []
    for lineno, line in enumerate(utf8_lines(path), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split("\t")] if "\t" in line else line.split()
        where = f"{path}: line {lineno}"
        if len(fields) != 3 or not all(fields):
            raise ValueError(
                f"{where}: expected 3 fields 'word1 word2 score' (tab or space separated), got {len(fields)}: {line!r}"
            )
        try:
            score = float(fields[2])
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise ValueError(f"{where}: score (field 3) must be a finite number, got {fields[2]!r}")
        if score_range is not None and not score_range[0] <= score <= score_range[1]:
            raise ValueError(
                f"{where}: score (field 3) must lie in [{score_range[0]}, {score_range[1]}], got {fields[2]!r}"
            )
        pairs.append((fields[0], fields[1]))
        scores.append(score)
    if not pairs:
        raise ValueError(f"{path}: no word pairs found")
    return WordSimData(pairs, np.asarray(scores, np.float64), name or path.stem)


def load_wordsim(name, *, cache_dir=None) -> WordSimData:
    """A known set by name (see :data:`WORDSIM_SETS`, case-insensitive) or a user file path.

    Args:
      name: a key of :data:`WORDSIM_SETS` or the path of a ``word1 word2 score`` file (see :func:`read_word_pairs`).
      cache_dir: where the offline asset files are (None: the default asset cache).

    Returns:
      A :class:`WordSimData`.

    Examples:
      SimLex-999 holds 999 pairs rated in [0, 10]:

      >>> simlex = load_wordsim("SimLex999")
      >>> len(simlex), simlex.name, bool(0 <= simlex.scores.min() and simlex.scores.max() <= 10)
      (999, 'simlex999', True)
    """
    from isojax.data.assets import asset_path  # not at the top: see isojax.data.sts._package

    key = str(name).lower()
    if key in WORDSIM_SETS:
        relative, score_range = WORDSIM_SETS[key]
        return read_word_pairs(asset_path(relative, cache_dir), score_range=score_range, name=key)
    if Path(name).is_file():
        return read_word_pairs(name)
    raise ValueError(
        f"name: {name!r} is neither a known word-similarity set {sorted(WORDSIM_SETS)} "
        "nor an existing file of 'word1 word2 score' lines"
    )
