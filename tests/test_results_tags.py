"""Every committed results page names the git tag that reproduces it, and that tag's commit is the one the table
of ``experiments/tooling/tag_results.py`` records."""

import re
from pathlib import Path

from experiments.tooling.tag_results import TAGS

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "results"
NOTE = re.compile(
    r"^Reproduced at tag `results/([^`]+)` \(commit `([0-9a-f]{7,40})`\): `git checkout results/\1` and run "
)


def test_every_results_page_names_its_tag_and_the_table_holds_it():
    pages = sorted(RESULTS.rglob("*.md"))
    assert pages
    named = set()
    for page in pages:
        lines = page.read_text().splitlines()
        notes = [m for line in lines[:4] if (m := NOTE.match(line))]
        assert len(notes) == 1, f"{page.relative_to(RESULTS)}: no 'Reproduced at tag' line under its title"
        name, short = notes[0].groups()
        assert name in TAGS, f"{page.relative_to(RESULTS)}: results/{name} is not in tag_results.TAGS"
        assert TAGS[name].commit.startswith(short), f"{page.relative_to(RESULTS)}: {short} is not {TAGS[name].commit}"
        named.add(name)
    assert named == set(TAGS), f"tags no page names: {sorted(set(TAGS) - named)}"


def test_the_table_names_full_commits():
    assert all(re.fullmatch(r"[0-9a-f]{40}", tag.commit) and tag.why for tag in TAGS.values())
