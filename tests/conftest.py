"""The fast tier (``pytest -m "not slow"``) starts no Python interpreter, MPI
launcher or shell script: a test that does (mpiexec, ``python -m ...``, a
stand-in ``sbatch``) is marked ``@pytest.mark.slow``, and one that is not fails
here at that start with a line that says so. Libraries' own probes at import
(``uname -p``, ``ldconfig``) are let through; a test may still replace
``subprocess.Popen`` with a stand-in of its own. Built-in datasets are cached
for the session only (``MPIFL_CACHE``). The fused conv kernel is built by the
``fused_kernel`` fixture, for the tests that ask for it: collecting compiles nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import pytest

HEAVY = re.compile(r"(python[0-9.]*|mpiexec|mpirun|hydra_pmi_proxy|srun|sbatch|bash|sh|dash)")


def _heavy(args) -> bool:
    first = str(args if isinstance(args, (str, bytes, os.PathLike)) else args[0])
    first = first.split()[0] if isinstance(args, str) else first
    return (first == sys.executable or HEAVY.fullmatch(os.path.basename(first)) is not None
            or first.startswith(tempfile.gettempdir()))


class _FastTierPopen(subprocess.Popen):
    def __init__(self, args, *a, **k):
        if _heavy(args):
            raise AssertionError(f"this test starts {str(args)[:80]}; mark it @pytest.mark.slow: the fast tier "
                                 f"(pytest -m 'not slow') starts no interpreter, launcher or script")
        super().__init__(args, *a, **k)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request, monkeypatch):
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setattr(subprocess, "Popen", _FastTierPopen)
    yield


@pytest.fixture(autouse=True, scope="session")
def _dataset_cache(tmp_path_factory):
    """Built-in datasets cached for this pytest run only (runs started by tests inherit
    it): the suite neither reads nor fills the user's ~/.cache/mpifl."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MPIFL_CACHE", str(tmp_path_factory.mktemp("dataset-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def fused_kernel():
    """mpifl.train.fused's compiled kernel, built (or found in the extension cache)
    on first use; the test is skipped where it does not build. Its tests check the
    kernel's bits, so under ``train.fused_conv=auto`` it is timed the faster here on
    any CPU (``fused.timed``: fused 0 s, torch's 1 s); the timing itself is tested
    apart (tests/train/test_train_fused.py, tests/mpi/train/test_fused_conv.py)."""
    from mpifl.train import fused

    built = fused._build()
    if isinstance(built, str):
        pytest.skip(f"the fused kernel does not build here: {built}")
    mp = pytest.MonkeyPatch()
    mp.setattr(fused, "timed", lambda key, measure: (0.0, 1.0))
    yield built
    mp.undo()
