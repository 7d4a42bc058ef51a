"""The fused conv kernel's cache (mpifl.train.fused) as a shared home leaves it:
a library cut short, empty, of another machine, in a folder that cannot be
written or on a full disk. None may be loaded (loading one can kill the process
with SIGBUS): each is made again or refused in one line naming the folder.

One build a session (the kernel's usual cache); each case damages a copy of it in
a folder of its own and loads that in a fresh interpreter (the slow tier), where
making it again is a link of the intact object file, not a compile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, mounted

from mpifl.train import fused

LOAD = ("from mpifl.train import fused\n"
        "built = fused._build()\n"
        "print('refused: ' + built if isinstance(built, str) else 'loaded ' + built.__file__)\n")


@pytest.fixture(scope="module")
def built() -> Path:
    """The folder of this test run's build of the kernel (skipped where it does not build)."""
    module = fused._build()
    if isinstance(module, str):
        pytest.skip(f"the fused kernel does not build here: {module}")
    return Path(module.__file__).parent


@pytest.fixture
def cache(built, tmp_path) -> Path:
    """A copy of the build, as ``TORCH_EXTENSIONS_DIR/<name>`` under ``tmp_path/ext``."""
    folder = tmp_path / "ext" / built.name
    shutil.copytree(built, folder, ignore=shutil.ignore_patterns("lock", fused.LOCK))
    assert not fused.damaged(folder, built.name)
    return folder


def _load(folder: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(folder.parent), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", LOAD], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _library(folder: Path) -> Path:
    return folder / f"{folder.name}.so"




def _truncate(so: Path) -> None:
    with open(so, "r+b") as f:
        f.truncate(4096)


def _empty(so: Path) -> None:
    so.write_bytes(b"")


def _other_machine(so: Path) -> None:
    data = bytearray(so.read_bytes())
    data[18:20] = (183).to_bytes(2, "little")  # e_machine: AArch64's
    so.write_bytes(bytes(data))


@pytest.mark.slow  # an interpreter a case
@pytest.mark.parametrize("damage", [_truncate, _empty, _other_machine], ids=["truncated", "zero-length", "wrong-elf"])
def test_a_damaged_library_is_made_again_not_loaded(cache, damage):
    so = _library(cache)
    damage(so)
    assert fused.damaged(cache, cache.name) == [so]
    res = _load(cache)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == f"loaded {so}"
    assert not fused.damaged(cache, cache.name)  # and vouched for again


def test_the_digest_vouches_for_the_object_file_and_a_build_without_one_for_nothing(tmp_path):
    folder, name = tmp_path / "k", "mpifl_conv_pool_relu_0"
    folder.mkdir()
    so, obj = fused._outputs(folder, name)
    assert fused.damaged(folder, name) == [so, obj]  # nothing built
    so.write_bytes(b"library")
    obj.write_bytes(b"object")
    assert fused.damaged(folder, name) == [so, obj]  # a build with no digest: cut short, or from before digests
    (folder / fused.DIGEST).write_text(json.dumps({p.name: fused._sha256(p) for p in (so, obj)}))
    assert fused.damaged(folder, name) == []
    obj.write_bytes(b"objec")
    assert fused.damaged(folder, name) == [obj]
    (folder / fused.DIGEST).write_text("[1]")
    assert fused.damaged(folder, name) == [so, obj]


@pytest.mark.slow  # a bind mount, two interpreters
def test_a_read_only_cache_loads_a_sound_build_and_refuses_a_damaged_one_in_one_line(cache):
    with mounted("--bind", str(cache), str(cache)):
        with mounted("-o", "remount,bind,ro", str(cache)):
            res = _load(cache)
            assert res.returncode == 0 and res.stdout.strip() == f"loaded {_library(cache)}", res.stderr[-2000:]
    _truncate(_library(cache))
    with mounted("--bind", str(cache), str(cache)):
        with mounted("-o", "remount,bind,ro", str(cache)):
            res = _load(cache)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == (f"refused: its cache {str(cache)!r} holds no complete build and cannot be written "
                                  f"(Read-only file system): delete that folder where you can, or set "
                                  f"TORCH_EXTENSIONS_DIR to a folder you can write")


@pytest.mark.slow  # a tmpfs mount, two interpreters
def test_a_full_disk_under_the_cache_is_refused_in_one_line_and_never_loaded(cache, tmp_path):
    so = _library(cache)
    room = tmp_path / "full"
    room.mkdir()
    used = sum(p.stat().st_size for p in cache.iterdir() if p != so)
    with mounted("-t", "tmpfs", "-o", f"size={used // 1024 + 64}k", "tmpfs", str(room)):
        folder = room / cache.name
        shutil.copytree(cache, folder, ignore=shutil.ignore_patterns(so.name))
        for _ in range(2):  # the link the full disk cut short is not taken for a build the next time
            res = _load(folder)
            assert res.returncode == 0, res.stderr[-2000:]
            line = res.stdout.strip()
            assert line.startswith(f"refused: the build in {str(folder)!r} failed (") and "\n" not in line, line
            assert fused.damaged(folder, folder.name)


@pytest.mark.slow  # two interpreters
def test_two_processes_at_once_build_once(cache):
    _library(cache).unlink()
    log = cache / ".ninja_log"
    before = log.read_text().count(".so")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(cache.parent), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", LOAD], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    assert [o.strip() for o, _ in outs] == [f"loaded {_library(cache)}"] * 2
    assert log.read_text().count(".so") == before + 1  # one link between them
