"""What the entry points import: a run loads what its job needs and no more
(scikit-learn where clustering runs, torchvision where its datasets are read,
matplotlib where figures are drawn), since every import is paid at every start
of every rank and every point of a sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow  # each case starts a Python process

# never needed before the first round of a plain run
HEAVY = ("sklearn", "torchvision", "matplotlib", "pandas", "mnist1d", "scipy.sparse", "scipy.stats", "PIL")


def modules_after(code: str, tmp_path, **env) -> set[str]:
    """sys.modules after running ``code`` in a fresh interpreter."""
    script = code + "\nimport json, sys\nprint('MODULES', json.dumps(sorted(sys.modules)))\n"
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600,
                         check=False, env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("MODULES "))
    return set(json.loads(line.split(" ", 1)[1]))


def loaded(mods: set[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in mods)


def test_the_quickstart_imports_nothing_it_does_not_use(tmp_path):
    run = ("from mpifl.main import main\n"
           f"assert main(['jobs/quickstart.yaml', 'run.rounds=1', 'run.out_dir={tmp_path}', "
           "'run.resume=never']) == 0\n")
    cache = {"MPIFL_CACHE": str(tmp_path / "cache")}
    modules_after(run, tmp_path, **cache)  # the first run makes mnist1d and caches it
    mods = modules_after(run, tmp_path, **cache)
    assert loaded(mods, "torch") and loaded(mods, "h5py") and loaded(mods, "mpi4py")  # the check can fail
    assert [m for m in HEAVY if loaded(mods, m)] == []


def test_a_clustering_algorithm_loads_scikit_learn_when_it_clusters(tmp_path):
    run = ("from mpifl.main import main\n"
           f"assert main(['jobs/quickstart.yaml', 'algorithm.name=cfl', 'cfl.warmup_rounds=1', 'cfl.eps1=10', "
           f"'cfl.eps2=0.01', 'cfl.min_size=1', 'run.rounds=3', 'run.out_dir={tmp_path}', 'run.resume=never']) == 0\n")
    mods = modules_after(run, tmp_path, MPIFL_CACHE=str(tmp_path / "cache"))
    assert loaded(mods, "sklearn")


def test_the_warm_worker_imports_the_runtime_and_does_not_start_mpi(tmp_path):
    mods = modules_after("from mpifl.sweep import worker\nworker.warm_up()\nfrom mpi4py import MPI\n"
                         "assert not MPI.Is_initialized()\n", tmp_path)
    assert loaded(mods, "torch") and "mpifl.run.runtime" in mods and "mpifl.algorithms.dpfl" in mods
    assert [m for m in HEAVY if loaded(mods, m)] == []


def test_a_sweep_lists_and_writes_its_points_without_the_heavy_packages(tmp_path):
    args = ["jobs/sweeps/quickstart-algorithms.yaml", "--out-dir", str(tmp_path), "--allow-local-paths"]
    mods = modules_after(f"from mpifl.sweep import cli\nassert cli.main({args!r}) == 0\n", tmp_path)
    assert "mpifl.algorithms.pfedlia_params" in mods and (tmp_path / "quickstart-algorithms" / "runs.txt").is_file()
    assert [m for m in HEAVY if loaded(mods, m)] == []


def training_code(mods: set[str]) -> list[str]:
    """torch and the algorithm modules (the registry itself, ``mpifl.algorithms``, the
    algorithms' config parts, ``mpifl.algorithms.<name>_params``, and the sections
    several share, ``mpifl.algorithms.shared_params``, are not)."""
    return sorted(m for m in mods if m == "torch" or (m.startswith("mpifl.algorithms.") and not m.endswith("_params")))


def test_the_config_package_and_its_schema_import_no_training_code(tmp_path):
    mods = modules_after("import mpifl.config\nfrom mpifl.schema import ConfigBase\n", tmp_path)
    assert "mpifl.schema" in mods and "mpifl.algorithms" in mods  # the check can fail
    assert training_code(mods) == []


RESOLVE = """\
import runpy, sys
sys.argv = ["python -m mpifl.config", "jobs/quickstart.yaml"]
try:
    runpy.run_module("mpifl.config", run_name="__main__")
except SystemExit as e:
    assert e.code in (0, None), e.code
"""


def test_resolving_a_config_imports_neither_torch_nor_an_algorithm(tmp_path):
    mods = modules_after(RESOLVE, tmp_path)
    assert "mpifl.config.compose" in mods  # the check can fail
    assert training_code(mods) == []
