"""Time of ``Comm.weighted_sum`` (the ordered sum behind FedAvg's average) on one
rank: the local part of every round's average, a rank's clients added in order.

    python bench/ordered_sum.py                                   # this checkout
    PYTHONPATH=/path/to/other python bench/ordered_sum.py         # another checkout's comm.py

Prints, per (clients, parameters), the median of --repeats calls on one thread and a
checksum of the result (the same bits on both sides when only the speed changed).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import numpy as np
import torch
from mpi4py import MPI

from mpifl.comm import Comm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["50x23050", "1000x23050", "100x235146"],
                    help="CLIENTSxPARAMETERS on the rank")
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(1)
    import mpifl
    print(f"mpifl from {mpifl.__file__}")
    for size in a.sizes:
        n, P = (int(v) for v in size.split("x"))
        gen = torch.Generator().manual_seed(0)
        rows = torch.randn(n, P, generator=gen)
        w = np.random.default_rng(0).random(n)
        comm = Comm(n, MPI.COMM_WORLD)
        comm.weighted_sum(rows, w)  # warm: buffers
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            out = comm.weighted_sum(rows, w)
            times.append(time.perf_counter() - t0)
        digest = hashlib.sha1(out.numpy().tobytes()).hexdigest()[:12]
        print(f"  {n:5d} clients x {P:7d} parameters: {statistics.median(times) * 1e3:7.2f} ms  result {digest}")


if __name__ == "__main__":
    main()
