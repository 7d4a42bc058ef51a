"""Per-rank setup: thread budget, device choice, setup errors seen together."""

import os
import platform

import numpy as np
import pytest
import torch

from mpifl.comm import agree, cores_for_rank, keep_freed_memory, node_local_rank, node_of_ranks, pick_device
from mpifl.errors import ConfigError


def _on_my_node(mpi) -> tuple[int, int]:
    """(ranks before this one on its node, ranks on its node), from the node numbers."""
    nodes, rank = node_of_ranks(mpi), mpi.Get_rank()
    return int(np.sum(nodes[:rank] == nodes[rank])), int(np.sum(nodes == nodes[rank]))


def test_nodes_are_numbered_by_their_lowest_rank(mpi):
    nodes = node_of_ranks(mpi)
    local, per_node = node_local_rank(mpi)
    assert len(nodes) == mpi.Get_size() and nodes[0] == 0
    assert (local, per_node) == _on_my_node(mpi)
    assert all(nodes[r] <= max(nodes[:r], default=0) + 1 for r in range(len(nodes)))  # 0, 1, ... in order
    assert mpi.allgather(nodes.tolist()) == [nodes.tolist()] * mpi.Get_size()


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_the_gpu_is_the_node_local_rank_modulo_the_nodes_gpus(mpi, monkeypatch, gpus):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    local, _ = _on_my_node(mpi)
    assert pick_device("auto", mpi) == torch.device("cuda", local % gpus)
    assert pick_device("cuda", mpi) == torch.device("cuda", local % gpus)
    assert pick_device("cpu", mpi).type == "cpu"


def test_threads_divide_each_nodes_cores_among_its_own_ranks(mpi, monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))  # an unbound 8-core node
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    _, per_node = _on_my_node(mpi)
    assert cores_for_rank(mpi) == max(1, 8 // per_node)  # not 8 // the job's ranks
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3})  # a launcher that bound us to 2 cores
    assert cores_for_rank(mpi) == 2


def test_threads_split_the_node_among_its_ranks(mpi, monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    _, per_node = node_local_rank(mpi)
    affinity = len(os.sched_getaffinity(0))
    cores = cores_for_rank(mpi)
    if affinity < (os.cpu_count() or affinity):  # the launcher bound us: keep its share
        assert cores == affinity
    else:
        assert cores == max(1, affinity // per_node)
    assert cores * min(per_node, affinity) <= max(affinity, per_node)  # never oversubscribed


def test_slurm_cpus_per_task_wins(mpi, monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert cores_for_rank(mpi) == 3


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc parameters")
def test_freed_memory_stays_in_the_heap_unless_the_user_tuned_malloc(monkeypatch):
    for k in [k for k in os.environ if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"]:
        monkeypatch.delenv(k)
    assert keep_freed_memory()
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert not keep_freed_memory()
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")
    assert not keep_freed_memory()


def test_device_is_cpu_without_gpu(mpi):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert pick_device("auto", mpi).type == "cpu"
    with pytest.raises(ConfigError, match="run.device='cuda'"):
        pick_device("cuda", mpi)


def test_gpu_runs_are_float32_and_repeatable(monkeypatch):
    """What pick_device sets before a rank takes a GPU (comm.faithful_cuda): no TF32,
    no autotuner, deterministic cuDNN, a fixed cuBLAS workspace."""
    from mpifl.comm import faithful_cuda

    b = torch.backends
    flags = [(b.cuda.matmul, "allow_tf32", True), (b.cudnn, "allow_tf32", True), (b.cudnn, "benchmark", True),
             (b.cudnn, "deterministic", False)]
    saved = [getattr(mod, name) for mod, name, _ in flags]  # torch's flag objects: no monkeypatch.setattr
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        for mod, name, value in flags:
            setattr(mod, name, value)
        faithful_cuda()
        assert not b.cuda.matmul.allow_tf32 and not b.cudnn.allow_tf32 and not b.cudnn.benchmark
        assert b.cudnn.deterministic and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        for (mod, name, _), value in zip(flags, saved):
            setattr(mod, name, value)


def test_error_on_one_rank_reaches_all(mpi):
    def setup():
        if mpi.Get_rank() == mpi.Get_size() - 1:
            raise ConfigError("data.root='/nope' is not allowed; no such folder")
        return "ok"

    with pytest.raises(ConfigError, match="data.root"):
        agree(mpi, setup)
    assert agree(mpi, lambda: mpi.Get_rank()) == mpi.Get_rank()


@pytest.mark.parametrize("over", [{"data": {"n_clients": 10 ** 9}}, {"model": {"hidden": [10 ** 8]}},
                                  {"run": {"threads": 10 ** 5}}])
def test_sizes_refused_on_every_rank_together_before_allocating(mpi, over):
    from mpifl import config
    from mpifl.run import runtime

    raw = {"data": {"name": "synthetic", "n_clients": 8}, **over}
    with pytest.raises(ConfigError) as e:
        runtime.setup(config.from_dict(raw, n_ranks=mpi.Get_size()), mpi)
    assert mpi.allgather(str(e.value)) == [str(e.value)] * mpi.Get_size()  # the same line on every rank
    assert "is too large for this machine" in str(e.value) or "is not allowed here" in str(e.value)
