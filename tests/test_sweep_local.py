"""``--local`` gives the same files as the SLURM path: the array script that
``python -m mpifl.sweep`` renders, run task by task with a stand-in ``srun`` that
starts the ranks with mpiexec (the real SLURM test is .ci/slurm.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_sweep import ROOT, _exe, _sweep_file

from mpifl import sweep as sw
from mpifl.logging.h5 import open_run


def _fake_srun(bin_: Path) -> None:
    """srun's launch without SLURM: drop srun's options, start the ranks with mpiexec."""
    mpiexec = sw._mpiexec()
    _exe(bin_ / "srun", "#!/bin/bash\n"
                        'while [[ "$1" == --* ]]; do shift; done\n'
                        f'exec {mpiexec} -n "$SLURM_NTASKS" "$@"\n')


@pytest.mark.slow
def test_local_gives_the_same_files_as_the_slurm_array(tmp_path):
    if sw._mpiexec() is None:
        pytest.skip("needs mpiexec")
    path = _sweep_file(tmp_path, {"algorithm.name": ["fedavg", "oracle"]}, slurm={"ntasks": 2})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    py = sys.executable

    local = subprocess.run([py, "-m", "mpifl.sweep", str(path), "--out-dir", str(tmp_path / "local"), "--local",
                            "--allow-local-paths"],  # as below: sweep.yaml records it
                           cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stdout + local.stderr

    # the SLURM path: the same sweep written, then each array task run by the rendered script
    written = subprocess.run([py, "-m", "mpifl.sweep", str(path), "--out-dir", str(tmp_path / "slurm"),
                              "--allow-local-paths"],  # tmp_path is under /tmp
                             cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _fake_srun(bin_)
    script = tmp_path / "slurm" / "s" / "array.sbatch"
    for task in range(2):
        task_env = {**env, "PATH": f"{bin_}{os.pathsep}{env['PATH']}", "SLURM_ARRAY_TASK_ID": str(task),
                    "SLURM_ARRAY_JOB_ID": "77", "SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "1"}
        res = subprocess.run(["bash", str(script)], env=task_env, check=False, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "mpifl: task 77_" in res.stdout

    a, b = tmp_path / "local" / "s", tmp_path / "slurm" / "s"
    files = lambda root: sorted(str(p.relative_to(root)) for p in (root / "runs").rglob("*") if p.is_file())
    # per point: config.yaml, run.h5 and the final checkpoint (latest, meta, one part per rank)
    assert files(a) == files(b) and len(files(a)) == 2 * 6
    for run in sorted((a / "runs").iterdir()):
        other = b / "runs" / run.name
        ca, cb = (yaml.safe_load((d / "config.yaml").read_text()) for d in (run, other))
        assert ca["run"].pop("out_dir") == str(a / "runs") and cb["run"].pop("out_dir") == str(b / "runs")
        assert ca == cb
        ra, rb = open_run(run), open_run(other)
        assert ra.complete and rb.complete and ra.attrs["n_ranks"] == rb.attrs["n_ranks"] == 2
        assert set(ra.keys()) == set(rb.keys())
        for key in ("metrics/test_acc", "metrics/val_acc", "graph/mixing", "comm/bytes_sent"):
            np.testing.assert_allclose(ra.get(key), rb.get(key), rtol=1e-5, atol=1e-6)
    assert (a / "sweep.yaml").read_text() == (b / "sweep.yaml").read_text()
