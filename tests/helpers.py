"""Shared helpers of the tests: launching ``python -m mpifl.main``, comparing logs, and the
device the tests' own clients go on.

Bits: ``assert_same_logs`` compares two logs bit for bit (timings aside); each test
that calls it says on what that holds."""

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# the launcher beside the interpreter (a venv with the mpich wheel), else the one on PATH
MPIEXEC = Path(sys.executable).parent / "mpiexec"
if not MPIEXEC.exists():
    MPIEXEC = Path(shutil.which("mpiexec") or MPIEXEC)
# Where the tests that build clients themselves put them: MPIFL_TEST_DEVICE (cpu, cuda), else as
# run.device=auto does (the GPU wherever there is one), so that on a GPU machine a test's reference
# sits on the device of the runs it checks (runtime.setup and python -m mpifl.main take auto)
DEVICE = torch.device(os.environ.get("MPIFL_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
if DEVICE.type == "cuda":  # the settings a run takes with its GPU (comm.pick_device), for clients built here too
    from mpifl.comm import faithful_cuda

    faithful_cuda()
TIMING = {"rounds/wall_s", "rounds/comm_s", "rounds/compute_s"}  # wall-clock datasets of a log


def launch(args: list[str], n: int = 1, cwd: Path | None = None, timeout: float = 300,
           module: str = "mpifl.main", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m <module> args`` under ``mpiexec -n n`` (n=0: no launcher);
    ``env``: extra variables (``MPIR_CVAR_NUM_CLIQUES=K``: K simulated nodes)."""
    cmd = [sys.executable, "-m", module, *args]
    if n:
        cmd = [str(MPIEXEC), "-n", str(n), *cmd]
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)



def reference_runs(jobs: dict[str, list[str]], root: Path, n: int = 2, timeout: float = 900) -> dict[str, Path]:
    """Finished runs of ``jobs`` (name -> arguments, without run.out_dir and run.name)
    under ``root``: made in one launch (tests/many_jobs.py: the ranks import torch once
    for every job) by the first test process that asks, which holds a lock on ``root``
    meanwhile; the others wait and reuse them. Name -> run directory."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".done").exists():
            spec = root / "jobs.json"
            spec.write_text(json.dumps([[*args, f"run.out_dir={root}", f"run.name={name}"]
                                        for name, args in jobs.items()]))
            cmd = [str(MPIEXEC), "-n", str(n), sys.executable, str(REPO / "tests" / "many_jobs.py"), str(spec)]
            res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
            assert res.returncode == 0, res.stderr[-3000:]
            (root / ".done").write_text("")
    return {name: root / name for name in jobs}


def shared_tmp(factory) -> Path:
    """A folder every test process of this pytest session shares (under pytest-xdist the
    workers' temporary folders have one parent, new each session)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def assert_same_logs(a, b) -> None:
    """Two run logs (``open_run``) hold the same datasets, bit for bit, timings aside."""
    ka, kb = set(a.keys()) - TIMING, set(b.keys()) - TIMING
    assert ka == kb
    assert a.n_rounds == b.n_rounds
    for k in sorted(ka):
        x, y = a.get(k), b.get(k)
        assert x.shape == y.shape and np.array_equal(x, y, equal_nan=True), k  # bitwise


@contextlib.contextmanager
def mounted(*args: str):
    """``mount args``, unmounted after; skipped where this user cannot mount."""
    where = args[-1]
    res = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if res.returncode:
        pytest.skip(f"needs mount {' '.join(args)}: {res.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", where], check=False)
