"""GLUE loaders: local files in the nyu-mll/glue layout and column names, STS-B offline, bad config.

References: small Parquet/CSV/JSON Lines files written here from known rows in the Hub's schema
(text columns, ``label``, ``idx``); the STS-B package files re-read with pandas.
"""

import re
import shutil

import numpy as np
import pandas as pd
import pytest
from conftest import require_offline

from isojax.data import GLUE_TASKS, assets, glue_task, load_glue

COLUMNS = {
    "cola": ("sentence",),
    "sst2": ("sentence",),
    "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "stsb": ("sentence1", "sentence2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}
LABELS = {
    "cola": [1, 0, 1],
    "sst2": [0, 1, 1],
    "mrpc": [1, 1, 0],
    "qqp": [0, 0, 1],
    "stsb": [4.2, 0.0, 5.0],
    "mnli": [2, 0, 1],
    "qnli": [1, 0, 0],
    "rte": [0, 1, 0],
    "wnli": [1, 1, 0],
}


pytestmark = pytest.mark.usefixtures("datasets_cache")


def _frame(task, split, labels):
    cols = {c: [f"{task} {split} {c} {i}" for i in range(len(labels))] for c in COLUMNS[task]}
    return pd.DataFrame({**cols, "label": labels, "idx": np.arange(len(labels), dtype=np.int32)})


@pytest.fixture
def glue_dir(tmp_path):
    """A copy of the nyu-mll/glue repository layout: {task}/{split}-00000-of-00001.parquet."""
    root = tmp_path / "glue"
    for task, spec in GLUE_TASKS.items():
        (root / task).mkdir(parents=True)
        for split in spec.splits:
            labels = [-1] * 2 if split.startswith("test") else LABELS[task]
            _frame(task, split, labels).to_parquet(root / task / f"{split}-00000-of-00001.parquet")
    return root


def test_table_covers_the_nine_tasks():
    assert set(GLUE_TASKS) == set(COLUMNS)
    for name, spec in GLUE_TASKS.items():
        assert spec.text_columns == COLUMNS[name]
    assert GLUE_TASKS["stsb"].is_regression and GLUE_TASKS["mnli"].num_labels == 3
    assert GLUE_TASKS["cola"].metrics == ("matthews_corrcoef",)


@pytest.mark.parametrize("task", sorted(COLUMNS))
def test_local_hub_layout_every_task(glue_dir, task):
    spec = GLUE_TASKS[task]
    for split in spec.splits:
        data = load_glue(task, split, source=glue_dir)
        labels = [-1] * 2 if split.startswith("test") else LABELS[task]
        assert len(data) == len(labels) and data.split == split and data.task is spec
        assert data.texts_a == [f"{task} {split} {COLUMNS[task][0]} {i}" for i in range(len(labels))]
        if spec.is_pair:
            assert data.texts_b == [f"{task} {split} {COLUMNS[task][1]} {i}" for i in range(len(labels))]
        else:
            assert data.texts_b is None
        assert data.labels.dtype == (np.float32 if spec.is_regression else np.int32)
        np.testing.assert_allclose(data.labels, labels, rtol=1e-6)


def test_mnli_matched_and_mismatched_stay_apart(glue_dir):
    matched = load_glue("MNLI", "validation_matched", source=glue_dir)
    mismatched = load_glue("mnli", "validation_mismatched", source=glue_dir)
    assert all("validation_matched" in t for t in matched.texts_a)
    assert all("validation_mismatched" in t for t in mismatched.texts_a)
    with pytest.raises(ValueError, match=r"split: GLUE mnli has splits .*'validation_matched'"):
        load_glue("mnli", "validation", source=glue_dir)


def test_missing_task_folder_is_not_filled_from_other_tasks(glue_dir):
    shutil.rmtree(glue_dir / "wnli")  # rte/ and mrpc/ have the same columns; they must not be read instead
    with pytest.raises(FileNotFoundError, match=r"no file for split 'train'"):
        load_glue("wnli", "train", source=glue_dir)
    np.testing.assert_array_equal(load_glue("wnli", source=glue_dir / "rte").labels, LABELS["rte"])  # task dir


def test_single_files_csv_and_jsonl(tmp_path):
    csv = tmp_path / "rte_dev.csv"
    _frame("rte", "validation", [0, 1, 1]).to_csv(csv, index=False)
    data = load_glue("rte", "dev", source=csv)
    assert data.split == "validation" and data.texts_b[2] == "rte validation sentence2 2"
    np.testing.assert_array_equal(data.labels, [0, 1, 1])
    jsonl = tmp_path / "sst2.jsonl"
    _frame("sst2", "train", [1, 0, 0]).to_json(jsonl, orient="records", lines=True)
    np.testing.assert_array_equal(load_glue("SST-2", source=jsonl).labels, [1, 0, 0])


def test_stsb_offline_from_package():
    require_offline()
    cache = assets.fetch(["stsb"])
    df = pd.read_csv(
        cache / "stsb" / "sts-train.csv",
        sep="\t",
        quoting=3,
        header=None,
        names=range(9),
        dtype=str,
        keep_default_na=False,
    )
    data = load_glue("stsb", "train", cache_dir=cache)  # source="auto": Hub unreachable -> package
    assert len(data) == 5749 and data.texts_a == list(df[5]) and data.texts_b == list(df[6])
    np.testing.assert_array_equal(data.labels, df[4].astype(np.float32).to_numpy())
    assert len(load_glue("sts-b", "validation", source="package", cache_dir=cache)) == 1500
    assert len(load_glue("stsb", "test", cache_dir=cache)) == 1379


def test_other_tasks_need_hub_or_local_files():
    require_offline()
    with pytest.raises(ConnectionError, match=r"GLUE qnli .*nyu-mll/glue.*source=<local directory"):
        load_glue("qnli", "train")
    with pytest.raises(ValueError, match="only stsb has an offline package"):
        load_glue("qnli", "train", source="package")


def test_unknown_task_and_split():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "task: unknown GLUE task 'squad'; expected one of "
            "['cola', 'mnli', 'mrpc', 'qnli', 'qqp', 'rte', 'sst2', 'stsb', 'wnli']"
        ),
    ):
        load_glue("squad")
    with pytest.raises(ValueError, match=r"split: GLUE cola has splits \['train', 'validation', 'test'\]"):
        load_glue("cola", "valid")
    assert glue_task("SST-2") is GLUE_TASKS["sst2"] and glue_task("sts_b") is GLUE_TASKS["stsb"]


@pytest.mark.parametrize(
    "task,labels,message",
    [
        ("cola", [1, 2, 0], r"row 2: column 'label' must lie in \[0, 1\], got 2"),
        ("sst2", [1, -1, 0], r"row 2: column 'label' must lie in \[0, 1\], got -1"),  # -1: unlabelled, test only
        ("stsb", [4.0, -1.0, 1.0], r"row 2: column 'label' must lie in \[0.0, 5.0\], got -1.0"),
        ("mnli", [0, 1.5, 2], r"row 2: column 'label' must be an integer, got 1.5"),
        ("stsb", [4.0, 5.5, 1.0], r"row 2: column 'label' must lie in \[0.0, 5.0\]"),
    ],
)
def test_bad_labels_name_file_and_row(tmp_path, task, labels, message):
    path = tmp_path / "train-00000-of-00001.parquet"
    _frame(task, "train", labels).to_parquet(path)
    with pytest.raises(ValueError, match=re.escape(f"{path}: ") + message):
        load_glue(task, "train", source=tmp_path)


def test_missing_column_and_missing_split(tmp_path):
    path = tmp_path / "validation.jsonl"
    _frame("qqp", "validation", [0, 1, 0]).rename(columns={"question2": "q2"}).to_json(
        path, orient="records", lines=True
    )
    with pytest.raises(ValueError, match=re.escape(f"{path}: missing column(s) ['question2']")):
        load_glue("qqp", "validation", source=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no file for split 'train'"):
        load_glue("qqp", "train", source=tmp_path)
    text = tmp_path / "t.jsonl"
    text.write_text('{"sentence": "fine", "label": 1}\n{"sentence": null, "label": 0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{text}: line 2: column 'sentence' must be text, got None")):
        load_glue("cola", source=text)


# GLUE's download-script format, described independently of isojax: the fields of train/dev and of test files,
# the fields holding the Hub's text columns and label, whether labels are written as names (else class ids), and
# the Hub's ClassLabel names in id order. CoLA's train/dev files have no header row.
HUB_CLASSES = {
    "cola": ["unacceptable", "acceptable"],
    "sst2": ["negative", "positive"],
    "mrpc": ["not_equivalent", "equivalent"],
    "qqp": ["not_duplicate", "duplicate"],
    "mnli": ["entailment", "neutral", "contradiction"],
    "qnli": ["entailment", "not_entailment"],
    "rte": ["entailment", "not_entailment"],
    "wnli": ["not_entailment", "entailment"],
}
_MNLI = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
]
HEADERLESS = {"cola"}
SCRIPT = {  # task: (folder, fields of train/dev, fields of test, {hub column: file field}, label field, named)
    "cola": (
        "CoLA",
        ["source", "label", "mark", "sentence"],
        ["index", "sentence"],
        {"sentence": "sentence"},
        "label",
        False,
    ),
    "sst2": ("SST-2", ["sentence", "label"], ["index", "sentence"], {"sentence": "sentence"}, "label", False),
    "mrpc": (
        "MRPC",
        ["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
        ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
        {"sentence1": "#1 String", "sentence2": "#2 String"},
        "\ufeffQuality",
        False,
    ),
    "qqp": (
        "QQP",
        ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
        ["id", "question1", "question2"],
        {"question1": "question1", "question2": "question2"},
        "is_duplicate",
        False,
    ),
    "stsb": (
        "STS-B",
        ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"],
        ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"],
        {"sentence1": "sentence1", "sentence2": "sentence2"},
        "score",
        False,
    ),
    "mnli": (
        "MNLI",
        [*_MNLI, "label1", "gold_label"],
        _MNLI,
        {"premise": "sentence1", "hypothesis": "sentence2"},
        "gold_label",
        True,
    ),
    "qnli": (
        "QNLI",
        ["index", "question", "sentence", "label"],
        ["index", "question", "sentence"],
        {"question": "question", "sentence": "sentence"},
        "label",
        True,
    ),
    "rte": (
        "RTE",
        ["index", "sentence1", "sentence2", "label"],
        ["index", "sentence1", "sentence2"],
        {"sentence1": "sentence1", "sentence2": "sentence2"},
        "label",
        True,
    ),
    "wnli": (
        "WNLI",
        ["index", "sentence1", "sentence2", "label"],
        ["index", "sentence1", "sentence2"],
        {"sentence1": "sentence1", "sentence2": "sentence2"},
        "label",
        False,
    ),
}
FILES = {
    "train": "train.tsv",
    "validation": "dev.tsv",
    "test": "test.tsv",
    "validation_matched": "dev_matched.tsv",
    "validation_mismatched": "dev_mismatched.tsv",
    "test_matched": "test_matched.tsv",
    "test_mismatched": "test_mismatched.tsv",
}


def _script_file(task, split, path, texts, labels):
    """Write ``texts`` ({hub column: values}) and ``labels`` as GLUE's download script lays the file out."""
    _, header, test_header, columns, label, named = SCRIPT[task]
    test = split.startswith("test")
    fields = test_header if test else header
    lines = [] if task in HEADERLESS and not test else ["\t".join(fields)]
    for i in range(len(labels)):
        row = {f: f"{f} {i}" for f in fields}
        row.update({columns[col]: values[i] for col, values in texts.items()})
        if not test:
            row[label] = HUB_CLASSES[task][labels[i]] if named else str(labels[i])
        lines.append("\t".join(row[f] for f in fields))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + ("" if task == "cola" else "\n"), encoding="utf-8")  # CoLA: no final newline


@pytest.mark.parametrize("task", sorted(COLUMNS))
def test_download_script_files_agree_with_hub_layout(tmp_path, task):
    """The same rows as GLUE's TSV files and as the Hub's parquet files (read by ``datasets``) load equal."""
    spec = GLUE_TASKS[task]
    for split in spec.splits:
        labels = [-1, -1] if split.startswith("test") else LABELS[task]
        texts = {c: [f'{task} "{split}" {c} {i}\'s' for i in range(len(labels))] for c in COLUMNS[task]}
        _script_file(task, split, tmp_path / "data" / "glue" / SCRIPT[task][0] / FILES[split], texts, labels)
        hub = tmp_path / "hub" / task / f"{split}-00000-of-00001.parquet"
        hub.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({**texts, "label": labels, "idx": np.arange(len(labels), dtype=np.int32)}).to_parquet(hub)
        ours = load_glue(task, split, data_dir=tmp_path / "data")
        theirs = load_glue(task, split, source=tmp_path / "hub")
        assert ours.texts_a == theirs.texts_a == texts[COLUMNS[task][0]]
        assert ours.texts_b == theirs.texts_b
        assert ours.labels.dtype == theirs.labels.dtype and ours.split == theirs.split == split
        np.testing.assert_allclose(ours.labels, theirs.labels, rtol=1e-6)


@pytest.mark.parametrize(
    "task,lines,message",
    [
        (
            "rte",
            ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment", "1\tc\td\tmaybe"],
            r"line 3: column 'label' must be one of \['entailment', 'not_entailment'\] or a class id, got 'maybe'",
        ),
        ("sst2", ["sentence\tlabel", "good\t1", "bad\t2"], r"line 3: column 'label' must lie in \[0, 1\]"),
        ("cola", ["gj04\t1\t\tFine.", "gj04\t0\tBroken"], r"line 2: expected 4 tab-separated fields"),
        ("mrpc", ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String", "1\t1\t2\tone"], r"missing column\(s\) \['#2 String'\]"),
        ("wnli", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\t"], r"line 2: column 'label' must be one of"),
    ],
)
def test_malformed_script_files_name_file_and_line(tmp_path, task, lines, message):
    path = tmp_path / "glue" / SCRIPT[task][0] / "train.tsv"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}") + ".*" + message):
        load_glue(task, "train", data_dir=tmp_path)


def test_missing_script_files_and_stsb_fallback(tmp_path):
    (tmp_path / "glue" / "RTE").mkdir(parents=True)
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(f"{tmp_path / 'glue/RTE/dev.tsv'}: not found; the data directory")
        + ".*GLUE rte validation file",
    ):
        load_glue("rte", "dev", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'glue/QNLI/train.tsv'}: not found")):
        load_glue("qnli", data_dir=tmp_path)
    cache = assets.fetch(["stsb"])  # no glue/STS-B/ in the data directory: the package, as without one
    package = load_glue("stsb", "validation", source="package", cache_dir=cache)
    local = load_glue("stsb", "validation", data_dir=tmp_path, cache_dir=cache)
    assert local.texts_a == package.texts_a and len(local) == 1500
    with pytest.raises(ValueError, match=r"data_dir: the original release files are read with source='auto'"):
        load_glue("rte", source="hub", data_dir=tmp_path)


# The real files: row counts from ../shared/data/README.md, rows against pandas and the Hub's class names.
COUNTS = {"cola": (8551, 1043), "sst2": (67349, 872), "mrpc": (3668, 408), "rte": (2490, 277), "wnli": (635, 71)}


@pytest.mark.parametrize("task", sorted(COUNTS))
def test_real_files_match_readme_and_pandas(shared_data_dir, task):
    folder, header, _, columns, label, named = SCRIPT[task]
    for split, count in zip(("train", "validation"), COUNTS[task]):
        data = load_glue(task, split, data_dir=shared_data_dir)
        frame = pd.read_csv(
            shared_data_dir / "glue" / folder / FILES[split],
            sep="\t",
            quoting=3,
            dtype=str,
            keep_default_na=False,
            header=None if task in HEADERLESS else 0,
            names=header if task in HEADERLESS else None,
            encoding="utf-8-sig",
        )
        assert len(data) == len(frame) == count
        texts = [list(frame[c]) for c in columns.values()]
        assert data.texts_a == texts[0] and data.texts_b == (texts[1] if len(texts) > 1 else None)
        raw = frame[label.lstrip("\ufeff")]
        want = [HUB_CLASSES[task].index(v) for v in raw] if named else raw.astype(int).to_list()
        np.testing.assert_array_equal(data.labels, want)
    # The Hub's nyu-mll/glue rte: train[0] is "No Weapons of Mass Destruction Found in Iraq Yet." / not_entailment
    if task == "rte":
        train = load_glue("rte", "train", data_dir=shared_data_dir)
        assert (train.texts_a[0], int(train.labels[0])) == ("No Weapons of Mass Destruction Found in Iraq Yet.", 1)
