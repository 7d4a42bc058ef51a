"""Statistics over seeds shared by the reports: the paired t-interval of differences."""

from __future__ import annotations

import math

import numpy as np


def paired_interval(diffs, level: float = 0.95) -> tuple[float, float, float, int]:
    """``(mean, low, high, n)``: the two-sided ``level`` Student-t interval of the
    mean of paired differences (one per seed: re-run minus record, method minus
    baseline). NaN differences are left out; with fewer than 2 the bounds are NaN
    (no spread to judge by), and with no spread at all the interval is the mean itself."""
    from scipy import stats

    d = np.asarray(diffs, float)
    d = d[~np.isnan(d)]
    n = len(d)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(d.mean())
    if n < 2:
        return mean, math.nan, math.nan, n
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half, n
