"""Hostile files, paths and states end in one line, exit 2, leaving nothing
behind: a binary config file, a run path past the OS's limits, a non-ASCII run
path the output cannot print, a symbolic link planted as a checkpoint, a
read-only checkpoint folder on resume (found before any round), and analyze
writing to a full disk."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import mounted

from mpifl import analyze, config
from mpifl.comm import world
from mpifl.config import __main__ as config_cli
from mpifl.errors import ConfigError, shorten
from mpifl.logging.h5 import open_run
from mpifl.main import main
from mpifl.run import runtime

TINY = ["data.name=synthetic", "data.n_samples=240", "data.n_clients=4", "data.n_clusters=2", "model.hidden=[8]",
        "run.threads=1", "run.rounds=2", "run.name=r"]


def one_error(capsys, prefix: str = "mpifl: error: ") -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(prefix), err
    return err[0]


def tree(root: Path) -> dict[str, int]:
    """Every path under ``root`` with its size (links not followed): what a refusal must leave as it was."""
    return {str(p.relative_to(root)): p.lstat().st_size for p in sorted(root.rglob("*"))}




def test_a_binary_config_file_is_one_line(tmp_path, capsys):
    b = tmp_path / "b.yaml"
    b.write_bytes(b"\x00\x01\x02binary")
    assert main([str(b), f"run.out_dir={tmp_path / 'out'}"]) == 2
    assert one_error(capsys) == f"mpifl: error: config file {str(b)!r} is not valid YAML"
    assert config_cli.main([str(b)]) == 2
    one_error(capsys, "mpifl.config: error: ")
    assert not (tmp_path / "out").exists()


def test_a_run_path_past_the_os_limits_is_one_line(tmp_path, capsys):
    deep = tmp_path / "/".join(["d" * 200] * 25)  # 5000 bytes: ENAMETOOLONG at the first mkdir
    assert main([*TINY, f"run.out_dir={deep}"]) == 2
    line = one_error(capsys)
    assert line.startswith("mpifl: error: run.out_dir=") and "is not allowed: the run directory's path is" in line
    wide = tmp_path / ("w" * 256)  # one component past NAME_MAX
    assert main([*TINY, f"run.out_dir={wide}"]) == 2
    assert "with a component of 256 (at most 255)" in one_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_run_path_the_output_cannot_print_is_one_line(tmp_path, capsys, monkeypatch):
    """PYTHONIOENCODING=ascii: the progress lines name the run directory."""
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    out = tmp_path / "résumé"
    assert main([*TINY, f"run.out_dir={out}"]) == 2
    line = one_error(capsys)
    assert "this process's output encoding (ascii) cannot print it" in line and "PYTHONIOENCODING=utf-8" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # two runs
def test_a_symlink_planted_as_a_checkpoint_is_refused_before_any_work(tmp_path):
    base = [*TINY, f"run.out_dir={tmp_path}", "run.checkpoint_every=1"]
    runtime.run(config.load(None, base), world())
    ck = tmp_path / "r" / "checkpoint"
    (ck / "latest").unlink()
    for d in ck.iterdir():
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    (tmp_path / "elsewhere").mkdir()
    (ck / "round-000000").symlink_to(tmp_path / "elsewhere")
    before = tree(tmp_path)
    for _ in range(2):  # the next launch says the same, it does not crash
        with pytest.raises(ConfigError) as e:
            runtime.run(config.load(None, [*base, "run.resume=never"]), world())
        # the target as the message shows it: cut in the middle past 80 characters (a
        # deep temporary folder, as pytest-xdist's workers make, reaches that)
        link, to = str(ck / "round-000000"), shorten(repr(str(tmp_path / "elsewhere")), 80)
        assert str(e.value) == (f"{link!r} is a symbolic link (to {to}), "
                                f"where mpifl writes its checkpoints: refused (mpifl deletes only what it wrote); "
                                f"remove or move it, or use another run.name")
        assert tree(tmp_path) == before  # no .round-000000.tmp, the link and its target untouched


@pytest.mark.slow  # a bind mount, two runs
def test_a_read_only_checkpoint_folder_is_found_before_any_round(tmp_path):
    base = [*TINY, f"run.out_dir={tmp_path}", "run.checkpoint_every=1"]
    runtime.run(config.load(None, base), world())
    ck = tmp_path / "r" / "checkpoint"
    if os.geteuid() != 0:
        ck.chmod(0o555)
        ctx = contextlib.nullcontext()
    else:
        ctx = mounted("--bind", str(ck), str(ck))
    with ctx:
        if os.geteuid() == 0:
            res = subprocess.run(["mount", "-o", "remount,bind,ro", str(ck)], capture_output=True, text=True,
                                 check=False)
            if res.returncode:
                pytest.skip(f"cannot remount read-only: {res.stderr.strip()}")
        before = tree(tmp_path)
        with pytest.raises(ConfigError) as e:
            runtime.run(config.load(None, [*base, "run.rounds=4"]), world())
        assert str(e.value).startswith(f"checkpoint folder {str(ck)!r} cannot be written (")
        assert "the run could not checkpoint; make it writable, or pick a run.out_dir you can write" in str(e.value)
        assert tree(tmp_path) == before  # found before any round: the log still ends at round 2
        assert open_run(tmp_path / "r").rounds.tolist() == [0, 1]
    if os.geteuid() != 0:
        ck.chmod(0o755)


@pytest.mark.slow  # a tmpfs mount
def test_analyze_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys):
    runtime.run(config.load(None, [*TINY, f"run.out_dir={tmp_path / 'runs'}"]), world())
    disk = tmp_path / "disk"
    disk.mkdir()
    with mounted("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)):
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as f:
            f.write(b"\0" * (1 << 20))  # the whole disk
        capsys.readouterr()
        assert analyze.main([str(tmp_path / "runs"), "--out", str(disk / "analysis"), "--heatmaps", "none"]) == 2
        line = one_error(capsys, "mpifl.analyze: error: cannot write ")
        assert "(No space left on device); give --out DIR, a folder you can write" in line
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no folder, no empty table.csv
