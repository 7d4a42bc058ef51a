"""A run directory holding another config's run: the message offers only ways
that work (in this process, one rank)."""

from __future__ import annotations

import shutil

import pytest

from mpifl import config
from mpifl.comm import world
from mpifl.errors import ConfigError
from mpifl.paths import RunDir
from mpifl.run import resume, roundlog, runtime

TINY = {"run": {"rounds": 2, "threads": 1, "name": "r"},
        "data": {"name": "synthetic", "n_samples": 120, "n_clients": 2, "n_clusters": 2}, "model": {"hidden": [4]}}


def _cfg(tmp_path, **over) -> config.Config:
    raw = {k: dict(v) for k, v in TINY.items()}
    raw["run"]["out_dir"] = str(tmp_path)
    for key, value in over.items():
        config.assign(raw, key, value, "test")
    return config.from_dict(raw)


def _fresh_start_ok(cfg: config.Config) -> bool:
    """Would a run of ``cfg`` start (the checks the runtime makes before round 1)?"""
    try:
        ck = resume.find_checkpoint(cfg)
        if ck is None:
            roundlog.check_fresh(cfg, RunDir(cfg.run_dir))
    except ConfigError:
        return False
    return True


def test_a_different_config_is_refused_with_only_ways_that_work(tmp_path):
    runtime.run(_cfg(tmp_path), world())
    changed = _cfg(tmp_path, **{"train.lr": 0.2})
    with pytest.raises(ConfigError) as e:
        resume.find_checkpoint(changed)
    msg = str(e.value)
    assert "train.lr (0.05 -> 0.2)" in msg and "\n" not in msg
    assert "run.resume=never" not in msg  # refused as well: the directory holds another config's run
    assert not _fresh_start_ok(_cfg(tmp_path, **{"train.lr": 0.2, "run.resume": "never"}))
    # what it offers: another run.name, another run.out_dir, or removing the directory
    assert "another run.name" in msg and "run.out_dir" in msg and "remove that directory" in msg
    assert _fresh_start_ok(_cfg(tmp_path, **{"train.lr": 0.2, "run.name": "r2"}))
    assert _fresh_start_ok(_cfg(tmp_path / "elsewhere", **{"train.lr": 0.2}))
    shutil.rmtree(RunDir(changed.run_dir).root)
    assert _fresh_start_ok(changed)
