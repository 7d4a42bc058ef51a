"""After a full disk the one line says what the same command will do once there
is room, and it does that: resume after the last checkpoint's round, or start
over when none was written (``run.checkpoint_every=0``)."""

from __future__ import annotations

import re

import pytest
from fakedisk import FakeDisk

from mpifl import config
from mpifl.comm import world
from mpifl.errors import StorageError
from mpifl.run import runtime

TINY = ["data.name=synthetic", "data.n_samples=240", "data.n_clients=4", "data.n_clusters=2", "model.hidden=[8]",
        "run.threads=1", "run.rounds=6", "run.name=r", "log.flush_s=0"]


def _cut_then_rerun(tmp_path, monkeypatch, capsys, every: int) -> tuple[str, str]:
    """(the refused run's message, the rerun's output): the log's writes get half
    the room the whole run takes."""
    args = [*TINY, f"run.checkpoint_every={every}"]
    with monkeypatch.context() as mp:
        disk = FakeDisk(mp, float("inf"))
        runtime.run(config.load(None, [*args, f"run.out_dir={tmp_path / 'ref'}"]), world())
    with monkeypatch.context() as mp:
        FakeDisk(mp, disk.written // 2)
        with pytest.raises(StorageError) as e:
            runtime.run(config.load(None, [*args, f"run.out_dir={tmp_path / 'cut'}"]), world())
    capsys.readouterr()
    runtime.run(config.load(None, [*args, f"run.out_dir={tmp_path / 'cut'}"]), world())
    return str(e.value), capsys.readouterr().out


@pytest.mark.slow  # three short runs
def test_without_a_checkpoint_the_message_says_the_rerun_starts_over(tmp_path, monkeypatch, capsys):
    msg, again = _cut_then_rerun(tmp_path, monkeypatch, capsys, every=0)
    assert msg.startswith("cannot write the log") and "\n" not in msg
    assert msg.endswith("free space and rerun the same command: it starts the run over, as no checkpoint was "
                        "written yet (run.checkpoint_every=0 writes one only at the end and on a signal)"), msg
    assert "resumed" not in again and "done: 6 rounds in" in again


@pytest.mark.slow  # three short runs
def test_with_a_checkpoint_the_message_names_the_round_the_rerun_resumes_after(tmp_path, monkeypatch, capsys):
    msg, again = _cut_then_rerun(tmp_path, monkeypatch, capsys, every=1)
    said = re.search(r"free space and rerun the same command to resume after round (\d+) \(its last checkpoint\)$",
                     msg)
    assert said, msg
    assert f"(resumed after round {said.group(1)})" in again
