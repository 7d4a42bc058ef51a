"""cnn_dpfl on the fused conv kernel (mpifl.train.fused) under MPI: the same bits on
every rank count and on resume, the kernel named in the log, and torch's kernels
where asked.

Bits: the runs compared bit for bit (on every rank, on one rank, resumed; torch's
kernels where one rank cannot build the fused one, against a torch run) are runs of
one job on one CPU, one thread per rank (``run.threads=1``), batched; the fused
kernel is compiled for that CPU (``-march=native``): they agree on whichever x86
kind runs them all, not between kinds. The fused and torch's kernels are asserted to
differ in the last bits, and compared within a tolerance."""

import json
from pathlib import Path

import numpy as np
import pytest

from mpifl import config
from mpifl.errors import ConfigError
from mpifl.logging.h5 import open_run
from mpifl.run import checkpoint, provenance, runtime
from mpifl.train import fused

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


def _auto_lines(capsys) -> list[str]:
    """The lines printed since the last read that speak of ``train.fused_conv=auto``'s choice."""
    return [ln for ln in capsys.readouterr().out.splitlines() if "train.fused_conv=auto" in ln]


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


def test_ranks_that_cannot_all_build_the_kernel_agree_on_torchs(mpi, shared_tmp, monkeypatch, capsys):
    """The last rank has no compiler: under auto every rank takes torch's kernels
    (the run's bits are the torch run's, and the log says torch), with one line
    saying so; ``on`` is refused on every rank in one line naming that rank; a fused
    run extended there is refused in one line, not a crash."""
    _run(mpi, _cfg(shared_tmp, "fused", rounds=2))
    _run(mpi, _cfg(shared_tmp, "torch", **{"train.fused_conv": "off"}))
    last = mpi.Get_size() - 1
    if mpi.Get_rank() == last:
        monkeypatch.setattr(fused, "_build", lambda: "CalledProcessError: no compiler")
    capsys.readouterr()
    _run(mpi, _cfg(shared_tmp, "mixed"))
    said = _auto_lines(capsys)
    assert said == ([f"mpifl: train.fused_conv=auto: the fused conv kernel does not build on rank(s) {last} of "
                     f"{mpi.Get_size()} (CalledProcessError: no compiler): every rank takes torch's kernels (other "
                     f"sums, other bits)"] if mpi.Get_rank() == 0 else [])
    with pytest.raises(ConfigError) as on:
        runtime.run(_cfg(shared_tmp, "on", **{"train.fused_conv": "on"}), mpi)
    assert f"does not build on rank(s) {last} of {mpi.Get_size()} (CalledProcessError: no compiler)" in str(on.value)
    with pytest.raises(ConfigError) as extended:
        runtime.run(_cfg(shared_tmp, "fused", rounds=3), mpi)  # a round more of the fused run
    assert str(extended.value).startswith("the checkpoint's run took the fused conv kernel (train.fused_conv), "
                                          f"which this run cannot take (it does not build on rank(s) {last} of ")
    monkeypatch.undo()
    mpi.Barrier()
    if mpi.Get_rank() == 0:
        mixed, plain = open_run(shared_tmp / "mixed"), open_run(shared_tmp / "torch")
        assert mixed.attrs["conv_kernel"] == "torch"
        for key in ("metrics/test_acc", "metrics/train_loss"):
            np.testing.assert_array_equal(mixed.get(key), plain.get(key))


def test_auto_takes_torchs_kernels_where_the_fused_one_is_timed_slower(mpi, shared_tmp, monkeypatch, capsys):
    """The last rank's machine times the fused kernel at twice torch's: under auto the
    ranks sum their timings and every rank takes torch's kernels (the bits of a torch
    run), one line says so, the log and provenance keep the timing; a fused run's
    checkpoint still resumes on the fused kernel, its bits those of a straight run."""
    _run(mpi, _cfg(shared_tmp, "fused", rounds=2))
    _run(mpi, _cfg(shared_tmp, "straight"))
    _run(mpi, _cfg(shared_tmp, "torch", **{"train.fused_conv": "off"}))
    last, size = mpi.Get_size() - 1, mpi.Get_size()
    if mpi.Get_rank() == last:  # the others time fused 0 s, torch's 1 s (the fused_kernel fixture)
        monkeypatch.setattr(fused, "timed", lambda key, measure: (2.0 * size, 1.0))
    capsys.readouterr()
    _run(mpi, _cfg(shared_tmp, "timed"))
    said = _auto_lines(capsys)
    assert said == ([f"mpifl: train.fused_conv=auto: the fused conv kernel is slower than torch's here "
                     f"({2000.0 * size:.1f} ms against {1000.0 * size:.1f} ms, summed over ranks): every rank "
                     f"takes torch's kernels (other sums, other bits)"] if mpi.Get_rank() == 0 else [])
    _run(mpi, _cfg(shared_tmp, "fused", rounds=3))  # a round more of the fused run, resumed where auto says torch
    monkeypatch.undo()
    mpi.Barrier()
    if mpi.Get_rank() == 0:
        timed, plain = open_run(shared_tmp / "timed"), open_run(shared_tmp / "torch")
        assert timed.attrs["conv_kernel"] == "torch"
        assert json.loads(timed.attrs["conv_kernel_times"]) == [2.0 * size, 1.0 * size]
        train = provenance.read(timed.attrs)["train"]
        assert train["conv_kernel"] == "torch"
        assert train["conv_kernel_times"] == {"fused_s": 2.0 * size, "torch_s": 1.0 * size}
        for key in ("metrics/test_acc", "metrics/train_loss"):
            np.testing.assert_array_equal(timed.get(key), plain.get(key))
        resumed, straight = open_run(shared_tmp / "fused"), open_run(shared_tmp / "straight")
        assert resumed.attrs["conv_kernel"] == "fused"
        for key in ("metrics/test_acc", "metrics/train_loss"):
            np.testing.assert_array_equal(resumed.get(key), straight.get(key))
