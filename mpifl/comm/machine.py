"""The machine under a run: the world communicator, node-local ranks, the device
and thread count of each rank, library versions, a quick exchange timing, and
how a crashing rank brings the job down with one message."""

from __future__ import annotations

import ctypes
import os
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

ABORT_GRACE_S = 0.5  # seconds a crashing rank waits after printing before MPI_Abort (report_crash)


def world() -> MPI.Comm:
    return MPI.COMM_WORLD


def solo() -> MPI.Comm:
    """A communicator of this process alone (serial references in tests)."""
    return MPI.COMM_SELF


def node_local_rank(mpi_comm: MPI.Comm) -> tuple[int, int]:
    """(rank among the ranks on this node, ranks on this node)."""
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def node_of_ranks(mpi_comm: MPI.Comm) -> np.ndarray:
    """``[R]``: the node of every rank (collective). Nodes are the groups of
    ``MPI_COMM_TYPE_SHARED``, numbered 0, 1, ... in the order of their lowest rank."""
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        lowest = node.allreduce(mpi_comm.Get_rank(), op=MPI.MIN)
    finally:
        node.Free()
    return np.unique(mpi_comm.allgather(lowest), return_inverse=True)[1].astype(np.int64)


def pick_device(choice: str, mpi_comm: MPI.Comm) -> torch.device:
    """The one place a device is chosen: node-local rank -> GPU, else CPU."""
    from mpifl.errors import ConfigError

    has_cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if choice == "cpu" or (choice == "auto" and not has_cuda):
        return torch.device("cpu")
    if not has_cuda:
        raise ConfigError("run.device='cuda' is not allowed; no CUDA device is visible (use auto or cpu)")
    local, _ = node_local_rank(mpi_comm)
    faithful_cuda()
    return torch.device("cuda", local % torch.cuda.device_count())


def faithful_cuda() -> None:
    """float32 on a GPU as on the CPU, and the same bits each time a run is made
    (resume and checkpoints promise bitwise equality): TF32, which cuDNN's
    convolutions use by default, rounds operands to 10 mantissa bits; cuDNN's
    autotuner may pick another algorithm each run; cuBLAS needs a fixed workspace
    to reduce in a fixed order."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def cores_for_rank(mpi_comm: MPI.Comm) -> int:
    """Cores this rank may use without oversubscribing its node."""
    env = os.environ.get("SLURM_CPUS_PER_TASK")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    _, per_node = node_local_rank(mpi_comm)
    total = os.cpu_count() or affinity
    # a launcher that binds ranks already gave us our share; one that does not
    # leaves every rank the whole node, which we split evenly
    if affinity < total:
        return max(1, affinity)
    return max(1, affinity // per_node)


def set_threads(mpi_comm: MPI.Comm, threads: int = 0) -> int:
    n = threads or cores_for_rank(mpi_comm)
    torch.set_num_threads(n)
    return n


# glibc's mallopt parameters (malloc.h) and the values :func:`keep_freed_memory` sets
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for it on 64-bit machines
TRIM_THRESHOLD = 256 << 20


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks of up to ``MMAP_THRESHOLD`` in the heap,
    and up to ``TRIM_THRESHOLD`` of free heap, rather than hand them back to the
    system at once. A training step allocates and frees megabytes of activations
    (cnn_dpfl at 50 clients: a 6 MB repeat, 2-5 MB per layer), and memory handed
    back comes again as fresh pages, each faulted in and zeroed on first touch: a
    cnn_dpfl round of 50 clients a rank ran 0.176-0.208 s by default, 0.166-0.176
    s with these (bench/README.md, Performance IV). No result changes: where blocks
    come from is not what is computed. A process's resident memory then stays near
    its peak, as a job's does anyway. Not done where the user set glibc's malloc
    tunables, or where the C library has no ``mallopt`` (not glibc); returns
    whether it was done."""
    if "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") for k in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def versions() -> dict[str, str]:
    import mpi4py

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "mpi4py": mpi4py.__version__,
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
        "numpy": np.__version__,
    }


def exchange_timing(mpi_comm: MPI.Comm, n_floats: int = 1 << 18, repeats: int = 5) -> dict[str, float]:
    """Median seconds, on the slowest rank, of an Allreduce and of one ring step
    (Sendrecv to the right, from the left) of ``n_floats`` float32: a preflight
    figure that shows a broken or slow interconnect, not a benchmark."""
    buf = np.ones(n_floats, np.float32)
    out = np.empty_like(buf)
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    took: dict[str, list[float]] = {"allreduce": [], "sendrecv": []}
    mpi_comm.Barrier()
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        mpi_comm.Allreduce(buf, out, op=MPI.SUM)
        t1 = time.perf_counter()
        mpi_comm.Sendrecv(buf, dest=right, sendtag=14, recvbuf=out, source=left, recvtag=14)
        t2 = time.perf_counter()
        if i:  # the first exchange pays for setting up the connections
            took["allreduce"].append(t1 - t0)
            took["sendrecv"].append(t2 - t1)
    return {k: mpi_comm.allreduce(float(np.median(v)), op=MPI.MAX) for k, v in took.items()}


def exit_all(code: int) -> None:
    """Every rank leaves together with ``code`` (0, or a user error seen by all ranks).

    Exiting past the interpreter keeps ``python -m mpi4py`` from turning the exit
    into an MPI_Abort with its extra lines (the user sees only our one line), and
    skips the interpreter's teardown; whatever must reach the disk has been closed."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except OSError:  # a file on a full disk: what it held is lost either way
            pass
    MPI.Finalize()
    os._exit(code)


def report_crash(mpi_comm: MPI.Comm, exc: BaseException) -> None:
    """Print the error once, naming the rank, then take every rank down: a
    crash on one rank must never leave the others waiting in a collective."""
    import traceback

    rank = mpi_comm.Get_rank()
    if getattr(exc, "one_line", False):  # a known failure: its message says it all
        sys.stderr.write(f"mpifl: rank {rank} of {mpi_comm.Get_size()}: error: {exc}\n")
    else:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        sys.stderr.write(f"mpifl: rank {rank} of {mpi_comm.Get_size()} failed:\n{tb}")
    sys.stderr.flush()
    # the launcher's proxy forwards our stderr asynchronously and the abort tears it
    # down: aborting at once lost the message in 3 of 30 tries of mpiexec -n 4 here
    # (tests/test_reliability.py), none of 25 with this wait
    time.sleep(ABORT_GRACE_S)
    mpi_comm.Abort(1)
