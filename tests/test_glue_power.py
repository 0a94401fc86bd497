"""The GLUE report's power analysis (experiments/reproductions/glue_power.py): the detectable effect against a
simulation of scipy's own t-tests and against the normal approximation for many seeds, with a clear error for an
impossible power; the pooled spread of the paired differences and the report's paragraph against numpy by hand."""

import numpy as np
import pytest
import scipy.stats

from experiments.reproductions.glue_power import detectable, detectable_effect, pooled_paired_std


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("paired", [False, True])
def test_detectable_effect_is_found_with_the_asked_power_by_scipys_t_tests(n, paired):
    """At the returned effect, 40,000 simulated experiments (normal values, unit spread) reject at 5% with
    scipy.stats.ttest_ind / ttest_rel in 80% of cases (standard error 0.002), and at a tenth less effect in fewer."""
    d = detectable_effect(n, paired=paired)
    rng = np.random.default_rng(0)

    def rejected(effect):
        base = rng.standard_normal((40_000, n))
        if paired:  # differences N(effect, 1): the method's values are the baseline's plus them
            p = scipy.stats.ttest_rel(base + effect + rng.standard_normal((40_000, n)), base, axis=1)
        else:
            p = scipy.stats.ttest_ind(rng.standard_normal((40_000, n)) + effect, base, axis=1)
        return np.mean(p.pvalue < 0.05)

    assert rejected(d) == pytest.approx(0.8, abs=0.01)
    assert rejected(0.9 * d) < 0.77


@pytest.mark.parametrize("paired", [False, True])
def test_detectable_effect_for_many_seeds_is_the_normal_approximation(paired):
    """For large n the t-test is the z-test: d = (z_0.975 + z_0.8) sqrt(2 / n) for two samples, / sqrt(n) paired."""
    n = 5000
    z = scipy.stats.norm.ppf(0.975) + scipy.stats.norm.ppf(0.8)
    expected = z / np.sqrt(n) if paired else z * np.sqrt(2 / n)
    assert detectable_effect(n, paired=paired) == pytest.approx(expected, rel=1e-3)
    assert detectable_effect(1, paired=paired) is None
    for power, alpha in [(1.0, 0.05), (0.04, 0.05), (0.8, 0.0)]:
        with pytest.raises(ValueError, match="0 < alpha < power < 1"):
            detectable_effect(3, paired=paired, power=power, alpha=alpha)


def line(name, seeds, values):
    return {"method": name, "seeds": seeds, "acc": {"values": values, "paired_seeds": seeds}}


def test_pooled_paired_std_and_the_reports_paragraph():
    """Two methods' differences to the baseline (seeds 0-2 and 0-1) pool as sum (n - 1) s^2 / sum (n - 1); a
    method equal to the baseline in every seed (no paired test) is left out; the paragraph multiplies the spreads
    by the detectable effects."""
    base = {"method": "baseline", "seeds": [0, 1, 2], "acc": {"values": [70.0, 72.0, 75.0], "paired_seeds": []}}
    a, b = line("a", [0, 1, 2], [71.0, 75.0, 76.0]), line("b", [0, 1], [68.0, 73.0])
    same = line("same", [0, 1, 2], [70.0, 72.0, 75.0])
    diffs_a, diffs_b = np.array([1.0, 3.0, 1.0]), np.array([-2.0, 1.0])
    pooled = np.sqrt((2 * diffs_a.var(ddof=1) + 1 * diffs_b.var(ddof=1)) / 3)
    s_pair, used, pairs = pooled_paired_std([a, b, same], base, "acc")
    assert (s_pair, used, pairs) == (pytest.approx(pooled), 2, 5)
    assert pooled_paired_std([same], base, "acc") == (None, 0, 0)

    text = detectable(
        [{"task": "t", "protocol": "p", "rows": [base, a, b, same]}, {"task": "u", "protocol": "p", "rows": []}],
        {"p": "baseline"},
        {"t": "acc", "u": "acc"},
    )
    s = np.std([70.0, 72.0, 75.0], ddof=1)
    d, d_z = detectable_effect(3, paired=False), detectable_effect(3, paired=True)
    assert (
        f"- t (p) acc: s {s:.2f} over 3 seeds, two-sample {d * s:.2f} (d {d:.2f}); s_Δ {pooled:.2f} (5 pairs of "
        f"2 methods), paired {d_z * pooled:.2f} (d_z {d_z:.2f})." in text
    )
    assert "- u " not in text  # no baseline seeds: no line
