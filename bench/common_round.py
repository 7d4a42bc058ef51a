"""A sweep's table at the last round every run reached: for runs stopped before
their planned rounds (a time limit on a lent GPU), each method's summary over the
same rounds, so no method is compared at a later round than another.

    python bench/common_round.py results/dpfl-table1-gpu            # best_acc (DPFL's metric)
    python bench/common_round.py results/dpfl-table1-gpu --metric final_acc

Per run: ``best_acc`` = per client, test accuracy at its best validation round among
rounds 1..R (``mpifl.analysis.summary.best_val``), averaged over clients; ``final_acc`` = the
mean test accuracy at round R. R is the smallest number of complete rounds over the
runs found (runs with fewer than ``--min-rounds`` are listed and left out).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mpifl.analysis.summary import best_val, find_logs, nanmean  # noqa: E402
from mpifl.logging.h5 import open_run  # noqa: E402 - after the sys.path line


def label(cfg: dict) -> str:
    algo = cfg["algorithm"]["name"]
    if algo != "dpfl":
        return algo
    d = cfg["dpfl"]
    return f"dpfl{' random graph' if d.get('random_graph') else ''} B={d['budget']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--metric", choices=["best_acc", "final_acc"], default="best_acc")
    ap.add_argument("--min-rounds", type=int, default=2)
    a = ap.parse_args()
    runs = []
    for path in find_logs([a.root]):
        try:
            r = open_run(path)
            runs.append((label(r.config), r, r.metric("test_acc"), r.metric("val_acc")))
        except Exception as e:  # noqa: BLE001 - a run killed before its first round is reported, not fatal
            print(f"skipped {path}: {type(e).__name__}: {e}")
    short = [(n, len(t)) for n, _, t, _ in runs if len(t) < a.min_rounds]
    for n, k in short:
        print(f"left out {n}: {k} round(s)")
    runs = [x for x in runs if len(x[2]) >= a.min_rounds]
    if not runs:
        print("no run reached", a.min_rounds, "rounds")
        return
    R = min(len(t) for _, _, t, _ in runs)
    print(f"{len(runs)} runs, compared over their first {R} rounds (planned: "
          f"{sorted({int(r.config['run']['rounds']) for _, r, _, _ in runs})})\n")
    print(f"| method | {a.metric} at round {R} (%) | rounds done |")
    print("| --- | ---: | ---: |")
    rows = []
    for name, _, test, val in runs:
        v = best_val(val[:R], test[:R]) if a.metric == "best_acc" else test[R - 1]
        rows.append((float(nanmean(v)) * 100, name, len(test)))
    for acc, name, done in sorted(rows, reverse=True):
        print(f"| {name} | {acc:.2f} | {done} |")


if __name__ == "__main__":
    main()
