"""The campaign's tests of significance (experiments/campaign/statistics.py, the paired t-test of
experiments/reproductions/glue_pairing.py and the summary's corrected p-values), against independent references:
scipy.stats.ttest_ind and ttest_rel, and Benjamini-Hochberg's and Benjamini-Yekutieli's closed forms."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
from conftest import read_json

from experiments.campaign import report as campaign_report
from experiments.campaign import spec, statistics
from experiments.reproductions import glue_pairing


def test_ttest_is_scipys_and_undefined_cases_are_none():
    a, b = [70.1, 71.5, 69.8], [68.0, 68.9, 69.5]
    assert statistics.ttest(a, b) == pytest.approx(scipy.stats.ttest_ind(a, b).pvalue, rel=1e-12)
    assert statistics.ttest([1.0], [2.0, 3.0]) is None
    assert statistics.ttest([50.0, 50.0], [50.0, 50.0]) is None


def test_paired_ttest_is_scipys_ttest_rel_over_the_seeds_with_the_same_masks():
    a, b = [70.1, 71.5, 69.8], [68.0, 68.9, 69.5]
    same = ({s: (v, "s1") for s, v in enumerate(a)}, {s: (v, "s1") for s, v in enumerate(b)})
    p, seeds = glue_pairing.paired_ttest(*same)
    assert seeds == [0, 1, 2] and p == pytest.approx(scipy.stats.ttest_rel(a, b).pvalue, rel=1e-12)
    assert p != pytest.approx(scipy.stats.ttest_ind(a, b).pvalue, rel=1e-3)  # the pairing changes the answer
    # seed 0 of b drew other masks (another pair key), seed 3 has no partner: pairs are seeds 1 and 2 only
    other = ({**same[0], 3: (72.0, "s1")}, {**same[1], 0: (68.0, "s0")})
    p, seeds = glue_pairing.paired_ttest(*other)
    assert seeds == [1, 2] and p == pytest.approx(scipy.stats.ttest_rel(a[1:], b[1:]).pvalue, rel=1e-12)
    assert glue_pairing.paired_ttest({0: (1.0, "s")}, {0: (2.0, "s")}) == (None, [0])  # one pair: undefined
    assert glue_pairing.paired_ttest({0: (1.0, "s"), 1: (2.0, "s")}, {0: (0.0, "s"), 1: (1.0, "s")})[0] is None
    # one more right answer of 71 in every seed: differences equal but for round-off (ttest_rel would say p ~ 1e-30)
    right = {s: (100 * k / 71, "s") for s, k in enumerate([17, 21, 25])}
    assert glue_pairing.paired_ttest(right, {s: (100 * k / 71, "s") for s, k in enumerate([16, 20, 24])})[0] is None
    assert statistics.ttest([100 * 17 / 71] * 3, [100 * 16 / 71] * 3) is None
    assert np.var([100 * 17 / 71] * 3, ddof=1) > 0  # round-off: Cohen's d would be about 1e15
    assert statistics.effect([100 * 17 / 71] * 3, [100 * 16 / 71] * 3) == (pytest.approx(100 / 71), None)


def benjamini_hochberg(ps, dependence_factor=False):
    """Benjamini and Hochberg's (1995) adjusted p-values by their closed form: the i-th smallest of m p-values
    becomes min over j >= i of p_(j) m / j, at most 1; with ``dependence_factor``, Benjamini and Yekutieli's (2001)
    for any dependence: m / j becomes m c(m) / j, c(m) = sum_{i<=m} 1/i."""
    ps = np.asarray(ps, np.float64)
    m = len(ps)
    order = np.argsort(ps)
    scaled = ps[order] * m / np.arange(1, m + 1) * (np.sum(1 / np.arange(1, m + 1)) if dependence_factor else 1)
    q = np.empty_like(ps)
    q[order] = np.minimum(np.minimum.accumulate(scaled[::-1])[::-1], 1.0)
    return q


def test_q_values_are_the_closed_forms():
    ps = {"a": 0.001, "b": 0.04, "c": 0.03, "d": 0.5, "e": 0.04}
    q = statistics.q_values(ps)
    assert list(q["bh"]) == list(ps) and list(q["by"]) == list(ps)
    np.testing.assert_allclose(list(q["bh"].values()), benjamini_hochberg(list(ps.values())), rtol=1e-12)
    np.testing.assert_allclose(
        list(q["by"].values()), benjamini_hochberg(list(ps.values()), dependence_factor=True), rtol=1e-12
    )


def test_summary_corrects_each_family_of_p_values_for_their_number():
    """After the papers, the summary adjusts each family of its p-values (the task metric's unpaired and paired p,
    the dev IsoScore's paired p; one per method and task) by Benjamini-Hochberg and Benjamini-Yekutieli: the
    q-values equal the closed forms over scipy's t-test p-values, and the comparisons with p < 0.05 are listed, *
    where q < 0.05."""
    config = read_json(spec.DEFAULT_CONFIG)
    base = [16, 20, 24, 22]  # WNLI dev examples right (of 71) in seeds 0-3
    right = {"cosine": [17, 19, 26, 22], "flow": [22, 26, 27, 26], "isobn": [15, 21, 23, 22], "spectrum_pol": base}
    iso = {"baseline": [0.08, 0.07, 0.09, 0.08], "cosine": [0.081, 0.069, 0.092, 0.083], "flow": [0.2, 0.3, 0.25, 0.2]}

    def records(method):
        return [
            {"accuracy": 100 * k / 71, "seed": s, "pair": "s", "isoscore": iso.get(method, iso["baseline"])[s]}
            for s, k in enumerate(right.get(method, base))
        ]

    _, rows = campaign_report.task_table(
        "wnli", {m: records(m) for m in ["baseline", *right]}, config["protocols"]["appB"], {}
    )
    config["summaries"] = [
        {"paper": "P", "claim": "C", "protocol": "appB", "methods": ["cosine", "flow"]},
        {"paper": "Q", "claim": "C", "protocol": "appB", "methods": ["isobn", "spectrum_pol"]},
    ]
    text = campaign_report.summary(config, [{"task": "wnli", "protocol": "appB", "rows": rows}])
    methods = ["cosine", "flow", "isobn"]  # spectrum_pol equals the baseline: unpaired p 1, no paired p
    acc = {m: [100 * k / 71 for k in right[m]] for m in methods}
    base_acc = [100 * k / 71 for k in base]
    unpaired = [scipy.stats.ttest_ind(acc[m], base_acc).pvalue for m in methods]
    paired = [scipy.stats.ttest_rel(acc[m], base_acc).pvalue for m in methods]
    iso_p = [scipy.stats.ttest_rel(iso[m], iso["baseline"]).pvalue for m in ["cosine", "flow"]]
    assert min(unpaired) > 0.05 and paired[1] < 0.05 < min(paired[0], paired[2]) and iso_p[1] < 0.05 < iso_p[0]

    def starred(q):
        return f"{q:.3f}" + ("*" if q < 0.05 else "")

    def listed(ps, i):
        bh, by = benjamini_hochberg(ps)[i], benjamini_hochberg(ps, dependence_factor=True)[i]
        return f"p {ps[i]:.3f} q {starred(bh)} (BY {starred(by)})"

    assert "- task metric (unpaired): 0 of 4 p < 0.05." in text
    assert f"- task metric (paired): 1 of 3 p < 0.05: flow on wnli {listed(paired, 1)}." in text
    assert f"- dev IsoScore (paired): 1 of 2 p < 0.05: flow on wnli {listed(iso_p, 1)}." in text
    # by hand: sorted 0.01, 0.03, 0.04, 0.5 scale to 0.04, 0.06, 0.0533, 0.5; the 0.06 takes the 0.0533 above it
    np.testing.assert_allclose(benjamini_hochberg([0.01, 0.04, 0.03, 0.5]), [0.04, 0.16 / 3, 0.16 / 3, 0.5])
    # BY multiplies by c(4) = 1 + 1/2 + 1/3 + 1/4 = 25/12, capped at 1
    np.testing.assert_allclose(
        benjamini_hochberg([0.01, 0.04, 0.03, 0.5], dependence_factor=True), [1 / 12, 1 / 9, 1 / 9, 1.0]
    )
