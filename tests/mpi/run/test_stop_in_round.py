"""A stop signal inside a long round: DPFL's graph search and FedC2I's
leave-one-out pass poll ``ctx.stop``, and where the round before is on disk (or
this is round 0) every rank abandons the round together, exits as preempted and
resumes to the uninterrupted run's bits. Where it is not on disk, the round runs
to its end and is checkpointed, as for any other round.

The signal is the ``stop_in_round`` fault (``MPIFL_FAULT``) on the last rank only,
taken as the round's work begins, so the other ranks learn it only by agreeing.

Bits: the interrupted and the uninterrupted run are compared bit for bit: the same
ranks, settings and one thread per rank, in one process per rank, on one machine."""


import numpy as np
import pytest
from helpers import assert_same_logs

from mpifl import config
from mpifl.algorithms.base import Interrupt, RoundStopped
from mpifl.comm import Comm
from mpifl.logging.h5 import open_run
from mpifl.run import runtime

R = 5
ARGS = ["data.name=synthetic", "data.n_samples=480", "data.n_clients=8", "data.n_clusters=2",
        "model.hidden=[8]", "run.threads=1", f"run.rounds={R}", "run.checkpoint_every=0"]
ALGOS = {"dpfl": ["algorithm.name=dpfl", "dpfl.tau_init=1", "dpfl.tau_train=1"],
         "fedc2i": ["algorithm.name=fedc2i"]}


def _run(mpi, tmp, name: str, algo: str):
    cfg = config.load(None, [*ARGS, *ALGOS[algo], f"run.out_dir={tmp}", f"run.name={name}"],
                      n_ranks=mpi.Get_size())
    runtime.run(cfg, mpi)
    mpi.Barrier()
    return open_run(tmp / name)


def _latest(tmp, name: str) -> str | None:
    latest = tmp / name / "checkpoint" / "latest"
    return latest.read_text() if latest.exists() else None


@pytest.fixture(scope="module")
def refs(mpi, module_tmp):
    """Each algorithm's uninterrupted run, in a directory every rank shares."""
    return {algo: _run(mpi, module_tmp, f"ref-{algo}", algo) for algo in ALGOS}


def _stopped(mpi, tmp, name, algo, t, monkeypatch, capsys) -> str:
    """The run with the last rank signalled as round ``t``'s work begins: it must
    stop as preempted; returns rank 0's output."""
    monkeypatch.setenv("MPIFL_FAULT", f"{mpi.Get_size() - 1}:{t}:stop_in_round")
    capsys.readouterr()
    with pytest.raises(runtime.Preempted):
        _run(mpi, tmp, name, algo)
    mpi.Barrier()
    monkeypatch.delenv("MPIFL_FAULT")
    return capsys.readouterr().out


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_a_stop_in_round_0_abandons_it_and_the_rerun_starts_over(mpi, shared_tmp, refs, algo, monkeypatch, capsys):
    name = f"stop0-{algo}"
    out = _stopped(mpi, shared_tmp, name, algo, 0, monkeypatch, capsys)
    assert _latest(shared_tmp, name) is None
    assert open_run(shared_tmp / name).n_rounds == 0
    if mpi.Get_rank() == 0:
        (line,) = [ln for ln in out.splitlines() if "stop signal" in ln]
        assert f"during round 1/{R}" in line and "abandoned" in line and "starts over" in line
    again = _run(mpi, shared_tmp, name, algo)
    assert_same_logs(refs[algo], again)


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_a_stop_after_a_long_round_abandons_the_next(mpi, shared_tmp, refs, algo, monkeypatch, capsys):
    """Every round counts as long (``LONG_ROUND_S`` 0): each is checkpointed as it
    ends, so round 3's stop abandons round 3 and the rerun resumes after round 2."""
    monkeypatch.setattr(runtime, "LONG_ROUND_S", 0.0)
    name = f"long-{algo}"
    out = _stopped(mpi, shared_tmp, name, algo, 2, monkeypatch, capsys)
    assert _latest(shared_tmp, name) == "round-000001"
    assert open_run(shared_tmp / name).n_rounds == 2
    if mpi.Get_rank() == 0:
        assert f"during round 3/{R}; the round was abandoned and the checkpoint of round 2 resumes" in out
    monkeypatch.setattr(runtime, "LONG_ROUND_S", 1e9)
    capsys.readouterr()
    again = _run(mpi, shared_tmp, name, algo)
    if mpi.Get_rank() == 0:
        assert "resumed after round 2" in capsys.readouterr().out
    assert_same_logs(refs[algo], again)


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_a_stop_in_a_round_whose_predecessor_is_not_on_disk_waits_for_its_end(mpi, shared_tmp, refs, algo,
                                                                               monkeypatch, capsys):
    """Short rounds, no checkpoints asked for: round 3 cannot be abandoned (round 2
    is on no disk), so it finishes and is checkpointed, as a stop at a boundary is."""
    monkeypatch.setattr(runtime, "LONG_ROUND_S", 1e9)
    name = f"short-{algo}"
    out = _stopped(mpi, shared_tmp, name, algo, 2, monkeypatch, capsys)
    assert _latest(shared_tmp, name) == "round-000002"
    assert open_run(shared_tmp / name).n_rounds == 3
    if mpi.Get_rank() == 0:
        assert f"after round 3/{R}; checkpoint written" in out and "abandoned" not in out
    assert_same_logs(refs[algo], _run(mpi, shared_tmp, name, algo))


def test_agreed_raises_on_every_rank_when_one_is_asked(mpi):
    """The collective half on its own: the last rank's request reaches every rank,
    and without one ``agreed`` is the maximum of what the ranks gave."""
    stop = Interrupt(abandonable=True)
    comm = Comm(mpi.Get_size(), mpi)
    assert stop.agreed(comm, float(mpi.Get_rank())) == mpi.Get_size() - 1 and not stop.cut
    stop.signum = 15 if mpi.Get_rank() == mpi.Get_size() - 1 else 0
    with pytest.raises(RoundStopped):
        stop.agreed(comm, 1.0)
    assert stop.cut
    unsafe = Interrupt(signum=15, abandonable=False)  # a signal where abandoning is not safe: no cut
    assert not unsafe.requested and unsafe.agreed(comm, 2.0) == 2.0
    assert np.isfinite(unsafe.agreed(comm))


def test_pfedlia_s_lia_round_is_checkpointed_before_and_can_be_abandoned(mpi, shared_tmp, monkeypatch, capsys):
    """pFedLIA names its LIA round long (``long_round``): the warm-up round before it
    is checkpointed although short, and a stop in the LIA round abandons it."""
    monkeypatch.setattr(runtime, "LONG_ROUND_S", 1e9)
    ALGOS["pfedlia"] = ["algorithm.name=pfedlia", "pfedlia.warmup_rounds=2", "pfedlia.lia_epochs=1"]
    try:
        ref = _run(mpi, shared_tmp, "ref-pfedlia", "pfedlia")
        out = _stopped(mpi, shared_tmp, "lia", "pfedlia", 2, monkeypatch, capsys)
        assert _latest(shared_tmp, "lia") == "round-000001" and open_run(shared_tmp / "lia").n_rounds == 2
        if mpi.Get_rank() == 0:
            assert "during round 3/5; the round was abandoned" in out
        assert_same_logs(ref, _run(mpi, shared_tmp, "lia", "pfedlia"))
    finally:
        del ALGOS["pfedlia"]
