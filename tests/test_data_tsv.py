"""The tab-separated reader of the original releases, against pandas (an independent parser) and on bad files."""

import re

import pandas as pd
import pytest

from isojax.data import read_tsv

ROWS = [["1", 'He said "yes', 'tail"'], ["2", "it 's fine . ", ""], ["3", "'single' quotes", "x"]]


def _write(path, lines, *, end="\n", bom=False):
    path.write_bytes((("\ufeff" if bom else "") + end.join(lines) + end).encode("utf-8"))
    return path


@pytest.mark.parametrize("end", ["\n", "\r\n"])
@pytest.mark.parametrize("bom", [False, True])
def test_header_file_matches_pandas_without_quoting(tmp_path, end, bom):
    path = _write(tmp_path / "t.tsv", ["index\tsentence1\tsentence2", *("\t".join(r) for r in ROWS)], end=end, bom=bom)
    table = read_tsv(path)
    ref = pd.read_csv(path, sep="\t", quoting=3, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    assert list(table.columns) == list(ref.columns) == ["index", "sentence1", "sentence2"]
    for column in ref.columns:
        assert table.text(column) == list(ref[column])
    assert table.text("sentence1")[0] == 'He said "yes'  # a quote is text, not the start of a field
    assert table.where(2) == f"{path}: line 4"


def test_headerless_with_optional_fields_and_no_final_newline(tmp_path):
    path = tmp_path / "sts.txt"
    path.write_text("a\tb\nc\td\tsrc1\tsrc2\ne\tf", encoding="utf-8")  # the last line has no newline
    table = read_tsv(path, ("sentence1", "sentence2"), extra=("source1", "source2"))
    assert table.text("sentence1") == ["a", "c", "e"]
    assert table.columns["source1"] == [None, "src1", None]
    assert [table.where(i) for i in range(3)] == [f"{path}: line {k}" for k in (1, 2, 3)]


@pytest.mark.parametrize(
    "lines,names,extra,message",
    [
        (["a\tb\tc", "1\t2\t3", "1\t2"], None, (), r"line 3: expected 3 tab-separated fields \(a, b, c\), got 2"),
        (["x\ty", "x\ty\tz"], ("s1", "s2"), ("u", "v"), r"line 2: expected 2 or 4 tab-separated fields .*got 3"),
        (["x\ty", ""], ("s1", "s2"), (), r"line 2: expected 2 tab-separated fields \(s1, s2\), got 0"),
        (["a\ta", "1\t2"], None, (), r"field names must be distinct"),
        (["a\tb"], None, (), r"no data rows"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, lines, names, extra, message):
    path = _write(tmp_path / "bad.tsv", lines)
    with pytest.raises(ValueError, match=re.escape(f"{path}: ") + message):
        read_tsv(path, names, extra=extra)


def test_empty_missing_and_non_utf8(tmp_path):
    empty = tmp_path / "empty.tsv"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=re.escape(f"{empty}: empty file; expected a header row")):
        read_tsv(empty)
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'nope.tsv'}: no such file")):
        read_tsv(tmp_path / "nope.tsv")
    latin = tmp_path / "latin.tsv"
    latin.write_bytes("a\tb\ncaf\xe9\tx\n".encode("latin-1"))
    with pytest.raises(ValueError, match=re.escape(f"{latin}: line 2: not UTF-8 text (bytes b'\\xe9' at byte 4")):
        read_tsv(latin)
