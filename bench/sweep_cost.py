"""What a sweep's runs cost, from their logs: per method, the runs, their
point-minutes (the sum over runs of the rounds' wall time, ``/rounds/wall_s``:
start-up and the final evaluation's write are not in it), the longest run and its
cell, and the span from the first run's start to the last log's write. The pages'
cost lines (docs/reproductions/*.md, "Cost") come from it.

    python bench/sweep_cost.py results/featshift-bn
    python bench/sweep_cost.py results/room-baselines4 --method scaffold feddyn
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

from mpifl.logging.h5 import open_run


def run_cost(run: Path) -> tuple[str, str, float, float, float]:
    """(method, cell, seconds of rounds, start, end as POSIX times) of one run directory."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    r = open_run(run / "run.h5")
    seconds = float(np.sum(r.get("rounds/wall_s")))
    start = datetime.fromisoformat(str(r.attrs["started_at"])).timestamp()
    cell = f"{cfg['data']['n_clients']} x {cfg['data']['train_per_client']}"
    return cfg["algorithm"]["name"], cell, seconds, start, (run / "run.h5").stat().st_mtime


def table(sweep: Path, methods: list[str] | None) -> str:
    by: dict[str, list[tuple[str, float, float, float]]] = defaultdict(list)
    for run in sorted((sweep / "runs").iterdir()):
        if (run / "run.h5").exists() and (run / "config.yaml").exists():
            method, cell, s, t0, t1 = run_cost(run)
            if not methods or method in methods:
                by[method].append((cell, s, t0, t1))
    out = ["| method | runs | point-minutes | longest run (min, cell) | first start - last write (UTC) |",
           "|---|---|---|---|---|"]

    def utc(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M")

    for method, rows in by.items():
        cell, longest, _, _ = max(rows, key=lambda r: r[1])
        total = sum(r[1] for r in rows)
        span = f"{utc(min(r[2] for r in rows))} - {utc(max(r[3] for r in rows))}"
        out.append(f"| {method} | {len(rows)} | {total / 60:.1f} | {longest / 60:.1f} ({cell}) | {span} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path, help="a sweep directory (its runs/ hold each point's run.h5 and config.yaml)")
    ap.add_argument("--method", nargs="*", help="only these algorithms")
    a = ap.parse_args()
    print(table(a.sweep, a.method))


if __name__ == "__main__":
    main()
