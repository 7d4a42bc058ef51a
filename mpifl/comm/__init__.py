"""Everything MPI, and the only package that imports mpi4py: the verbs the
algorithms use on flat float32 rows (:mod:`.collectives`: placement, point to
point, the ordered sums) and the machine under a run (:mod:`.machine`: the world,
nodes, device, threads, versions, the crash exit). Algorithms receive a
:class:`Comm` and never import this package.
"""

from mpifl.comm.collectives import F32, BufferPool, Comm, Placement, agree
from mpifl.comm.machine import (
    cores_for_rank,
    exchange_timing,
    exit_all,
    faithful_cuda,
    keep_freed_memory,
    node_local_rank,
    node_of_ranks,
    pick_device,
    report_crash,
    set_threads,
    solo,
    versions,
    world,
)

__all__ = ["F32", "BufferPool", "Comm", "Placement", "agree", "cores_for_rank", "exchange_timing", "exit_all",
           "faithful_cuda", "keep_freed_memory", "node_local_rank", "node_of_ranks", "pick_device", "report_crash",
           "set_threads", "solo", "versions", "world"]
