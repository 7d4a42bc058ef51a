"""Where a method's accuracy comes from: per cell, the last round's test accuracy of
each group of clients (the partition's true groups, ``/clients/cluster``: the label
permutation of the room, the input transform of the feature-shift room), mean over
a group's clients and then over seeds. A cell's mean over clients can hide one
group at chance; this shows it.
docs/reproductions/room.md, "FedBN in the feature-shift room".

    python bench/acc_by_group.py results/featshift-bn
    python bench/acc_by_group.py results/featshift-bn --method fedavg fedbn --cell 8x400
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

from mpifl.logging.h5 import open_run


def by_group(log: Path) -> np.ndarray:
    """``[K]`` the last round's mean test accuracy (in %) of each true group's clients."""
    r = open_run(log)
    cl = np.asarray(r.get("clients/cluster"))
    acc = np.asarray(r.get("metrics/test_acc")[-1], float)
    return np.array([100 * acc[cl == g].mean() for g in range(cl.max() + 1)])


def table(sweep: Path, methods: list[str] | None, cells: list[str] | None) -> str:
    rows: dict[tuple[str, int, int], list[np.ndarray]] = defaultdict(list)
    for run in sorted((sweep / "runs").iterdir()):
        if not (run / "run.h5").exists():
            continue
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        method, n, s = cfg["algorithm"]["name"], cfg["data"]["n_clients"], cfg["data"]["train_per_client"]
        if (methods and method not in methods) or (cells and f"{n}x{s}" not in cells):
            continue
        rows[(method, n, s)].append(by_group(run / "run.h5"))
    k = max(len(v[0]) for v in rows.values())
    out = ["| method | cell (clients x samples) | seeds | " + " | ".join(f"group {g}" for g in range(k)) + " |",
           "|---|---|---|" + "---|" * k]
    for (method, n, s), v in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        m = np.mean(v, 0)
        out.append(f"| {method} | {n} x {s} | {len(v)} | " + " | ".join(f"{x:.1f}" for x in m) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path, help="a sweep directory (its runs/ hold each point's run.h5 and config.yaml)")
    ap.add_argument("--method", nargs="*", help="only these algorithms")
    ap.add_argument("--cell", nargs="*", help="only these cells, as CLIENTSxSAMPLES (8x400)")
    a = ap.parse_args()
    print(table(a.sweep, a.method, a.cell))


if __name__ == "__main__":
    main()
