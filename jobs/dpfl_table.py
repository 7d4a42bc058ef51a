"""Tables for docs/reproductions/dpfl.md, from the runs of jobs/dpfl-grid.sh.

    python jobs/dpfl_table.py mnist1d            # accuracy table
    python jobs/dpfl_table.py --flip RUN [RUN..]  # malicious share of benign clients' collaborators

Accuracy per run: unweighted mean over clients of the last round's test accuracy,
and "best-val" (the paper's report: per client, the test accuracy at the round
of its best validation accuracy). Mean and std over the seeds found. A second
table gives the same for DPFL's models after local training, before aggregation
(dpfl/trained_*, what the authors' code validates).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mpifl.logging.h5 import open_run

METHODS = ["dpfl-inf", "dpfl-0.2N", "dpfl-0.1N", "dpfl-0.05N", "random-0.2N", "random-0.1N", "random-0.05N", "fedavg",
           "local"]


def accs(path: Path, trained: bool = False) -> tuple[float, float]:
    r = open_run(path)
    if trained:  # DPFL's models after local training, before aggregation
        test, val = r.get("dpfl/trained_test_acc"), r.get("dpfl/trained_val_acc")
    else:
        test, val = r.metric("test_acc"), r.metric("val_acc")
    best = np.nanargmax(np.where(np.isnan(val), -np.inf, val), axis=0)
    return float(np.nanmean(test[-1])), float(np.nanmean(test[best, np.arange(test.shape[1])]))


def table(root: Path, dataset: str, trained: bool = False) -> None:
    if trained:
        print("\nDPFL and random graph, each client's model after local training, before aggregation "
              "(dpfl/trained_*):\n")
    print(f"| method | {dataset} Dir(0.1) last | Dir(0.1) best-val | Patho(3) last | Patho(3) best-val |")
    print("|---|---|---|---|---|")
    for m in METHODS:
        if trained and not m.startswith(("dpfl", "random")):
            continue
        cells = []
        for part in ("dir", "patho"):
            runs = sorted(root.glob(f"dpfl-{dataset}-{part}-{m}-s*/run.h5"))
            vals = np.array([accs(p, trained) for p in runs]) if runs else np.full((1, 2), np.nan)
            for c in range(2):
                cells.append(f"{100 * vals[:, c].mean():.2f} ± {100 * vals[:, c].std():.2f} (n={len(runs)})")
        print(f"| {m} | " + " | ".join(cells) + " |")


def flip(paths: list[str]) -> None:
    print("| run | benign->malicious share of collaborators, first round | last round | "
          "mean per-benign-client share, last round | malicious->benign share, last round |")
    print("|---|---|---|---|---|")
    for p in paths:
        r = open_run(p)
        bad = r.get("dpfl/malicious").astype(bool)
        coll = r.get("dpfl/collaborators")
        out = []
        for t in (0, -1):
            c = coll[t][~bad]
            out.append(c[:, bad].sum() / max(c.sum(), 1))
        c = coll[-1][~bad]
        per = c[:, bad].sum(1) / np.maximum(c.sum(1), 1)
        cm = coll[-1][bad]
        mb = cm[:, ~bad].sum() / max(cm.sum(), 1)
        print(f"| {Path(p).name} | {100 * out[0]:.1f}% | {100 * out[1]:.1f}% | {100 * per.mean():.1f}% "
              f"| {100 * mb:.1f}% |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", nargs="?", default="mnist1d")
    ap.add_argument("--root", default="results")
    ap.add_argument("--flip", nargs="+")
    a = ap.parse_args()
    if a.flip:
        flip(a.flip)
    else:
        table(Path(a.root), a.dataset)
        table(Path(a.root), a.dataset, trained=True)
