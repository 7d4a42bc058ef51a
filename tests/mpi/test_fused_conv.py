"""cnn_dpfl on the fused conv kernel (mpifl.train.fused) under MPI: the same bits on
every rank count and on resume, the kernel named in the log, and torch's kernels
where asked."""

from pathlib import Path

import numpy as np
import pytest

from mpifl import config
from mpifl.logging.h5 import open_run
from mpifl.run import checkpoint, runtime

pytestmark = [
    pytest.mark.usefixtures("fused_kernel"),  # built at the first test, not at collection
    pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                       reason="needs Debian's dataset-fashion-mnist (28x28 images)"),
]


def _cfg(out, name, rounds=3, **over):
    args = {"run.name": name, "run.out_dir": str(out), "run.rounds": rounds, "run.threads": 1,
            "data.name": "fashionmnist", "data.subsample": 0.01, "data.n_clients": 6, "data.partition": "iid",
            "model.name": "cnn_dpfl", "train.batched": "on", "train.batch_size": 8, "algorithm.name": "fedavg",
            "run.checkpoint_every": 1, **over}
    return config.load(None, [f"{k}={v}" for k, v in args.items()])


def _run(mpi, cfg):
    runtime.run(cfg, mpi)
    mpi.Barrier()


def test_fused_runs_keep_their_bits_across_rank_counts_and_on_resume(mpi, shared_tmp, monkeypatch):
    _run(mpi, _cfg(shared_tmp, "many"))
    _run(mpi, _cfg(shared_tmp, "resumed", rounds=2))
    loaded = []
    monkeypatch.setattr(checkpoint, "load", lambda *a, _load=checkpoint.load: loaded.append(_load(*a)) or loaded[-1])
    _run(mpi, _cfg(shared_tmp, "resumed"))  # a round more asked of a finished 2-round run: it resumes
    monkeypatch.undo()
    assert loaded == [1]  # from its last checkpoint, round 1
    _run(mpi, _cfg(shared_tmp, "torch", **{"train.fused_conv": "off"}))
    sub = mpi.Split(mpi.Get_rank(), 0)  # every rank alone; rank 0 runs the reference
    if mpi.Get_rank() == 0:
        runtime.run(_cfg(shared_tmp, "one"), sub)
    sub.Free()
    mpi.Barrier()
    if mpi.Get_rank() != 0:
        return
    many, one, resumed, plain = (open_run(shared_tmp / n) for n in ("many", "one", "resumed", "torch"))
    assert many.attrs["n_ranks"] == mpi.Get_size() and one.attrs["n_ranks"] == 1
    assert many.attrs["conv_kernel"] == one.attrs["conv_kernel"] == "fused" and plain.attrs["conv_kernel"] == "torch"
    for key in ("metrics/test_acc", "metrics/train_loss"):
        np.testing.assert_array_equal(many.get(key), one.get(key))
        np.testing.assert_array_equal(many.get(key), resumed.get(key))
    assert not np.array_equal(many.get("metrics/train_loss"), plain.get("metrics/train_loss"))  # another kernel
    np.testing.assert_allclose(many.get("metrics/train_loss")[0], plain.get("metrics/train_loss")[0], rtol=1e-4)
