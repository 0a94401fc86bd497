"""What the GLUE campaign's seeds can detect: the power of its t-tests.

With three seeds a method whose p-value is large has not been shown to do nothing; it may do something smaller than
the tests can see. The smallest difference a two-sided t-test at level alpha finds with probability ``power`` is,
in units of the spread,

- two samples of n each (``scipy.stats.ttest_ind``): Cohen's d solving
  P(|T| > t_{1-alpha/2, 2n-2}) = power, T noncentral t with 2n - 2 degrees of freedom and noncentrality d sqrt(n/2);
- n pairs (``scipy.stats.ttest_rel``): d_z = mean / std of the differences solving the same with n - 1 degrees of
  freedom and noncentrality d_z sqrt(n).

Times the spread seen in the campaign (the baseline's sample std over its seeds; the paired differences' sample
std pooled over a task's methods) this gives the difference in the task metric's own units.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize
import scipy.stats

from experiments.reproductions.glue_pairing import without_spread


def detectable_effect(n: int, *, paired: bool, power: float = 0.8, alpha: float = 0.05) -> float | None:
    """The smallest standardised difference (Cohen's d for two samples of ``n`` each, d_z for ``n`` pairs) that a
    two-sided t-test at level ``alpha`` finds with probability ``power`` (module docstring); None below two per arm
    (no test). Raises ValueError unless 0 < ``alpha`` < ``power`` < 1 (a power of 1 needs an infinite effect; at
    no effect the test already rejects with probability ``alpha``)."""
    if not 0 < alpha < power < 1:
        raise ValueError(f"detectable_effect needs 0 < alpha < power < 1, got alpha {alpha} and power {power}")
    if n < 2:
        return None
    df = n - 1 if paired else 2 * n - 2
    scale = np.sqrt(n) if paired else np.sqrt(n / 2)
    critical = scipy.stats.t.ppf(1 - alpha / 2, df)

    def shortfall(d: float) -> float:
        nc = d * scale
        # P(T > c) + P(T < -c), the second as P(T' > c) for T' of noncentrality -nc (scipy's cdf far in the lower
        # tail is NaN for many degrees of freedom; its sf is not)
        return scipy.stats.nct.sf(critical, df, nc) + scipy.stats.nct.sf(critical, df, -nc) - power

    upper = 1.0
    while shortfall(upper) < 0:  # power rises with d: double until it is reached, then bisect
        upper *= 2
    return float(scipy.optimize.brentq(shortfall, 0.0, upper, xtol=1e-10))


def pooled_paired_std(lines: list[dict], base: dict, metric: str) -> tuple[float | None, int, int]:
    """The sample std of the method-minus-baseline differences of ``metric`` over each line's paired seeds (table
    payload entries, :func:`experiments.campaign.report.task_table`), pooled over the lines whose paired
    test is defined (at least two pairs, not all equal): sqrt(sum_m (n_m - 1) s_m^2 / sum_m (n_m - 1)); and the
    number of lines and pairs it pools (None, 0, 0 when none)."""
    base_by_seed = dict(zip(base["seeds"], base[metric]["values"]))
    squares, dof, used, pairs = 0.0, 0, 0, 0
    for line in lines:
        seeds = line[metric]["paired_seeds"]
        if len(seeds) < 2:
            continue
        by_seed = dict(zip(line["seeds"], line[metric]["values"]))
        differences = np.asarray([by_seed[s] - base_by_seed[s] for s in seeds], np.float64)
        if without_spread(differences):
            continue
        squares += (len(seeds) - 1) * differences.var(ddof=1)
        dof += len(seeds) - 1
        used, pairs = used + 1, pairs + len(seeds)
    return (float(np.sqrt(squares / dof)) if dof else None), used, pairs


def detectable(tables: list[dict], baselines: dict[str, str], metrics: dict[str, str], power: float = 0.8) -> str:
    """The report's paragraph on what its seeds can detect: for each table (``{"task", "protocol", "rows"}``) whose
    baseline line (``baselines[protocol]``) has two or more seeds, the smallest difference in the task's first
    metric (``metrics[task]``) that the two-sample and the paired t-test at the 5% level find with probability
    ``power``, from the baseline's spread and from the pooled spread of the paired differences
    (:func:`pooled_paired_std`)."""
    out = [
        f"**What the seeds can detect**: the smallest difference in the task metric that a two-sided t-test at the "
        f"5% level finds with probability {power:.1f} (noncentral t, scipy.stats.nct), given the spread seen here: "
        "two-sample, the baseline's sample std s over its n seeds against a method with as many (Cohen's d); "
        "paired, over n pairs, the sample std s_Δ of the method-minus-baseline differences pooled over the task's "
        "methods with a paired test (d_z). A true difference of that size gives p > 0.05 one time in five, a smaller "
        "one more often: a large p-value here does not show that a method does nothing.",
    ]
    for table in tables:
        lines = {row["method"]: row for row in table["rows"] if row.get("seeds")}
        base, metric = lines.get(baselines[table["protocol"]]), metrics[table["task"]]
        if base is None or len(base["seeds"]) < 2:
            continue
        n, s = len(base["seeds"]), float(np.std(base[metric]["values"], ddof=1))
        d = detectable_effect(n, paired=False, power=power)
        assert d is not None  # n >= 2
        text = f"- {table['task']} ({table['protocol']}) {metric}: s {s:.2f} over {n} seeds, "
        text += f"two-sample {d * s:.2f} (d {d:.2f})"
        others = [row for row in lines.values() if row is not base]
        s_pair, used, pairs = pooled_paired_std(others, base, metric)
        if s_pair is not None:
            d_z = detectable_effect(n, paired=True, power=power)
            assert d_z is not None  # n >= 2
            text += f"; s_Δ {s_pair:.2f} ({pairs} pairs of {used} methods), paired {d_z * s_pair:.2f} (d_z {d_z:.2f})"
        out.append(text + ".")
    return "\n".join(out) + "\n"
