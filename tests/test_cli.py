"""The isojax command end to end on the bundled default model (small inputs)."""
import json

import pytest

from isojax.cli import main


def test_analyze_writes_table_figures_and_json(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["analyze", "--limit", "24", "--out", str(out), "--json", str(tmp_path / "a.json"), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "TokenUni" in text and "I(W)" in text
    result = json.loads((tmp_path / "a.json").read_text())
    assert result["layers"] == list(range(7)) and len(result["cdf"]) == 7
    assert all(0 <= v <= 1 for v in result["cdf"][3]) and result["cdf"][3][-1] == pytest.approx(1.0)
    assert (out / "sv_cdf.png").stat().st_size > 1000 and (out / "layers.png").stat().st_size > 1000


def test_wordsim_with_a_user_file(tmp_path, capsys):
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("# my pairs\ncat\tdog\t8.0\ncar bus 6.5\napple pear 7\ncat car 1.5\nking queen 8.5\n")
    assert main(["wordsim", "--data", "ws353", "--file", str(pairs), "--methods", "raw,center",
                 "--similarity", "cosine", "--json", str(tmp_path / "w.json")]) == 0
    rows = json.loads((tmp_path / "w.json").read_text())["rows"]
    assert {(r["method"], r["data"]) for r in rows} == {("raw", "ws353"), ("center", "ws353"), ("raw", "pairs"),
                                                        ("center", "pairs")}
    assert all(r["pairs_used"] == 5 for r in rows if r["data"] == "pairs")


def test_sts_rejects_unknown_method(tmp_path):
    with pytest.raises(ValueError, match="unknown STS method"):
        main(["sts", "--methods", "raw,nonsense", "--no-isotropy", "--quiet"])


def test_help_explains_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["sts", "--help"])
    assert "--alpha" in capsys.readouterr().out
