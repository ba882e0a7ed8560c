"""The one paired rule and its family correction: every verdict of the project is judged here.

`compare_runs(a, b)` compares two arms seed by seed (PAIRED_RULE: the 95% t-interval of the paired differences over
seeds excludes 0), `verdict_table` gathers a notebook's comparisons and `adjust` judges them among their family
(FAMILY_RULE: Holm-Bonferroni over the table); `detectable` says what a comparison could have seen (80% power).
`compare_spread` judges the spread over seeds (Pitman–Morgan). fedfrozen.studies.tables applies them to the run tables.

Why a t-interval and not a paired bootstrap: at n = 5 seeds a bootstrap has at most 126 distinct
resamples and its percentile interval is too narrow (it ignores that sd(d) is itself estimated),
while the t-interval is exact for normal differences, closed-form and deterministic.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PAIRED_RULE", "FAMILY_RULE", "POWER", "RESOLVED", "UNRESOLVED", "Comparison", "t_quantile",
           "sd_from_half_width", "paired_p", "detectable", "holm", "adjusted_half_width", "compare_runs",
           "SpreadComparison", "compare_spread", "resolution", "VERDICT_COLUMNS", "ADJUSTED_COLUMNS", "verdict_table",
           "adjust", "decimals"]


PAIRED_RULE = ("arms compared share their seeds (partition, initialisation, client sampling, batch order), so they are "
               "compared as pairs: d_i = a_i - b_i over the n seeds both have; a difference holds when the 95% "
               "t-interval d_mean +- t(0.975, n-1) * sd(d) / sqrt(n) excludes 0 ('higher' or 'lower'), else "
               "'no difference resolved'; one seed has no interval and resolves nothing")


FAMILY_RULE = ("a verdict is judged among the comparisons of its family (a notebook's verdict table; the README's "
               "rows): Holm-Bonferroni at family-wise level 0.05 on the paired t-test's p-values; a family of one "
               "is the paired rule itself")


POWER = 0.8  # the power at which `detectable` states the smallest difference a comparison could see


RESOLVED = ("higher", "lower")


UNRESOLVED = "no difference resolved"


@dataclass(frozen=True)
class Comparison:
    """a against b over n shared seeds, judged by PAIRED_RULE: d = mean of the paired differences,
    half_width = the 95% t-interval's half-width (inf for one seed)."""

    mean_a: float
    mean_b: float
    diff: float
    half_width: float
    n: int
    # where the arms came from, when `compare` made it (not part of equality): the table's grouping columns and
    # the two rows' labels in them (`recompute` finds the runs again by these)
    by: tuple = field(default=(), compare=False)
    a: tuple = field(default=(), compare=False)
    b: tuple = field(default=(), compare=False)

    @property
    def gap(self) -> float:
        """The mean paired difference d (== mean_a - mean_b over the shared seeds)."""
        return self.diff

    @property
    def resolved(self) -> bool:
        """True when the interval excludes 0 (strictly: identical arms, d = 0 +- 0, never resolve)."""
        return abs(self.diff) - self.half_width > 0

    @property
    def verdict(self) -> str:
        """'higher' or 'lower' (a against b) when resolved, else 'no difference resolved'."""
        if not self.resolved:
            return UNRESOLVED
        return "higher" if self.diff > 0 else "lower"

    @property
    def interval(self) -> tuple[float, float]:
        return self.diff - self.half_width, self.diff + self.half_width

    @property
    def sd(self) -> float:
        """The standard deviation of the paired differences (from the half-width; NaN for one seed)."""
        return sd_from_half_width(self.half_width, self.n)

    @property
    def p_value(self) -> float:
        """The paired t-test's two-sided p-value (the rule resolves exactly when it is below 0.05)."""
        return paired_p(self.diff, self.half_width, self.n)

    def detectable(self, power: float = POWER) -> float:
        """The smallest true difference this comparison finds with probability `power` (`detectable`)."""
        return detectable(self.sd, self.n, power)

    def __str__(self) -> str:
        k = decimals(self.half_width)  # at its own scale
        return (f"{self.mean_a:.{k}f} vs {self.mean_b:.{k}f}: d = {self.diff:+.{k}f} ± {self.half_width:.{k}f} "
                f"({self.n}): {self.verdict}")


def decimals(half_width: float) -> int:
    """The decimals a difference and its half-width are printed with: at least 3, and enough to show the first
    significant digit of the half-width, so that a measure on a small scale (oscillation under a cosine rate: ~1e-4)
    does not print as "d = -0.000 +- 0.000 ... detects 0.000", as if it detected nothing."""
    if not (0 < half_width < math.inf):
        return 3
    return max(3, -math.floor(math.log10(half_width)))


def t_quantile(n: int) -> float:
    """t(0.975, n - 1): the two-sided 95% quantile of Student's t with n - 1 degrees of freedom (inf for n < 2)."""
    if n < 2:
        return math.inf
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def sd_from_half_width(half_width: float, n: int) -> float:
    """sd(d) from a 95% half-width over n seeds (inverting PAIRED_RULE's interval); NaN for n < 2."""
    if n < 2 or not math.isfinite(half_width):
        return math.nan
    return half_width * math.sqrt(n) / t_quantile(n)


def paired_p(d: float, half_width: float, n: int) -> float:
    """Two-sided p-value of the paired t-test whose 95% interval is d +- half_width over n seeds (1.0 for one
    seed or identical arms)."""
    sd = sd_from_half_width(half_width, n)
    if not math.isfinite(sd):
        return 1.0
    if sd == 0:
        return 1.0 if d == 0 else 0.0
    from scipy.stats import t

    return float(2 * t.sf(abs(d) / (sd / math.sqrt(n)), n - 1))


def detectable(sd: float, n: int, power: float = POWER, level: float = 0.05) -> float:
    """The smallest true mean difference a two-sided paired t-test at `level` over n seeds with this sd(d)
    detects with probability `power` (non-central t; inf for n < 2). For large n it approaches
    (z(1 - level/2) + z(power)) * sd / sqrt(n), 2.80 sd / sqrt(n) at the defaults."""
    if n < 2 or not math.isfinite(sd):
        return math.inf
    if sd == 0:
        return 0.0
    from scipy.optimize import brentq
    from scipy.stats import nct, norm, t

    df, crit = n - 1, float(t.ppf(1 - level / 2, n - 1))

    def shortfall(delta: float) -> float:
        nc = delta * math.sqrt(n) / sd
        found = float(nct.sf(crit, df, nc) + nct.cdf(-crit, df, nc))
        if math.isnan(found):  # scipy's non-central t gives up far in the tail at large df: the normal limit
            found = float(norm.sf(crit - nc) + norm.cdf(-crit - nc))
        return found - power

    hi = sd
    while shortfall(hi) < 0:
        hi *= 2
    return float(brentq(shortfall, 0.0, hi, xtol=1e-12 * max(sd, 1e-300)))


def holm(pvalues) -> list[float]:
    """Holm-Bonferroni adjusted p-values (step-down, kept monotone, capped at 1), in the order given: a hypothesis
    holds at family-wise level a when its adjusted p-value is below a. One p-value comes back unchanged."""
    p = [float(x) for x in pvalues]
    m = len(p)
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p[i])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def adjusted_half_width(d: float, half_width: float, n: int, p: float, p_holm: float, level: float = 0.05) -> float:
    """The half-width of the interval adjusted the way Holm adjusts the verdict: the paired t-interval at confidence
    1 - level * p / p_holm (each comparison's own Holm level), which excludes 0 exactly when p_holm < level; so an
    interval drawn with it agrees with the family's verdict (the headline figure). inf for one seed, 0 for identical
    arms."""
    sd = sd_from_half_width(half_width, int(n))
    if not math.isfinite(sd):
        return math.inf
    if sd == 0 or p == 0:
        return 0.0
    from scipy.stats import t

    alpha = level * min(1.0, p / p_holm) if p_holm > 0 else level
    return float(t.ppf(1 - alpha / 2, int(n) - 1) * sd / math.sqrt(int(n)))


def compare_runs(values_a, values_b) -> Comparison:
    """Paired values of a against b (PAIRED_RULE): position i of each is the same seed. Pairs with a
    non-finite value on either side are left out (n counts the rest)."""
    a, b = np.asarray(values_a, dtype=float), np.asarray(values_b, dtype=float)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"compare_runs pairs values seed by seed: got {a.shape} and {b.shape} values")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if a.size == 0:
        raise ValueError("compare_runs needs at least one pair of finite values")
    d = a - b
    n = int(d.size)
    hw = t_quantile(n) * float(d.std(ddof=1)) / math.sqrt(n) if n > 1 else math.inf
    return Comparison(float(a.mean()), float(b.mean()), float(d.mean()), hw, n)


@dataclass(frozen=True)
class SpreadComparison:
    """The spread over seeds of a against b on paired runs (`compare_spread`): each arm's standard deviation over the
    shared seeds, their ratio sd_a / sd_b, the Pitman–Morgan test's correlation r and two-sided p over n seeds."""

    sd_a: float
    sd_b: float
    ratio: float
    r: float
    p: float
    n: int

    @property
    def verdict(self) -> str:
        """'lower' (a spreads less than b) or 'higher' when p < 0.05, else 'no difference resolved'."""
        if not self.p < 0.05:
            return UNRESOLVED
        return "lower" if self.ratio < 1 else "higher"


def compare_spread(values_a, values_b) -> SpreadComparison:
    """Whether arm a's late accuracy varies over seeds less (or more) than arm b's, on paired runs (position i of each
    is the same seed): the Pitman–Morgan test. With paired values the two variances are equal exactly when the sum
    a + b and the difference a - b are uncorrelated; r = corr(a + b, a - b) is tested by t = r sqrt((n - 2) / (1 - r²))
    with n - 2 degrees of freedom. Its p-values are not the paired t-test's, so a table of these comparisons is a
    family of its own (`holm` over it); at least 3 pairs."""
    a, b = np.asarray(values_a, dtype=float), np.asarray(values_b, dtype=float)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"compare_spread pairs values seed by seed: got {a.shape} and {b.shape} values")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    n = int(a.size)
    if n < 3:
        raise ValueError(f"compare_spread needs at least 3 pairs of finite values; got {n}")
    sd_a, sd_b = float(a.std(ddof=1)), float(b.std(ddof=1))
    s, d = a + b, a - b
    if s.std() == 0 or d.std() == 0:
        r = 0.0
    else:
        r = float(np.corrcoef(s, d)[0, 1])
    from scipy.stats import t

    stat = r * math.sqrt((n - 2) / (1 - r * r)) if abs(r) < 1 else math.copysign(math.inf, r)
    p = float(2 * t.sf(abs(stat), n - 2))
    return SpreadComparison(sd_a, sd_b, sd_a / sd_b if sd_b > 0 else math.inf, r, p, n)


def resolution(comparisons) -> float:
    """The smallest difference a set of comparisons could resolve: their smallest half-width."""
    widths = [c.half_width for c in comparisons]
    return min(widths) if widths else math.inf


VERDICT_COLUMNS = ["claim", "comparison", "measure", "mean_a", "mean_b", "d", "half_width", "n", "verdict", "by", "a",
                   "b"]


ADJUSTED_COLUMNS = ["p", "p_holm", "verdict_holm", "detectable"]


def verdict_table(rows, measure: str = "late_acc"):
    """The verdicts a notebook decides, one row per (claim, comparison, Comparison[, measure]) in `rows` (the
    measure defaults to `measure`): the claim it
    bears on ("C1".."C4"), what was compared ("FedFrozen - FedAvg, dirichlet:0.1"), the means, d, the 95%
    half-width, n and the verdict (VERDICT_COLUMNS), then the rows judged as one family (`adjust`: p, Holm's
    p and verdict, the difference detectable at 80% power). The claim notebooks write it beside their tables
    (figures/NN_verdicts.csv) and the headline figure and the README's numbers are read from it."""
    import pandas as pd

    out = []
    for row in rows:
        claim, label, c, row_measure = (*row, measure) if len(row) == 3 else row
        if not isinstance(c, Comparison):
            raise TypeError(f"verdict_table rows are (claim, comparison, Comparison[, measure]); got "
                            f"{type(c).__name__} for {label!r}")
        out.append(dict(claim=claim, comparison=label, measure=row_measure, mean_a=c.mean_a, mean_b=c.mean_b, d=c.diff,
                        half_width=c.half_width, n=c.n, verdict=c.verdict, by=json.dumps(list(c.by)),
                        a=json.dumps(list(c.a)), b=json.dumps(list(c.b))))
    return adjust(pd.DataFrame(out, columns=VERDICT_COLUMNS))


def adjust(table, level: float = 0.05, power: float = POWER):
    """A verdict table (columns d, half_width, n) judged as one family (FAMILY_RULE), as a copy with: `p` (the
    paired t-test), `p_holm` (Holm-Bonferroni over the table's rows), `verdict_holm` ('higher'/'lower' when
    p_holm < level, else 'no difference resolved') and `detectable` (the smallest difference each comparison
    finds with probability `power`, from its own sd(d) and n). d, half-width and n are sufficient statistics
    of the paired t-test, so a table written before this existed is adjusted exactly."""
    out = table.copy()
    out["p"] = [paired_p(d, h, int(n)) for d, h, n in zip(out["d"], out["half_width"], out["n"])]
    out["p_holm"] = holm(out["p"]) if len(out) else []
    out["verdict_holm"] = [("higher" if d > 0 else "lower") if p < level else UNRESOLVED
                           for d, p in zip(out["d"], out["p_holm"])]
    out["detectable"] = [detectable(sd_from_half_width(h, int(n)), int(n), power)
                         for h, n in zip(out["half_width"], out["n"])]
    return out
