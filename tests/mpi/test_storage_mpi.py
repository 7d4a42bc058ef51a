"""A write refused on one rank (rank 0's log, the last rank's checkpoint part)
stops every rank with the same StorageError instead of leaving the others in a
collective; the published checkpoint and the committed rounds stay, no
temporary file is left, and running again finishes the log an undisturbed run
writes. (tests/test_disk_full.py does this with a real full disk.)

Bits: a log finished after a refused write is compared bit for bit with an
undisturbed run's: runs of one job with the same settings on one CPU, so it holds on
whichever x86 kind runs both."""

import io
import re

import numpy as np
import pytest
from fakedisk import FakeDisk, FullFile

from mpifl import config
from mpifl.errors import StorageError
from mpifl.logging import pending
from mpifl.logging.h5 import open_run
from mpifl.run import checkpoint, roundlog, runtime

ARGS = {"data.name": "synthetic", "data.n_samples": 480, "data.n_clients": 8, "data.n_clusters": 2,
        "model.hidden": "[8]", "run.threads": 1, "run.rounds": 8, "run.checkpoint_every": 2,
        "algorithm.name": "fedavg", "algorithm.fraction": 0.5}
TIMING = {"rounds/wall_s", "rounds/comm_s", "rounds/compute_s"}


def _run(mpi, tmp, name):
    args = {**ARGS, "run.out_dir": str(tmp), "run.name": name}
    runtime.run(config.load(None, [f"{k}={v}" for k, v in args.items()], n_ranks=mpi.Get_size()), mpi)


def _refused(mpi, tmp, name) -> str:
    """The run's StorageError, raised on every rank with one message."""
    with pytest.raises(StorageError) as e:
        _run(mpi, tmp, name)
    msgs = mpi.allgather(str(e.value))
    # and what the same command will then do: resume after the last checkpoint, or start over
    assert len(set(msgs)) == 1 and re.search(r"free space and rerun the same command( to resume after round \d+ \(its "
                                             r"last checkpoint\)|: it starts the run over, as no checkpoint)", msgs[0])
    return msgs[0]


def _same(a, b, rows=None):
    keys = set(a.keys()) - TIMING
    assert keys == set(b.keys()) - TIMING
    n = b.n_rounds if rows is None else rows
    assert a.n_rounds == n
    for k in sorted(keys):
        y = b.get(k)
        assert np.array_equal(a.get(k), y[:n] if a.datasets[k].per_round else y, equal_nan=True), k


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
def reference(mpi, shared_tmp):
    _run(mpi, shared_tmp, "ref")
    mpi.Barrier()
    return open_run(shared_tmp / "ref")


def test_a_checkpoint_part_refused_on_the_last_rank_stops_every_rank(mpi, shared_tmp, monkeypatch, reference):
    last = mpi.Get_size() - 1
    parts = []

    def opening(path, mode):  # the last rank's second part: 500 bytes of room
        if mpi.Get_rank() == last and path.name.startswith(".part-"):
            parts.append(path)
            if len(parts) == 2:
                return io.BufferedWriter(FullFile(path, 500))
        return open(path, mode)  # noqa: SIM115 - the caller closes it

    monkeypatch.setattr(checkpoint, "open", opening, raising=False)
    msg = _refused(mpi, shared_tmp, "cut")
    monkeypatch.undo()
    assert f"cannot write the checkpoint file '{shared_tmp / 'cut' / 'checkpoint' / '.round-000003.tmp'}" in msg
    assert "(No space left on device); the checkpoint round-000001 is kept;" in msg
    mpi.Barrier()
    ck = shared_tmp / "cut" / "checkpoint"
    parts = [f"round-000001/part-{r:04d}.pt" for r in range(mpi.Get_size())]
    assert _files(ck) == sorted(["latest", "round-000001/meta.pt", "round-000001/manifest.json", *parts])
    _same(open_run(shared_tmp / "cut"), reference, 4)  # rounds 0-3 were logged before the checkpoint
    mpi.Barrier()
    _run(mpi, shared_tmp, "cut")  # space again: resumes after round 2
    mpi.Barrier()
    _same(open_run(shared_tmp / "cut"), reference)


def test_the_log_refused_on_rank_0_stops_every_rank(mpi, shared_tmp, monkeypatch, reference):
    run_round = roundlog.log_round

    disk = FakeDisk(monkeypatch, float("inf"))

    def log_round(writer, ctx, t, *a, **k):  # from round index 5 on, rank 0's disk is full
        if writer is not None and t == 5:
            disk.left = 0
        return run_round(writer, ctx, t, *a, **k)

    monkeypatch.setattr(roundlog, "log_round", log_round)
    msg = _refused(mpi, shared_tmp, "cut")
    monkeypatch.undo()
    log = shared_tmp / "cut" / "run.h5"
    assert msg.startswith(f"cannot write the log {str(log)!r} (No space left on device); its first 5 logged round(s)")
    mpi.Barrier()
    kept = [f"checkpoint/round-{t:06d}/{f}" for t in (1, 3)  # the last two checkpoints
            for f in ("meta.pt", "manifest.json", *(f"part-{r:04d}.pt" for r in range(mpi.Get_size())))]
    # round 4 waits in run.h5.rounds (log.flush_s: run.h5 was flushed before checkpoint 3), unless a round
    # slower than the flush interval went into run.h5 itself
    waiting = [r["t"] for r in pending.read(pending.rounds_path(log))]
    assert waiting in ([], [4])
    assert _files(shared_tmp / "cut") == sorted(["config.yaml", "run.h5", "checkpoint/latest", *kept,
                                                 *(["run.h5.rounds"] if waiting else [])])
    _same(open_run(log), reference, 5)
    mpi.Barrier()
    _run(mpi, shared_tmp, "cut")
    mpi.Barrier()
    _same(open_run(shared_tmp / "cut"), reference)
