"""GLUE loaders: local files in the nyu-mll/glue layout and column names, STS-B offline, bad config.

References: small Parquet/CSV/JSON Lines files written here from known rows in the Hub's schema
(text columns, ``label``, ``idx``); the STS-B package files re-read with pandas.
"""
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from isojax.data import GLUE_TASKS, assets, glue_task, load_glue
from conftest import require_offline

COLUMNS = {"cola": ("sentence",), "sst2": ("sentence",), "mrpc": ("sentence1", "sentence2"),
           "qqp": ("question1", "question2"), "stsb": ("sentence1", "sentence2"),
           "mnli": ("premise", "hypothesis"), "qnli": ("question", "sentence"),
           "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2")}
LABELS = {"cola": [1, 0, 1], "sst2": [0, 1, 1], "mrpc": [1, 1, 0], "qqp": [0, 0, 1], "stsb": [4.2, 0.0, 5.0],
          "mnli": [2, 0, 1], "qnli": [1, 0, 0], "rte": [0, 1, 0], "wnli": [1, 1, 0]}


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
    df = pd.read_csv(cache / "stsb" / "sts-train.csv", sep="\t", quoting=3, header=None, names=range(9),
                     dtype=str, keep_default_na=False)
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
    with pytest.raises(ValueError, match=re.escape(
            "task: unknown GLUE task 'squad'; expected one of "
            "['cola', 'mnli', 'mrpc', 'qnli', 'qqp', 'rte', 'sst2', 'stsb', 'wnli']")):
        load_glue("squad")
    with pytest.raises(ValueError, match=r"split: GLUE cola has splits \['train', 'validation', 'test'\]"):
        load_glue("cola", "valid")
    assert glue_task("SST-2") is GLUE_TASKS["sst2"] and glue_task("sts_b") is GLUE_TASKS["stsb"]


@pytest.mark.parametrize("task,labels,message", [
    ("cola", [1, 2, 0], r"row 2: column 'label' must lie in \[0, 1\] or one of \[-1.0\], got 2"),
    ("mnli", [0, 1.5, 2], r"row 2: column 'label' must be an integer, got 1.5"),
    ("stsb", [4.0, 5.5, 1.0], r"row 2: column 'label' must lie in \[0.0, 5.0\]"),
])
def test_bad_labels_name_file_and_row(tmp_path, task, labels, message):
    path = tmp_path / "train-00000-of-00001.parquet"
    _frame(task, "train", labels).to_parquet(path)
    with pytest.raises(ValueError, match=re.escape(f"{path}: ") + message):
        load_glue(task, "train", source=tmp_path)


def test_missing_column_and_missing_split(tmp_path):
    path = tmp_path / "validation.jsonl"
    _frame("qqp", "validation", [0, 1, 0]).rename(columns={"question2": "q2"}).to_json(
        path, orient="records", lines=True)
    with pytest.raises(ValueError, match=re.escape(f"{path}: missing column(s) ['question2']")):
        load_glue("qqp", "validation", source=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no file for split 'train'"):
        load_glue("qqp", "train", source=tmp_path)
    text = tmp_path / "t.jsonl"
    text.write_text('{"sentence": "fine", "label": 1}\n{"sentence": null, "label": 0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{text}: line 2: column 'sentence' must be text, got None")):
        load_glue("cola", source=text)
