"""How many checkpoints a run keeps: run.keep_checkpoints while it runs (default
2), its final one alone once it finishes (run.keep_final_checkpoint, default
true), none with run.keep_final_checkpoint=false, and then a larger run.rounds is
refused in one line. In this process, one rank."""

from __future__ import annotations

import pytest
from test_extend import _cfg

from mpifl.comm import world
from mpifl.errors import ConfigError
from mpifl.logging.h5 import open_run
from mpifl.paths import RunDir
from mpifl.run import checkpoint, runtime


def _kept(cfg) -> list[str]:
    d = RunDir(cfg.run_dir).checkpoint
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def _seen_while_running(monkeypatch) -> list[list[str]]:
    """The checkpoint folder's listing right after each save."""
    seen, save = [], checkpoint.save

    def spy(rd, *a, **k):
        out = save(rd, *a, **k)
        seen.append(sorted(p.name for p in rd.checkpoint.iterdir()))
        return out

    monkeypatch.setattr(checkpoint, "save", spy)
    return seen


@pytest.mark.slow  # runs of 8 and 10 rounds
@pytest.mark.parametrize("keep", [1, 2, 3])
def test_a_running_run_keeps_keep_checkpoints_and_a_finished_one_its_final_one(tmp_path, monkeypatch, keep):
    seen = _seen_while_running(monkeypatch)
    cfg = _cfg(tmp_path, 8, **{"run.checkpoint_every": 1, "run.keep_checkpoints": keep})
    runtime.run(cfg, world())
    assert [len(x) - 1 for x in seen[:-1]] == [min(i + 1, keep) for i in range(7)]  # - latest
    assert seen[4] == ["latest", *(f"round-{r:06d}" for r in range(5 - min(5, keep), 5))]
    assert _kept(cfg) == ["latest", "round-000007"]
    runtime.run(_cfg(tmp_path, 10, **{"run.checkpoint_every": 1}), world())  # the final one extends it
    assert open_run(cfg.run_dir).rounds_done == 10


@pytest.mark.slow  # three short runs
def test_keep_final_checkpoint_false_keeps_none_and_an_extension_says_so(tmp_path, capsys):
    cfg = _cfg(tmp_path, 4, **{"run.keep_final_checkpoint": False})
    runtime.run(cfg, world())
    assert _kept(cfg) == [] and open_run(cfg.run_dir).rounds_done == 4
    before = RunDir(cfg.run_dir).log.read_bytes()
    capsys.readouterr()
    runtime.run(cfg, world())  # the same run again: done, nothing changes
    assert "done: the run had already finished all 4 rounds (it kept no checkpoint" in capsys.readouterr().out
    assert RunDir(cfg.run_dir).log.read_bytes() == before
    longer = _cfg(tmp_path, 6, **{"run.keep_final_checkpoint": True})  # a key that may change between the two
    with pytest.raises(ConfigError) as e:
        runtime.run(longer, world())
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("run.rounds=6 cannot extend the run in ") and \
        "finished its 4 rounds and kept no checkpoint (run.keep_final_checkpoint=false)" in msg and \
        "run.resume=never" in msg
    assert RunDir(cfg.run_dir).log.read_bytes() == before
    runtime.run(_cfg(tmp_path, 6, **{"run.resume": "never"}), world())  # the way forward
    assert open_run(cfg.run_dir).rounds_done == 6


def test_keep_checkpoints_below_one_is_one_line():
    with pytest.raises(ConfigError, match=r"run.keep_checkpoints=0 is not allowed; must be >= 1"):
        _cfg("x", 4, **{"run.keep_checkpoints": 0})
