"""One line, exit 2, where a traceback used to be: a run directory that cannot
be written (read-only file system, no permission), analyze's default --out
there, an invalid override value, a sweep base or layout that is not YAML.

Bits: a run resumed from its previous checkpoint is compared bit for bit with a
straight run in this process (one rank, one thread): any CPU."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, assert_same_logs, launch

from mpifl import analyze, config
from mpifl.comm import world
from mpifl.config import __main__ as config_cli
from mpifl.errors import ConfigError, StorageError
from mpifl.logging.h5 import open_run
from mpifl.run import resume, roundlog, runtime
from mpifl.sweep import cli as sweep

TINY = ["data.name=synthetic", "data.n_samples=240", "data.n_clients=4", "data.n_clusters=2", "model.hidden=[8]",
        "run.threads=1", "run.rounds=2", "run.name=r"]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("resume", ["auto", "never"])
def test_an_unwritable_run_directory_is_a_config_error(tmp_path, monkeypatch, resume):
    runtime.run(config.load(None, [*TINY, f"run.out_dir={tmp_path}"]), world())

    def refuse(path, *a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(roundlog, "atomic_write_text", refuse)
    monkeypatch.setattr(runtime.checkpoint, "forget", refuse)
    # resumed, the finished run is extended by a round: a finished run started again writes nothing
    with pytest.raises(ConfigError) as e:
        runtime.run(config.load(None, [*TINY, f"run.out_dir={tmp_path}", f"run.resume={resume}", "run.rounds=3"]),
                    world())
    assert str(e.value) == (f"run.out_dir={str(tmp_path)!r} is not allowed: the run directory {str(tmp_path / 'r')!r} "
                            f"cannot be written (Read-only file system); pick a run.out_dir you can write (a copy "
                            f"of the run directory there continues the run)")


def test_a_full_disk_at_the_start_is_not_called_a_config_error(tmp_path, monkeypatch):
    runtime.run(config.load(None, [*TINY, f"run.out_dir={tmp_path}"]), world())

    def full(path, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(roundlog, "atomic_write_text", full)
    with pytest.raises(StorageError) as e:  # the storage errors' own handling (exit 74), not "pick another out_dir"
        runtime.run(config.load(None, [*TINY, f"run.out_dir={tmp_path}", "run.rounds=3"]), world())
    assert "(No space left on device)" in str(e.value) and not isinstance(e.value, ConfigError)


def test_analyze_into_an_unwritable_out_is_one_line(tmp_path, monkeypatch, capsys):
    runtime.run(config.load(None, [*TINY, f"run.out_dir={tmp_path}"]), world())
    real = Path.mkdir

    def refuse(self, *a, **k):
        if self.name == "analysis":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert analyze.main([str(tmp_path)]) == 2
    assert _one_line(capsys.readouterr().err) == (f"mpifl.analyze: error: cannot write {tmp_path / 'analysis'} "
                                                  f"(Read-only file system); give --out DIR, a folder you can write")


def test_an_invalid_override_and_files_that_are_not_yaml_are_one_line(tmp_path, capsys):
    assert config_cli.main([str(REPO / "jobs" / "quickstart.yaml"), "fedprox.mu=-1"]) == 2
    assert _one_line(capsys.readouterr().err) == \
        "mpifl.config: error: fedprox.mu=-1.0 is not allowed; must be a finite number >= 0"
    (tmp_path / "bad.yaml").write_text("run: [1, 2\n")
    (tmp_path / "s.yaml").write_text("base: bad.yaml\ngrid: {run.seed: [0]}\n")
    assert sweep.main([str(tmp_path / "s.yaml"), "--dry-run"]) == 2
    assert _one_line(capsys.readouterr().err) == "mpifl.sweep: error: base='bad.yaml' is not valid YAML (line 2)"
    runtime.run(config.load(None, [*TINY, f"run.out_dir={tmp_path / 'runs'}"]), world())
    capsys.readouterr()
    assert analyze.main([str(tmp_path / "runs"), "--layout", str(tmp_path / "bad.yaml")]) == 2
    assert _one_line(capsys.readouterr().err).endswith("is not valid YAML (line 2)")


@pytest.fixture
def read_only(tmp_path):
    """(a folder, the same folder read-only): a read-only bind mount as root (whom
    permission bits do not stop), mode 0555 otherwise."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    if os.geteuid() != 0:
        yield src, src
        src.chmod(0o755)
        return
    ro.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True, text=True, check=False)
    if mounted.returncode:
        pytest.skip(f"needs a read-only bind mount, which this root cannot make: {mounted.stderr.strip()}")
    try:
        ro_ok = subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True, text=True,
                               check=False)
        if ro_ok.returncode:
            pytest.skip(f"cannot remount the bind mount read-only: {ro_ok.stderr.strip()}")
        yield src, ro
    finally:
        subprocess.run(["umount", str(ro)], check=False)


@pytest.mark.slow  # mount, and the entry points as users start them
def test_a_run_and_its_analysis_on_a_read_only_file_system(read_only):
    src, ro = read_only
    ok = launch([*TINY, f"run.out_dir={src}"])
    assert ok.returncode == 0, ok.stderr
    if src == ro:
        src.chmod(0o555)
        (src / "r").chmod(0o555)
    for extra in ([], ["run.rounds=3"], ["run.resume=never"]):
        res = launch([*TINY, f"run.out_dir={ro}", *extra])
        assert res.returncode == 2, res.stdout + res.stderr
        assert _one_line(res.stderr).startswith(f"mpifl: error: run.out_dir={str(ro)!r} is not allowed: the run "
                                                f"directory {str(ro / 'r')!r} cannot be written (")
    res = launch([str(ro)], module="mpifl.analyze", n=0)
    assert res.returncode == 2 and _one_line(res.stderr).startswith(f"mpifl.analyze: error: cannot write {ro}")
    # a copy where it can be written continues the run
    shutil.copytree(ro / "r", src.parent / "copy" / "r")
    again = launch([*TINY, f"run.out_dir={src.parent / 'copy'}", "run.rounds=3"])
    assert again.returncode == 0 and "resumed after round 2" in again.stdout, again.stderr


def test_a_checkpoint_its_pointer_does_not_name_yet_is_resumed_not_deleted(tmp_path):
    """A job killed between publishing its first checkpoint and writing ``latest``
    leaves a whole checkpoint: the same command resumes from it (a fresh start
    deleted it)."""
    straight = tmp_path / "straight"
    runtime.run(config.load(None, [*TINY, f"run.out_dir={straight}", "run.rounds=4"]), world())
    args = [*TINY, f"run.out_dir={tmp_path}", "run.rounds=4"]
    runtime.run(config.load(None, [*args, "run.rounds=2"]), world())
    ck = tmp_path / "r" / "checkpoint"
    (ck / "latest").unlink()
    assert resume.find_checkpoint(config.load(None, args)) == ck / "round-000001"
    runtime.run(config.load(None, args), world())
    assert_same_logs(open_run(tmp_path / "r"), open_run(straight / "r"))
