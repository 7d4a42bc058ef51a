"""Shared helpers for serial tests that launch ``python -m mpifl.main``."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


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

