"""mpifl.check's MPI part on every rank: each problem it must name, with the
per-rank views of a path simulated by giving each rank its own override (on a
cluster the same string would lead to different filesystems)."""

import math
import os

import numpy as np
import pytest
import torch

from mpifl import check
from mpifl.comm import exchange_timing, node_of_ranks

QUICK = "jobs/quickstart.yaml"


def _run(mpi, *overrides):
    lines, problems = check.run(QUICK, list(overrides), mpi)
    assert mpi.allgather(problems) == [problems] * mpi.Get_size()  # every rank agrees
    return "\n".join(lines), problems


def test_the_quickstart_passes_and_the_report_names_ranks_nodes_and_probe(mpi, shared_tmp):
    size = mpi.Get_size()
    report, problems = _run(mpi, f"run.out_dir={shared_tmp}")
    assert problems == []
    assert f"{size} rank(s) on {node_of_ranks(mpi).max() + 1} node(s)" in report
    assert f"read back by {size} of {size} rank(s)" in report
    assert "Allreduce" in report and "torch" in report and "MPICH" in report
    mpi.Barrier()
    assert not [p for p in os.listdir(shared_tmp) if p.startswith(".mpifl-check")]  # the probe is gone


def test_more_ranks_than_clients_is_one_problem(mpi, shared_tmp):
    size = mpi.Get_size()
    _, problems = _run(mpi, f"run.out_dir={shared_tmp}", f"data.n_clients={max(1, size - 1)}")
    if size == 1:  # one client for the default config's 4 clusters: what mpifl.main refuses too
        assert problems == ["data.n_clusters=4 is not allowed; must be <= data.n_clients (1)"]
    else:
        assert len(problems) == 1 and problems[0].startswith(f"data.n_clients={size - 1} is fewer than the {size}")


def test_a_run_directory_each_rank_sees_differently_is_named_by_rank(mpi, shared_tmp):
    size = mpi.Get_size()
    _, problems = _run(mpi, f"run.out_dir={shared_tmp / f'rank{mpi.Get_rank()}'}")
    if size == 1:
        assert problems == []
    else:
        assert len(problems) == 1, problems
        assert "is not the same folder on every rank" in problems[0]
        assert f"rank(s) {'1' if size == 2 else f'1-{size - 1}'} " in problems[0]


def test_a_run_directory_rank_0_cannot_write(mpi):
    _, problems = _run(mpi, "run.out_dir=/proc/mpifl-check")
    assert len(problems) == 1 and "rank 0" in problems[0] and "cannot write a probe" in problems[0], problems


def test_a_missing_data_root_names_every_rank(mpi, shared_tmp):
    _, problems = _run(mpi, f"run.out_dir={shared_tmp}", "data.name=mnist", f"data.root={shared_tmp / 'absent'}")
    size = mpi.Get_size()
    assert len(problems) == 1, problems
    assert "does not exist on rank(s) " + ("0" if size == 1 else f"0-{size - 1}") in problems[0]


def test_a_data_root_with_other_files_on_some_ranks(mpi, shared_tmp):
    rank = mpi.Get_rank()
    root = shared_tmp / f"data{rank}"
    (root / "MNIST").mkdir(parents=True)
    (root / "MNIST" / "train.gz").write_bytes(b"x" * (1 if rank == 0 else 2))
    _, problems = _run(mpi, f"run.out_dir={shared_tmp}", "data.name=mnist", f"data.root={root}")
    if mpi.Get_size() == 1:  # one root, no MNIST in it: what mpifl.main refuses too
        assert len(problems) == 1 and problems[0].startswith("data.name='mnist': no usable dataset at "), problems
    else:
        assert len(problems) == 1 and "holds other files on rank(s) 1" in problems[0], problems


def test_exchange_timing_is_the_same_positive_figure_on_every_rank(mpi):
    t = exchange_timing(mpi, n_floats=1024, repeats=3)
    assert set(t) == {"allreduce", "sendrecv"}
    assert all(math.isfinite(v) and v > 0 for v in t.values())
    assert mpi.allgather(t) == [t] * mpi.Get_size()


def test_a_config_file_some_ranks_cannot_read_is_named_by_rank(mpi, shared_tmp):
    rank, size = mpi.Get_rank(), mpi.Get_size()
    path = QUICK if rank == 0 else str(shared_tmp / "elsewhere.yaml")
    lines, problems = check.run(path, [f"run.out_dir={shared_tmp}"], mpi)
    if size == 1:
        assert problems == [] and len(lines) > 1
    else:
        assert len(problems) == 1 and problems[0].startswith(f"rank(s) {'1' if size == 2 else f'1-{size - 1}'} ")
        assert "elsewhere.yaml' not found" in problems[0]


@pytest.mark.parametrize("gpus", [0, 1, 2, 4])
def test_the_report_gives_nodes_ranks_per_node_and_devices_per_rank(mpi, shared_tmp, monkeypatch, gpus):
    """With the node's GPUs mocked (0, 1, 2, 4 per node); run under simulated nodes
    (MPIR_CVAR_NUM_CLIQUES) the layouts are even or not."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    nodes = node_of_ranks(mpi)
    per_node = np.bincount(nodes)
    report, problems = _run(mpi, f"run.out_dir={shared_tmp}")
    assert problems == []
    lines = report.splitlines()
    assert f"{mpi.Get_size()} rank(s) on {len(per_node)} node(s)" in report
    assert sum(line.startswith("  node ") for line in lines) == len(per_node)
    span = f"{per_node.min()}" if per_node.min() == per_node.max() else f"{per_node.min()}-{per_node.max()}"
    layout = next(line for line in lines if line.startswith("  layout"))
    assert layout.startswith(f"  layout     {len(per_node)} node(s), {span} rank(s) per node; devices per rank: ")
    assert ("cpu" in layout) == (gpus == 0) and ("1 GPU each" in layout) == (gpus > 0)
    warnings = [line for line in lines if line.startswith("  warning")]
    expect = int(per_node.min() != per_node.max())  # uneven ranks per node
    if gpus:
        expect += sum(1 for k in per_node if k < gpus or k % gpus)  # idle or unevenly shared GPUs
    assert len(warnings) == expect, report
    if per_node.min() != per_node.max():
        assert any("uneven layout: " + ", ".join(map(str, per_node)) in w for w in warnings)
    for k in per_node:
        if gpus and k < gpus:
            assert any(f"{k} rank(s) use {k} of its {gpus} GPUs" in w for w in warnings)
        elif gpus and k % gpus:
            assert any(f"{k} ranks share its {gpus} GPUs unevenly" in w for w in warnings)


def test_nodes_are_named_as_slurm_names_them(mpi, shared_tmp, monkeypatch):
    # several slurmd on one host share a hostname; SLURM's node name tells them apart
    monkeypatch.setenv("SLURMD_NODENAME", f"n{node_of_ranks(mpi)[mpi.Get_rank()] + 1}")
    report, problems = _run(mpi, f"run.out_dir={shared_tmp}")
    assert problems == []
    for k in range(node_of_ranks(mpi).max() + 1):
        assert f"  node       n{k + 1}: rank(s) " in report


def test_the_memory_estimate_is_reported_and_a_run_that_cannot_fit_is_a_problem(mpi, shared_tmp):
    report, problems = _run(mpi, f"run.out_dir={shared_tmp}")
    assert "  memory     at least " in report and "per rank" in report and "of host memory" in report
    _, problems = _run(mpi, f"run.out_dir={shared_tmp}", "data.n_clients=1000000000", "run.threads=100000")
    assert any(p.startswith("data.n_clients=1000000000 is too large for this machine: the run needs at least")
               for p in problems)
    assert any("run.threads=100000 is not allowed here" in p for p in problems)


def test_the_report_says_whether_the_fused_conv_kernel_builds_and_on_is_a_problem_where_not(mpi, shared_tmp,
                                                                                           monkeypatch):
    from mpifl.train import fused

    # a conv net (too big for 8x8 digits: another problem line, not the one looked for here)
    conv = ["model.name=cnn_dpfl", "data.name=digits"]
    report, _ = _run(mpi, f"run.out_dir={shared_tmp}", "train.fused_conv=off", *conv)
    assert "conv       torch's kernels (train.fused_conv=off, train.batched=auto, model.name=cnn_dpfl)" in report
    report, _ = _run(mpi, f"run.out_dir={shared_tmp}")  # the quickstart's MLP: nothing to build
    assert "conv       torch's kernels (train.fused_conv=auto, train.batched=auto, model.name=mlp)" in report
    if mpi.Get_rank() == mpi.Get_size() - 1:  # one rank without a compiler
        monkeypatch.setattr(fused, "_build", lambda: "CalledProcessError: no compiler")
    report, problems = _run(mpi, f"run.out_dir={shared_tmp}", "train.fused_conv=on", *conv)
    assert f"does not build on rank(s) {mpi.Get_size() - 1} (" in report
    assert "(CalledProcessError: no compiler)" in report
    assert [p for p in problems if p.startswith("train.fused_conv=on but")], problems
    monkeypatch.undo()
    if not isinstance(fused._build(), str):
        report, problems = _run(mpi, f"run.out_dir={shared_tmp}", *conv)
        assert "the fused conv kernel builds on every rank" in report


def test_a_model_that_does_not_take_the_data_is_one_problem_not_a_crash(mpi, shared_tmp):
    report, problems = _run(mpi, f"run.out_dir={shared_tmp}", "model.name=cnn_dpfl")  # mnist1d: 40-long vectors
    assert "memory     not estimated" in report
    assert problems == ["model.name='cnn_dpfl' needs image inputs [C, H, W]; the data gives shape (40,): "
                        "use model.name=mlp or an image dataset"]
