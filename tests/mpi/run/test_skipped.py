"""Updates dropped by ``train.on_nonfinite=skip`` are visible: each round's progress
line says how many, ``/metrics/skipped`` holds them per client, the final line
gives the run's total (the same on any number of ranks), and a run in which every
update was dropped ends with a warning (exit status still 0: the run did what it
was configured to do, and its log says so).

Which updates fail is chosen here (the training step's ``bad`` flags are set after
it ran), so the counts are known whatever the data."""

import re

import numpy as np

from mpifl import config
from mpifl.logging.h5 import open_run
from mpifl.run import runtime
from mpifl.train import Clients, batched

R = 5
ARGS = {"data.name": "synthetic", "data.n_samples": 480, "data.n_clients": 8, "data.n_clusters": 2,
        "model.hidden": "[8]", "run.threads": 1, "run.rounds": R, "algorithm.name": "fedavg",
        "algorithm.fraction": 0.5, "train.batched": "on", "train.on_nonfinite": "skip"}


def _run(mpi, tmp, name, monkeypatch, capsys, failing):
    """A run whose update of client i in round t fails where ``failing(t, i)``;
    returns (rank 0's stdout, its stderr, the log, updates trained on all ranks)."""
    steps, plan = batched.train_steps, Clients.plan
    now, trained = {}, []

    def planning(self, local, epochs, round, *a, **k):
        now["round"] = round
        return plan(self, local, epochs, round, *a, **k)

    def failing_steps(c, local, bp, objective, step, bad, losses, seen):
        steps(c, local, bp, objective, step, bad, losses, seen)
        trained.append(len(local))
        bad |= np.array([failing(now["round"], int(c.ids[i])) for i in local], bool)

    monkeypatch.setattr(Clients, "plan", planning)
    monkeypatch.setattr(batched, "train_steps", failing_steps)
    args = {**ARGS, "run.out_dir": str(tmp), "run.name": name}
    cfg = config.load(None, [f"{k}={v}" for k, v in args.items()], n_ranks=mpi.Get_size())
    capsys.readouterr()
    runtime.run(cfg, mpi)
    out, err = capsys.readouterr()
    mpi.Barrier()
    return out, err, open_run(tmp / name), mpi.allreduce(sum(trained))


def _lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("round ")]


def test_skipped_updates_are_counted_per_round_and_in_the_final_line(mpi, shared_tmp, monkeypatch, capsys):
    # odd clients fail in round index 1, client 2 in every round from index 3
    out, err, log, updates = _run(mpi, shared_tmp, "some", monkeypatch, capsys,
                                  lambda t, i: (t == 1 and i % 2 == 1) or (t >= 3 and i == 2))
    per_round = log.metric("skipped").sum(axis=1)
    assert per_round.shape == (R,) and per_round[1] > 0 and per_round[0] == 0
    total = int(per_round.sum())
    if mpi.Get_rank() != 0:
        return
    assert err == ""
    for line, n in zip(_lines(out), per_round, strict=True):
        says = re.search(r"(\d+) updates? skipped \(non-finite\)$", line)
        assert (int(says.group(1)) == n) if n else says is None, line
    (done,) = [ln for ln in out.splitlines() if ln.startswith("done:")]
    assert f", {total} of {updates} client updates skipped as non-finite;" in done
    assert total < updates


def test_a_run_whose_every_update_was_skipped_ends_with_a_warning(mpi, shared_tmp, monkeypatch, capsys):
    out, err, log, updates = _run(mpi, shared_tmp, "all", monkeypatch, capsys, lambda t, i: True)
    assert log.metric("skipped").sum() == updates > 0
    if mpi.Get_rank() != 0:
        return
    assert f", {updates} of {updates} client updates skipped as non-finite;" in out
    assert err.splitlines() == [f"mpifl: warning: every client update of the run ({updates}) was skipped as "
                                f"non-finite (train.on_nonfinite=skip): no client trained; lower train.lr"]


def test_a_run_that_skipped_nothing_says_nothing_of_it(mpi, shared_tmp, monkeypatch, capsys):
    out, err, log, _ = _run(mpi, shared_tmp, "none", monkeypatch, capsys, lambda t, i: False)
    assert log.metric("skipped").sum() == 0
    if mpi.Get_rank() == 0:
        assert "skipped" not in out and err == ""
