"""Per-rank setup: thread budget, device choice, setup errors seen together."""

import os

import pytest
import torch

from mpifl.comm import agree, cores_for_rank, node_local_rank, pick_device
from mpifl.errors import ConfigError


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


def test_device_is_cpu_without_gpu(mpi):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert pick_device("auto", mpi).type == "cpu"
    with pytest.raises(ConfigError, match="run.device='cuda'"):
        pick_device("cuda", mpi)


def test_error_on_one_rank_reaches_all(mpi):
    def setup():
        if mpi.Get_rank() == mpi.Get_size() - 1:
            raise ConfigError("data.root='/nope' is not allowed; no such folder")
        return "ok"

    with pytest.raises(ConfigError, match="data.root"):
        agree(mpi, setup)
    assert agree(mpi, lambda: mpi.Get_rank()) == mpi.Get_rank()
