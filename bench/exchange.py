"""Model exchange throughput between two ranks: mpifl's comm verbs against raw
mpi4py buffer calls moving the same bytes, and against pickling a state_dict.

    mpiexec -n 2 python bench/exchange.py                  # 0.5M and 11.7M parameters
    mpiexec -n 2 python bench/exchange.py --params 500000 --repeats 20

Pairs (each timed the same way: barrier, then the slowest rank's wall time; the
best of ``--repeats``):

- ``Comm.pull`` (rank 0's client fetches rank 1's row)  vs  ``Send``/``Recv`` of P floats
  into a preallocated buffer, and vs ``send``/``recv`` of a pickled ``state_dict``
  holding the same parameters (as peers exchange models);
- ``Comm.ring`` (one step: the blocks swap)               vs  ``Sendrecv`` of P floats;
- ``Comm.weighted_sum`` (FedAvg's average)               vs  ``torch.mv(rows.T, w)`` + ``Allreduce``
  of the P floats (both compute the rank's weighted sum first).

The state_dict for 11.7M parameters is torchvision's ResNet-18 (``weights=None``);
for other sizes, a stack of 512-wide linear layers of about that size.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mpifl.comm import Comm


def state_dict(P: int) -> dict[str, torch.Tensor]:
    if P > 10_000_000:
        import torchvision

        return {k: v for k, v in torchvision.models.resnet18(weights=None).state_dict().items()
                if v.is_floating_point()}
    sd, left, i = {}, P, 0
    while left > 0:
        k = min(left, 512 * 512)
        sd[f"layer{i}.weight"] = torch.randn(k)
        left -= k
        i += 1
    return sd


def timed(mpi: MPI.Comm, fn, repeats: int) -> float:
    """Best over repeats of the slowest rank's time for one call of ``fn`` (the best filters out
    the scheduling stalls of a shared machine, which hit short calls hardest)."""
    fn()  # warm-up: connections, first-touch of buffers
    out = []
    for _ in range(repeats):
        mpi.Barrier()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        out.append(mpi.allreduce(dt, op=MPI.MAX))
    return float(np.min(out))


def measure(mpi: MPI.Comm, sd: dict[str, torch.Tensor], repeats: int) -> dict[str, float]:
    """Best seconds of each verb and baseline moving the parameters of ``sd``."""
    rank = mpi.Get_rank()
    P = sum(v.numel() for v in sd.values())
    comm = Comm(2, mpi)  # one client per rank
    rows = torch.randn(1, P)
    buf = np.empty(P, np.float32)
    send = rows.numpy()[0]

    def raw_p2p():
        if rank == 1:
            mpi.Send([send, MPI.FLOAT], dest=0, tag=1)
        else:
            mpi.Recv([buf, MPI.FLOAT], source=1, tag=1)

    def pull():
        comm.pull(rows, [[1]] if rank == 0 else [[]])

    def pickled():
        if rank == 1:
            mpi.send(sd, dest=0, tag=2)
        else:
            mpi.recv(source=1, tag=2)

    def raw_sendrecv():
        mpi.Sendrecv([send, MPI.FLOAT], dest=1 - rank, sendtag=3, recvbuf=[buf, MPI.FLOAT], source=1 - rank,
                     recvtag=3)

    def ring():
        comm.ring(rows, lambda ids, r: None)

    res = np.empty_like(buf)

    w = torch.ones(1)

    def raw_allreduce():  # a hand-written FedAvg: the same local weighted sum (torch), then Allreduce
        mpi.Allreduce(torch.mv(rows.t(), w).numpy(), res, op=MPI.SUM)

    def wsum():
        comm.weighted_sum(rows, np.ones(1))

    t = {k: timed(mpi, fn, repeats) for k, fn in
         [("raw_p2p", raw_p2p), ("pull", pull), ("pickled", pickled), ("raw_sendrecv", raw_sendrecv),
          ("ring", ring), ("raw_allreduce", raw_allreduce), ("weighted_sum", wsum)]}
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", nargs="+", type=int, default=[500_000, 0])  # 0: ResNet-18
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    mpi = MPI.COMM_WORLD
    assert mpi.Get_size() == 2, "run under mpiexec -n 2"
    rank = mpi.Get_rank()
    torch.set_num_threads(1)
    if rank == 0:
        print(f"# 2 ranks, {MPI.Get_library_version().splitlines()[0].strip()}, "
              f"load average {os.getloadavg()[0]:.2f}, best of {a.repeats}")
        print("| P | bytes | verb | mpifl ms | raw mpi4py ms | mpifl / raw throughput | pickled state_dict ms "
              "| pickled / mpifl time |")
        print("|---|---|---|---|---|---|---|---|")
    for P in a.params:
        sd = state_dict(P if P else 11_700_000)
        P = sum(v.numel() for v in sd.values())
        t = measure(mpi, sd, a.repeats)
        if rank == 0:
            nbytes = P * 4
            for verb, raw in (("pull", "raw_p2p"), ("ring", "raw_sendrecv"), ("weighted_sum", "raw_allreduce")):
                pk = f"{t['pickled'] * 1e3:.2f}" if verb == "pull" else ""
                ratio = f"{t['pickled'] / t[verb]:.1f}x" if verb == "pull" else ""
                print(f"| {P:,} | {nbytes / 2**20:.1f} MiB | {verb} vs {raw.removeprefix('raw_')} "
                      f"| {t[verb] * 1e3:.2f} | {t[raw] * 1e3:.2f} | {t[raw] / t[verb]:.2f} | {pk} | {ratio} |",
                      flush=True)
    if rank == 0:
        print(f"# load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
