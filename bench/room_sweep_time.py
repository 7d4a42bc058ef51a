"""The logs of two runs of bench/room_sweep_time.sh, compared run by run: how many
are the same bit for bit (every dataset but the wall-clock timings), and for those
that differ, the final mean test accuracy of each, paired by run (mean difference
and its 95% t-interval). Performance V, item 6.

    python bench/room_sweep_time.py --compare /tmp/mpifl-roomtime-BEFORE /tmp/mpifl-roomtime-AFTER
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mpifl.logging.h5 import open_run  # noqa: E402 - after the sys.path line

TIMINGS = {"rounds/wall_s", "rounds/comm_s", "rounds/compute_s"}


def same(a, b) -> bool:
    ka, kb = set(a.keys()) - TIMINGS, set(b.keys()) - TIMINGS
    if ka != kb or a.n_rounds != b.n_rounds:
        return False
    return all(np.array_equal(a.get(k), b.get(k), equal_nan=True) for k in ka)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", nargs=2, required=True, metavar="OUT")
    a = ap.parse_args()
    roots = [Path(p) / "runs" / "room-one-seed" / "runs" for p in a.compare]
    names = sorted(p.name for p in roots[0].iterdir() if (p / "run.h5").exists())
    differ = []
    for n in names:
        x, y = (open_run(r / n) for r in roots)
        if not same(x, y):
            fx, fy = (float(np.nanmean(r.metric("test_acc")[-1])) for r in (x, y))
            differ.append((n, fx, fy))
    print(f"{len(names)} runs: {len(names) - len(differ)} the same bit for bit, {len(differ)} differ")
    for n, fx, fy in differ:
        print(f"  {n}: final test_acc {fx:.4f} -> {fy:.4f}")
    if len(differ) > 1:
        d = np.array([fy - fx for _, fx, fy in differ]) * 100
        lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        print(f"paired difference (after - before), points: {d.mean():+.2f} [{lo:+.2f}, {hi:+.2f}], {len(d)} runs")


if __name__ == "__main__":
    main()
