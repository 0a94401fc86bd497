"""SemEval STS 2012-2016 and SICK 2014 readers: small release folders written here, compared with the same rows in
MTEB's Hub layout read through ``datasets``; malformed files; and the real files in ../shared/data against the
counts of its README and an independent pandas reading."""

import gzip
import json
import logging
import re

import numpy as np
import pandas as pd
import pytest

from isojax.data import load_sts, read_sick, read_sts_release
from isojax.data.sts import STS_SETS

pytestmark = pytest.mark.usefixtures("datasets_cache")

# (sentence1, sentence2, gold score or None = unscored): quotes, a trailing space, a non-breaking space.
ROWS = [
    ('He said "no', 'She said "yes"', 4.25),
    ("unscored pair", "no gold", None),
    ("A man plays a guitar. ", "A man is playing guitar.", 4.8),
    ("'Single' quotes", "a\u00a0b", 0.0),
    ("Two", "lines", 2.6),
]


def _write_year(folder, subsets, *, prefix="STS", sources=False):
    """A release folder: sub-corpus k holds ROWS rotated by k; returns the rows of each sub-corpus."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for k, name in enumerate(subsets):
        rows = ROWS[k % len(ROWS) :] + ROWS[: k % len(ROWS)]
        extra = "\tsource a\tsource b" if sources else ""
        (folder / f"{prefix}.input.{name}.txt").write_text(
            "".join(f"{a}\t{b}{extra}\n" for a, b, _ in rows), encoding="utf-8"
        )
        (folder / f"{prefix}.gs.{name}.txt").write_text(
            "".join(f"{'' if s is None else s}\n" for *_, s in rows), encoding="utf-8"
        )
        written[name] = rows
    return written


def _write_mteb(folder, rows, split="test"):
    """Scored pairs as MTEB's Hub copies hold them: {split}.jsonl.gz with sentence1, sentence2, score."""
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / f"{split}.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(
            json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in rows if s is not None
        )
    return folder


def _same(a, b):
    assert a.sentences1 == b.sentences1 and a.sentences2 == b.sentences2
    np.testing.assert_array_equal(a.scores, b.scores)
    assert a.scores.dtype == b.scores.dtype == np.float64


@pytest.mark.parametrize(
    "year,prefix,sources", [("sts12", "STS", False), ("sts14", "STS", False), ("sts16", "STS2016", True)]
)
def test_release_folder_agrees_with_mteb_layout_read_by_datasets(tmp_path, caplog, year, prefix, sources):
    folder = tmp_path / "data" / "sts" / year.upper()
    written = _write_year(folder, STS_SETS[year].subsets, prefix=prefix, sources=sources)
    (folder / f"{prefix}.gs.ALL.txt").write_text("1.0\n", encoding="utf-8")  # a gold file without its input
    with caplog.at_level(logging.INFO, logger="isojax.data.semeval"):
        ours = load_sts(year, data_dir=tmp_path / "data")
    assert f"{prefix}.gs.ALL.txt: skipped, no input file {prefix}.input.ALL.txt" in caplog.text
    hub = load_sts(year, source=_write_mteb(tmp_path / "mteb", [r for rows in written.values() for r in rows]))
    _same(ours, hub)
    assert ours.name == year and ours.split == "test" and len(ours) == 4 * len(written)

    name = STS_SETS[year].subsets[1]
    one = load_sts(f"{year.upper()}/{name.upper()}", data_dir=tmp_path / "data")  # names ignore case
    _same(one, load_sts(year, source=_write_mteb(tmp_path / name, written[name])))
    assert one.name == f"{year}/{name}"
    s1, s2, scores = read_sts_release(folder)  # every sub-corpus with both files, in name order
    assert len(s1) == len(s2) == len(scores) == len(ours) and sorted(s1) == sorted(ours.sentences1)


def test_sick_splits_agree_with_mteb_layout(tmp_path):
    folder = tmp_path / "data" / "sick"
    folder.mkdir(parents=True)
    header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"
    rows = {
        "train": [("A dog runs", "A dog is running", 4.9), ('A "quoted" man', "A woman", 1.2)],
        "trial": [("Kids play", "Children are playing", 4.5)],
        "test": [("A cat", "The cat sleeps", 3.1), ("Noon", "Night", 1.0)],
    }
    files = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
    for split, pairs in rows.items():
        lines = [header] + [f"{i}\t{a}\t{b}\t{s}\tNEUTRAL" for i, (a, b, s) in enumerate(pairs, 1)]
        end = "\r\n" if split == "test" else "\n"  # the released test file has Windows line ends
        (folder / files[split]).write_bytes((end.join(lines) + end).encode("utf-8"))
    everything = rows["train"] + rows["trial"] + rows["test"]
    _same(
        load_sts("sickr", "all", data_dir=tmp_path / "data"),
        load_sts("sick-r", "all", source=_write_mteb(tmp_path / "mteb", everything)),
    )
    for split, pairs in rows.items():
        _same(
            load_sts("sickr", split, data_dir=tmp_path / "data"),
            load_sts("sickr", "all", source=_write_mteb(tmp_path / split, pairs)),
        )
    assert read_sick(folder, "test")[0] == ["A cat", "Noon"]


@pytest.fixture
def year12(tmp_path):
    """A valid STS12 folder in a data directory; tests break one file."""
    folder = tmp_path / "sts" / "STS12"
    _write_year(folder, STS_SETS["sts12"].subsets)
    return folder


@pytest.mark.parametrize(
    "name,content,message",
    [
        (
            "STS.input.MSRvid.txt",
            "a\tb\nonly one column\nc\td\nx\ty\nz\tw\n",
            r"STS.input.MSRvid.txt: line 2: expected 2 or 4 tab-separated fields",
        ),
        (
            "STS.gs.MSRvid.txt",
            "4\n\nfive\n1\n2\n",
            r"STS.gs.MSRvid.txt: line 3: column 'score' must be a finite number",
        ),
        (
            "STS.gs.MSRvid.txt",
            "4\n\n5.5\n1\n2\n",
            r"STS.gs.MSRvid.txt: line 3: column 'score' must lie in \[0.0, 5.0\]",
        ),
        (
            "STS.gs.MSRvid.txt",
            "4\n\n3\n1\n",
            r"STS.gs.MSRvid.txt: 4 lines, but its input file .*STS.input.MSRvid.txt "
            r"has 5",
        ),
        ("STS.gs.MSRvid.txt", "4\n\n3\n1\n2\n\n", r"STS.gs.MSRvid.txt: 6 lines, but its input file"),
    ],
)
def test_malformed_release_files_name_file_and_line(year12, name, content, message):
    (year12 / name).write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(str(year12)) + "/" + message):
        load_sts("sts12", data_dir=year12.parent.parent)


def test_missing_files_and_bad_names(year12, tmp_path):
    data_dir = year12.parent.parent
    (year12 / "STS.input.surprise.OnWN.txt").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(f"{year12}/STS.input.surprise.OnWN.txt: not found; sub-corpus 'surprise.OnWN' needs"),
    ):
        load_sts("sts12", data_dir=data_dir)
    assert len(load_sts("sts12/MSRpar", data_dir=data_dir)) == 4  # the other sub-corpora still read
    for f in year12.iterdir():
        f.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(f"{year12}: no SemEval STS gold files")):
        load_sts("sts12", data_dir=data_dir)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{data_dir / 'sts/STS13'}: not found; the data directory")):
        load_sts("sts13", data_dir=data_dir)
    with pytest.raises(FileNotFoundError, match=re.escape(f"data_dir: {tmp_path / 'nowhere'} is not a directory")):
        load_sts("sts13", data_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"name: unknown STS data set 'sts17'"):
        load_sts("sts17", data_dir=data_dir)
    with pytest.raises(ValueError, match=r"name: sts12 has sub-corpora \['MSRpar', .*got 'SMT'"):
        load_sts("sts12/SMT", data_dir=data_dir)
    with pytest.raises(
        ValueError,
        match=r"split: the original release of sts12 has splits \['test'\]; 'train' is "
        r"read from the Hub \(mteb/sts12-sts\)",
    ):
        load_sts("sts12", "train", data_dir=data_dir)
    with pytest.raises(ValueError, match=r"split: sickr has splits \['train', 'trial', 'test', 'all'\], got 'dev'"):
        load_sts("sickr", "dev", data_dir=data_dir)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{data_dir / 'sick'}: not found")):
        load_sts("sickr", data_dir=data_dir)


def test_sick_bad_score_names_file_and_line(tmp_path):
    (tmp_path / "sick").mkdir()
    lines = [
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment",
        "1\ta\tb\t4.5\tNEUTRAL",
        "2\tc\td\t0.5\tNEUTRAL",
    ]
    (tmp_path / "sick" / "SICK_trial.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{tmp_path / 'sick' / 'SICK_trial.txt'}: line 3: column "
            "'relatedness_score' must lie in [1.0, 5.0], got '0.5'"
        ),
    ):
        load_sts("sickr", "trial", data_dir=tmp_path)


# The real files: counts from ../shared/data/README.md ("Scored pairs", sick/ and its manifest).
YEARS = {"sts12": 3108, "sts13": 1500, "sts14": 3750, "sts15": 3000, "sts16": 1186}
SICK = {"train": 4500, "trial": 500, "test": 4927, "all": 9927}


@pytest.mark.parametrize("year", sorted(YEARS))
def test_real_years_match_readme_and_pandas(shared_data_dir, year):
    data = load_sts(year, data_dir=shared_data_dir)
    assert len(data) == YEARS[year]
    folder = shared_data_dir / "sts" / year.upper()
    s1, s2, scores = [], [], []
    for name in STS_SETS[year].subsets:  # independent reading: pandas without quoting, blank gold = unscored
        inputs = pd.read_csv(
            next(folder.glob(f"STS*.input.{name}.txt")),
            sep="\t",
            quoting=3,
            header=None,
            dtype=str,
            keep_default_na=False,
        )
        gold = next(folder.glob(f"STS*.gs.{name}.txt")).read_text(encoding="utf-8").split("\n")[: len(inputs)]
        keep = [i for i, g in enumerate(gold) if g.strip()]
        s1 += list(inputs[0].iloc[keep])
        s2 += list(inputs[1].iloc[keep])
        scores += [float(gold[i]) for i in keep]
        assert len(load_sts(f"{year}/{name}", data_dir=shared_data_dir)) == len(keep)
    assert data.sentences1 == s1 and data.sentences2 == s2
    np.testing.assert_array_equal(data.scores, scores)


def test_real_sick_matches_readme_and_pandas(shared_data_dir):
    files = ["SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"]
    frames = [
        pd.read_csv(shared_data_dir / "sick" / f, sep="\t", quoting=3, dtype=str, keep_default_na=False) for f in files
    ]
    for split, frame in zip(["train", "trial", "test", "all"], [*frames, pd.concat(frames)]):
        data = load_sts("sickr", split, data_dir=shared_data_dir)
        assert len(data) == SICK[split] == len(frame)
        assert data.sentences1 == list(frame["sentence_A"]) and data.sentences2 == list(frame["sentence_B"])
        np.testing.assert_array_equal(data.scores, frame["relatedness_score"].astype(float))
