"""Paired comparisons over seeds: seed s gives every method the same partition
and initial weights, so two methods are compared by their per-seed differences,
not by two independent spreads.

The interval is Student's t on the differences: mean ± t_{n-1, (1+level)/2} ·
sd / sqrt(n), sd the sample std (ddof 1). One seed gives a mean and no interval.
Its test, :func:`paired_p`, excludes 0 at level 0.95 exactly where the interval
does; over many cells at once, :func:`holm` adjusts their p-values so that all
of them hold together at that level (Holm's step-down: a family-wise error rate).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats as _st


def mean_std(values: Sequence[float], ddof: int = 1) -> tuple[float, float]:
    """(mean, std) of the values that are not NaN; NaN for a mean of nothing and
    for a std of ddof values or fewer."""
    x = np.asarray([v for v in values if not math.isnan(v)], float)
    if len(x) == 0:
        return math.nan, math.nan
    return float(x.mean()), float(x.std(ddof=ddof)) if len(x) > ddof else math.nan


def paired_interval(diffs: Sequence[float], level: float = 0.95) -> tuple[float, float, float, int]:
    """(mean, low, high, n) of the differences; NaN values are left out; low and
    high are NaN below two values. A zero spread gives the mean as both ends."""
    d = np.asarray([v for v in diffs if not math.isnan(v)], float)
    n = len(d)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(d.mean())
    if n < 2:
        return mean, math.nan, math.nan, n
    half = float(_st.t.ppf((1 + level) / 2, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def verdict(low: float, high: float) -> str:
    """above: the interval lies above 0; below: under it; else (or no interval) level."""
    if not math.isnan(low) and low > 0:
        return "above"
    if not math.isnan(high) and high < 0:
        return "below"
    return "level"


def paired_p(diffs: Sequence[float]) -> float:
    """Two-sided p-value of the paired t-test that the differences' mean is 0 (NaN
    values left out): NaN below two values; 1 where all are 0, 0 where they are all
    one other value (no spread: a shift beyond any noise)."""
    d = np.asarray([v for v in diffs if not math.isnan(v)], float)
    if len(d) < 2:
        return math.nan
    if float(d.std(ddof=1)) == 0.0:
        return 1.0 if float(d.mean()) == 0.0 else 0.0
    with warnings.catch_warnings():  # differences equal up to float rounding: a p near 0, no warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(_st.ttest_1samp(d, 0.0).pvalue)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``pvalues`` (same order; NaN kept as NaN and
    not counted): the k-th smallest of m is multiplied by m - k + 1, made
    non-decreasing, capped at 1. A cell whose adjusted p is under 0.05 differs with
    all the family's tests held to 5% together."""
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    out = [math.nan] * len(pvalues)
    running = 0.0
    for k, i in enumerate(sorted(idx, key=lambda j: pvalues[j])):
        running = max(running, min(1.0, (len(idx) - k) * pvalues[i]))
        out[i] = running
    return out


def holm_verdict(mean: float, p_adjusted: float, alpha: float = 0.05) -> str:
    """above/below where the Holm-adjusted p is under ``alpha`` (the sign of the mean
    difference), else (or no p) level: :func:`verdict` held to the family's error rate."""
    if math.isnan(p_adjusted) or p_adjusted >= alpha:
        return "level"
    return "above" if mean > 0 else "below"


# A sample "splits into modes" where, sorted, two neighbours with at least two values on
# each side are further apart than SPLIT_K times the pooled standard deviation within the
# two sides. Simulated on normal noise (tests/analysis/test_verdicts.py) it flags about 1 sample of 5
# values in 90, 1 of 4 values in 40, and almost never 10 values; pFedLIA's seeds 25, 25,
# 47, 47, 47 (their differences from Local) give a ratio near 140.
SPLIT_K = 10.0


def split_ratio(values: Sequence[float]) -> float:
    """The largest gap between sorted neighbours (at least two values either side,
    NaN left out) over the pooled within-side std (ddof 2 for the two means); 0 below
    four values, inf where the sides have no spread and the gap is not 0."""
    x = np.sort(np.asarray([v for v in values if not math.isnan(v)], float))
    n, best = len(x), 0.0
    for i in range(2, n - 1):
        lo, hi = x[:i], x[i:]
        spread = math.sqrt((float(((lo - lo.mean()) ** 2).sum()) + float(((hi - hi.mean()) ** 2).sum())) / (n - 2))
        gap = float(hi[0] - lo[-1])
        best = max(best, gap / spread if spread > 0 else (math.inf if gap > 0 else 0.0))
    return best


def split_modes(values: Sequence[float], k: float = SPLIT_K) -> bool:
    """Whether the values split into two separate modes (:data:`SPLIT_K`): where they
    do, a mean and a t-interval describe neither mode."""
    return split_ratio(values) > k


BOOT = 10_000  # bootstrap resamples
BOOT_SEED = 0  # the resamples' RNG seed: the same interval every time


def bootstrap_mean_ratio(num: Sequence[float], den: Sequence[float], level: float = 0.95,
                         n_boot: int = BOOT) -> tuple[float, float, float]:
    """(mean of num_i / den_i, low, high): the percentile bootstrap interval of the
    mean of the per-pair ratios, the pairs (seeds) resampled with replacement
    (``numpy.random.default_rng(BOOT_SEED)``), so no normal ratio is assumed. NaN
    ends below two pairs. At 5 pairs a percentile interval is narrower than a
    t-interval of the same values would be: it describes a skewed ratio, it is no test."""
    a, b = np.asarray(num, float), np.asarray(den, float)
    ratio = a / b
    mean = float(ratio.mean()) if len(ratio) else math.nan
    if len(ratio) < 2:
        return mean, math.nan, math.nan
    idx = np.random.default_rng(BOOT_SEED).integers(0, len(ratio), size=(n_boot, len(ratio)))
    means = ratio[idx].mean(axis=1)
    tail = 100 * (1 - level) / 2
    return mean, float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))
