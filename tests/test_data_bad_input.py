"""Bad data files, loader by loader: each case is handled as documented or is an error naming file and line.

=========================  ==========================================  =======================================
case                       loaders                                     handling
=========================  ==========================================  =======================================
empty sentence             STS-B file, STS release, SICK, Hub layout,  ``ValueError`` at its file and line
                           GLUE validation/test
                           GLUE train, seq2seq (every split)           row left out, count logged (WARNING)
                           STS release, unscored pair                  left out with the unscored pairs, count
                                                                       logged (INFO)
longer than max_length     tokenize                                    truncated, count logged (INFO)
not UTF-8                  TSV, STS gold, word pairs, Hub CSV/JSONL    ``ValueError`` at its file and line
score out of range         every STS source, word sets                 ``ValueError`` at its file and line
                                                                       (tested beside each loader)
label outside the classes  GLUE train/validation (-1 is test only)     ``ValueError`` at its file and line
a single ``str`` as texts  tokenize, StsData, GlueData, Seq2SeqData    ``TypeError`` naming the argument
=========================  ==========================================  =======================================

References: the rows written here (what must be kept, where the bad one is); for truncation, the tokenizer
called on each text or pair alone without truncation.
"""

import gzip
import json
import logging
import re

import numpy as np
import pytest
import transformers

from isojax.data import (
    GlueData,
    StsData,
    glue_task,
    load_glue,
    load_sts,
    read_sick,
    read_sts_release,
    read_stsb_file,
    read_word_pairs,
    tokenize,
)
from isojax.data.seq2seq import Seq2SeqData, load_seq2seq, seq2seq_task

pytestmark = pytest.mark.usefixtures("datasets_cache")
STSB_ROW = "main-captions\tMSRvid\t2012test\t{id}\t{score}\t{a}\t{b}"
SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"


def _lines(path, lines, *, encoding="utf-8"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(f"{line}\n" for line in lines).encode(encoding))
    return path


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _raises_at(path, line, what):
    return pytest.raises(ValueError, match=re.escape(f"{path}: line {line}: ") + what)


# --- an empty sentence ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "  "])
def test_empty_sentence_in_stsb_file_is_an_error_at_its_line(tmp_path, text):
    path = _lines(
        tmp_path / "sts-dev.csv",
        [
            STSB_ROW.format(id=1, score=4.0, a="A man.", b="A person."),
            STSB_ROW.format(id=2, score=1.0, a="A dog.", b=text),
        ],
    )
    with _raises_at(path, 2, "column 'sentence2' is empty"):
        read_stsb_file(path)


def test_empty_sentence_in_sts_release_scored_is_an_error_unscored_is_left_out(tmp_path, caplog):
    folder = tmp_path / "STS12"
    inputs = _lines(folder / "STS.input.MSRvid.txt", ["A man.\tA person.", "\tunscored", "A cat.\tA kitten."])
    gold = _lines(folder / "STS.gs.MSRvid.txt", ["4.5", "", "3"])
    with caplog.at_level(logging.INFO, logger="isojax.data.semeval"):
        s1, s2, scores = read_sts_release(folder)
    assert (s1, s2, scores.tolist()) == (["A man.", "A cat."], ["A person.", "A kitten."], [4.5, 3.0])
    assert f"{gold}: 1 of 3 pairs unscored (empty gold line), left out" in caplog.messages
    _lines(gold, ["4.5", "2", "3"])
    with _raises_at(inputs, 2, "column 'sentence1' is empty"):
        read_sts_release(folder)


def test_empty_sentence_in_sick_is_an_error_at_its_line(tmp_path):
    path = _lines(
        tmp_path / "SICK_trial.txt",
        [SICK_HEADER, "1\tA man.\tA person.\t4.5\tENTAILMENT", "2\tA dog.\t \t1.5\tNEUTRAL"],
    )
    with _raises_at(path, 3, r"column 'sentence_B' is empty \(whitespace only\)"):
        read_sick(tmp_path, "trial")


def test_empty_sentence_in_hub_layout_is_an_error_at_its_line(tmp_path):
    path = _jsonl(
        tmp_path / "test.jsonl",
        [{"sentence1": "a", "sentence2": "b", "score": 1.0}, {"sentence1": "", "sentence2": "c", "score": 2.0}],
    )
    with _raises_at(path, 2, "column 'sentence1' is empty"):
        load_sts("sts15", source=tmp_path)


def _glue_dir(tmp_path, split_file, rows):
    _lines(
        tmp_path / "glue" / "RTE" / split_file,
        ["index\tsentence1\tsentence2\tlabel", *("\t".join(map(str, r)) for r in rows)],
    )
    return tmp_path


def test_empty_sentence_in_glue_train_is_left_out_and_counted(tmp_path, caplog):
    rows = [
        (0, "A man.", "A person.", "entailment"),
        (1, "A dog.", "", "not_entailment"),
        (2, " ", "x", "entailment"),
        (3, "A cat.", "A kitten.", "not_entailment"),
    ]
    data_dir = _glue_dir(tmp_path, "train.tsv", rows)
    with caplog.at_level(logging.WARNING, logger="isojax.data.tables"):
        data = load_glue("rte", "train", data_dir=data_dir)
    assert data.texts_a == ["A man.", "A cat."] and data.texts_b == ["A person.", "A kitten."]
    assert data.labels.tolist() == [0, 1]
    path = data_dir / "glue" / "RTE" / "train.tsv"
    assert caplog.messages == [
        f"{path}: skipped 2 of 4 rows with an empty text in sentence1, sentence2 "
        f"(first: {path}: line 3; {path}: line 4)"
    ]


def test_empty_sentence_in_glue_validation_is_an_error_at_its_line(tmp_path):
    data_dir = _glue_dir(
        tmp_path, "dev.tsv", [(0, "A man.", "A person.", "entailment"), (1, "A dog.", "", "not_entailment")]
    )
    with _raises_at(data_dir / "glue" / "RTE" / "dev.tsv", 3, "column 'sentence2' is empty"):
        load_glue("rte", "validation", data_dir=data_dir)


def test_empty_text_in_seq2seq_is_left_out_and_counted(tmp_path, caplog):
    path = _jsonl(
        tmp_path / "validation.jsonl",
        [
            {"source": "ein Hund", "target": "a dog"},
            {"source": "eine Katze", "target": "\n"},
            {"source": "ein Haus", "target": "a house"},
        ],
    )
    with caplog.at_level(logging.WARNING, logger="isojax.data.tables"):
        data = load_seq2seq("seq2seq", "validation", source=tmp_path)
    assert (data.sources, data.targets) == (["ein Hund", "ein Haus"], ["a dog", "a house"])
    assert caplog.messages == [
        f"{path}: skipped 1 of 3 rows with an empty text in source, target (first: {path}: line 2)"
    ]


# --- longer than max_length -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    return transformers.AutoTokenizer.from_pretrained(str(default_model_path))


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("max_length", [6, 9, 40])
def test_truncation_is_counted_in_the_log(tokenizer, caplog, pairs, max_length):
    rng = np.random.default_rng(max_length)
    words = "a man plays the guitar loudly in a small room while the dog sleeps".split()
    a = [" ".join(rng.choice(words, rng.integers(1, 10))) for _ in range(60)]
    b = [" ".join(rng.choice(words, rng.integers(1, 10))) for _ in range(60)] if pairs else None
    full = [len(tokenizer(x, None if b is None else b[i])["input_ids"]) for i, x in enumerate(a)]
    expected = sum(n > max_length for n in full)
    with caplog.at_level(logging.INFO, logger="isojax.data.batching"):
        out = tokenize(tokenizer, a, b, max_length=max_length)
    np.testing.assert_array_equal(out["attention_mask"].sum(1), np.minimum(full, max_length))
    what = "text pairs" if pairs else "texts"
    assert caplog.messages == (
        [f"tokenize: {expected} of 60 {what} truncated to max_length={max_length} tokens"] if expected else []
    )
    assert (expected > 0) == (max_length < 40)  # both cases are exercised


# --- bytes that are not UTF-8 -----------------------------------------------------------------------------------


def test_not_utf8_sts_gold_file_names_its_line(tmp_path):
    folder = tmp_path / "STS12"
    _lines(folder / "STS.input.MSRvid.txt", ["A man.\tA person.", "A cat.\tA kitten."])
    gold = folder / "STS.gs.MSRvid.txt"
    gold.write_bytes(b"4.5\n3\xa0\n")
    with _raises_at(gold, 2, re.escape("not UTF-8 text (bytes b'\\xa0' at byte 2 of the line")):
        read_sts_release(folder)


def test_not_utf8_word_pairs_name_their_line(tmp_path):
    path = tmp_path / "pairs.txt"
    path.write_bytes(b"cat\tdog\t7\n" + "caf\xe9\ttea\t5\n".encode("latin-1"))
    with _raises_at(path, 2, re.escape("not UTF-8 text (bytes b'\\xe9' at byte 4 of the line")):
        read_word_pairs(path)


@pytest.mark.parametrize("name", ["test.csv", "test.jsonl", "test.jsonl.gz"])
def test_not_utf8_hub_layout_files_name_their_line(tmp_path, name):
    if name == "test.csv":
        content = b"sentence1,sentence2,score\na b,c d,1.0\nx,y,2.0\nz \xff,w,3.0\n"
    else:
        content = b"".join(b'{"sentence1": "%s", "sentence2": "b", "score": 1}\n' % s for s in (b"a", b"c", b"z\xff"))
    path = tmp_path / name
    path.write_bytes(gzip.compress(content) if name.endswith(".gz") else content)
    at = content.split(b"\n")[-2].index(b"\xff") + 1  # the last line holds the bad byte
    with _raises_at(path, content.count(b"\n"), re.escape(f"not UTF-8 text (bytes b'\\xff' at byte {at} of the line")):
        load_sts("sts15", source=path)


# --- a label outside the task's classes -------------------------------------------------------------------------


@pytest.mark.parametrize("split_file,split", [("train.tsv", "train"), ("dev.tsv", "validation")])
@pytest.mark.parametrize(
    "label,message",
    [
        ("-1", r"column 'label' must lie in \[0, 1\], got '-1'"),  # -1 marks an unlabelled test row only
        ("2", r"column 'label' must lie in \[0, 1\], got '2'"),
        ("contradiction", r"column 'label' must be one of \['entailment', 'not_entailment'\] or a class id"),
    ],
)
def test_glue_label_outside_the_classes_is_an_error_at_its_line(tmp_path, split_file, split, label, message):
    data_dir = _glue_dir(tmp_path, split_file, [(0, "A man.", "A person.", "entailment"), (1, "A.", "B.", label)])
    with _raises_at(data_dir / "glue" / "RTE" / split_file, 3, message):
        load_glue("rte", split, data_dir=data_dir)


def test_glue_test_split_keeps_minus_one_for_unlabelled_rows(tmp_path):
    _lines(tmp_path / "glue" / "RTE" / "test.tsv", ["index\tsentence1\tsentence2", "0\tA man.\tA person."])
    assert load_glue("rte", "test", data_dir=tmp_path).labels.tolist() == [-1]


# --- a single str where a sequence of texts is expected ---------------------------------------------------------


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda: StsData("a b", ["c", "d", "e"], np.zeros(3), "x", "test"), "sentences1"),
        (lambda: StsData(["a", "b"], "cd", np.zeros(2), "x", "test"), "sentences2"),
        (lambda: GlueData("abc", None, np.zeros(3, np.int32), glue_task("sst2"), "train"), "texts_a"),
        (lambda: GlueData(["a", "b"], "cd", np.zeros(2, np.int32), glue_task("rte"), "train"), "texts_b"),
        (lambda: Seq2SeqData("ab", ["x", "y"], seq2seq_task("seq2seq"), "train"), "sources"),
        (lambda: Seq2SeqData(["a", "b"], "xy", seq2seq_task("seq2seq"), "train"), "targets"),
    ],
)
def test_single_string_as_texts_is_a_type_error(make, name):
    with pytest.raises(TypeError, match=f"{name} must be a sequence of strings, got str"):
        make()
