"""HDF5 logging time as a share of round time (runtime + ``logging/h5.Writer``).

    python bench/logging_share.py                              # N = 100 and 1000, FedAvg
    mpiexec -n 2 python bench/logging_share.py --clients 1000

Runs a FedAvg (or local) job in-process (MLP on synthetic data, 50 samples per client, every
client trains each round) and times the runtime's per-round log step (gather of the
per-client rows to rank 0 + the writer's open/append/close of run.h5) against the
round itself. ``--dense-max`` sets ``log.dense_max`` (the N x N mixing matrix is
stored dense at or below it: at N = 1000 that is a 4 MB matrix per round);
``--flush-s`` sets ``log.flush_s`` (1, the default: run.h5 is written at most once a
second, each round in between appended to run.h5.rounds in one write; 0: every round
is written into run.h5 as it ends).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mpifl import config
from mpifl.comm import world
from mpifl.logging.h5 import Writer, open_run
from mpifl.run import roundlog, runtime


def measure(mpi, n: int, rounds: int, dense_max: int, out: str, algo: str, flush_s: float
            ) -> tuple[float, float, int]:
    """(mean round seconds without logging, mean log seconds per round, log bytes)."""
    cfg = config.load(None, [
        "data.name=synthetic", f"data.n_clients={n}", f"data.n_samples={50 * n}", "data.partition=iid",
        "data.synthetic_dim=40", f"run.rounds={rounds}", "run.threads=1", f"run.out_dir={out}",
        f"run.name=log{n}-{dense_max}-{algo}-{flush_s}", f"algorithm.name={algo}", f"log.dense_max={dense_max}",
        f"log.flush_s={flush_s}"],
        n_ranks=mpi.Get_size())
    spent: list[float] = []
    inner = roundlog.log_round

    def timed(*a, **k):
        mpi.Barrier()
        t0 = time.perf_counter()
        r = inner(*a, **k)
        mpi.Barrier()
        spent.append(time.perf_counter() - t0)
        return r

    close = Writer.close

    def timed_close(self):
        t0 = time.perf_counter()
        close(self)
        spent.append(time.perf_counter() - t0)

    roundlog.log_round = timed
    Writer.close = timed_close
    try:
        path = runtime.run(cfg, mpi)
    finally:
        roundlog.log_round = inner
        Writer.close = close
    if mpi.Get_rank() != 0:
        return 0.0, 0.0, 0
    wall = open_run(path).get("rounds/wall_s")
    return float(np.mean(wall)), float(np.sum(spent) / rounds), os.path.getsize(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", nargs="+", type=int, default=[100, 1000])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--flush-s", nargs="+", type=float, default=[1.0, 0.0])
    ap.add_argument("--dense-max", nargs="+", type=int, default=[1024, 64])
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "local"])
    a = ap.parse_args()
    mpi = world()
    out = mpi.bcast(tempfile.mkdtemp(prefix="mpifl-logbench-") if mpi.Get_rank() == 0 else None)
    rows = []
    for algo in a.algorithms:
        for n in a.clients:
            for dm in a.dense_max:
                for fs in a.flush_s:
                    rows.append((algo, n, dm, fs, *measure(mpi, n, a.rounds, dm, out, algo, fs)))
    if mpi.Get_rank() == 0:
        print(f"\n# {mpi.Get_size()} rank(s), load average {os.getloadavg()[0]:.2f}, mean over {a.rounds} rounds "
              "(log time includes the final flush)")
        print("| algorithm | N | log.dense_max | mixing stored | log.flush_s | round s (no log) | log s/round "
              "| log share of round | run.h5 size |")
        print("|---|---|---|---|---|---|---|---|---|")
        for algo, n, dm, fs, wall, log, size in rows:
            print(f"| {algo} | {n} | {dm} | {'dense' if n <= dm else 'compact'} | {fs:g} | {wall:.3f} | {log:.4f} "
                  f"| {100 * log / (wall + log):.1f}% | {size / 2**20:.2f} MiB |")


if __name__ == "__main__":
    main()
