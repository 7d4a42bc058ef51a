"""What a user sees from ``python -m mpifl.main``: the help, the progress lines and
the closing line, in this process (single rank) where no MPI launch is needed."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import MPIEXEC, REPO

from mpifl.logging.h5 import open_run
from mpifl.main import main

TINY = ["data.name=synthetic", "data.n_samples=400", "data.n_clients=4", "model.hidden=[8]", "run.threads=1",
        "algorithm.name=local"]


@pytest.mark.slow
def test_help_is_fast_and_points_to_the_config_reference():
    # torch must not be imported for --help: it costs seconds (15 s on a loaded machine)
    code = ("import runpy, sys; sys.argv = ['mpifl.main', '--help']\n"
            "try:\n    runpy.run_module('mpifl.main', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch imported:', 'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert "torch imported: False" in res.stdout
    assert "python -m mpifl.config CONFIG.yaml" in res.stdout
    assert "python -m mpi4py -m mpifl.main" in res.stdout


def _config_mistakes(tmp_path) -> dict[str, list[str]]:
    """Arguments of mpifl.main that name a config it cannot use: case -> argv."""
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00run:")
    locked = tmp_path / "locked.yaml"
    locked.write_text("run:\n  rounds: 3\n")
    locked.chmod(0)
    cases = {"missing": [str(tmp_path / "quickstrat.yaml")], "a folder": [str(tmp_path)],
             "not text": [str(tmp_path / "binary.yaml")], "unknown key": ["jobs/quickstart.yaml", "run.roundz=3"]}
    if os.geteuid() != 0:  # root reads a file whatever its mode
        cases["unreadable"] = [str(locked)]
    return cases


@pytest.mark.slow
def test_a_config_mistake_is_answered_before_torch_is_imported(tmp_path):
    """A missing, unreadable or non-YAML config file and an unknown key: one line,
    exit 2, and torch never imported (``-X importtime`` lists every import), alone
    and under mpiexec with mpi4py's runner (one line from two ranks)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for case, args in _config_mistakes(tmp_path).items():
        res = subprocess.run([sys.executable, "-X", "importtime", "-m", "mpifl.main", *args], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        errors = [ln for ln in res.stderr.splitlines() if not ln.startswith("import time:")]
        assert res.returncode == 2 and len(errors) == 1 and errors[0].startswith("mpifl: error: "), (case, res.stderr)
        imported = {ln.split("|")[-1].strip() for ln in res.stderr.splitlines() if ln.startswith("import time:")}
        assert "mpifl.config" in imported and not {m for m in imported if m.split(".")[0] == "torch"}, case
    res = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "mpifl.main",
                          str(tmp_path / "quickstrat.yaml")], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"mpifl: error: config file '{tmp_path / 'quickstrat.yaml'}' not found"], res.stderr


def test_rerun_of_a_finished_run_reports_its_final_accuracy(tmp_path, capsys):
    args = [*TINY, "run.rounds=4", f"run.out_dir={tmp_path}", "run.name=fin"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0  # run.resume=auto, nothing left to do
    out = capsys.readouterr().out
    final = float(np.nanmean(open_run(tmp_path / "fin").metric("test_acc")[-1]))
    assert "nan" not in out
    assert f"final mean test_acc {final:.4f}" in out
    assert "already finished" in out
    assert open_run(tmp_path / "fin").n_rounds == 4


def test_progress_line_marks_accuracy_carried_over_from_an_earlier_round(tmp_path, capsys):
    assert main([*TINY, "run.rounds=6", "run.eval_every=2", f"run.out_dir={tmp_path}", "run.name=ev"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("round")]
    assert len(lines) == 6
    acc = float(np.nanmean(open_run(tmp_path / "ev").metric("test_acc")[1]))
    assert f"test_acc {acc:.4f}  " in lines[1]  # evaluated: the plain value
    assert f"test_acc {acc:.4f} (round 2)" in lines[2]  # carried over: marked with its round
    assert "(round" not in lines[3] and "(round" not in lines[5]
    assert "--" in lines[0] and "nan" not in lines[0]  # nothing evaluated yet
