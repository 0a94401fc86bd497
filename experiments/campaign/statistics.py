"""The campaign's statistics: the two-sample t-test, the effect size, and the q-values that correct a family of
p-values for their number (Benjamini-Hochberg, Benjamini-Yekutieli). The paired t-test over the seeds whose runs are
paired is :func:`experiments.reproductions.glue_pairing.paired_ttest`; the detectable differences are
:mod:`experiments.reproductions.glue_power`'s.
"""

from __future__ import annotations

import numpy as np
import scipy.stats

from experiments.reproductions.glue_pairing import without_spread


def ttest(a, b) -> float | None:
    """Two-sample t-test p-value (equal variances) of two lists of values; None when it is undefined."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 2 or len(b) < 2 or (without_spread(a) and without_spread(b)):
        return None
    return float(scipy.stats.ttest_ind(a, b).pvalue)


def effect(values: list, base: list) -> tuple[float, float | None]:
    """Difference of the means and Cohen's d (over the pooled sample standard deviation; None when undefined)."""
    a, b = np.asarray(values, np.float64), np.asarray(base, np.float64)
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2 or (without_spread(a) and without_spread(b)):
        return diff, None
    pooled = np.sqrt(((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2))
    return diff, (float(diff / pooled) if pooled > 0 else None)


def q_values(named: dict[str, float]) -> dict[str, dict[str, float]]:
    """``{"bh": {name: q}, "by": {name: q}}``: the adjusted p-values (``scipy.stats.false_discovery_control``) of the
    p-values ``named``, Benjamini-Hochberg's and Benjamini-Yekutieli's."""
    return {
        method: dict(zip(named, scipy.stats.false_discovery_control(list(named.values()), method=method)))
        for method in ("bh", "by")
    }
