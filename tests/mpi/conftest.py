"""Fixtures for tests run under ``mpiexec -n K python -m mpi4py -m pytest -x tests/mpi``.

Every rank runs every test; a failing rank aborts the job (mpi4py's runner), so
a broken collective fails fast instead of hanging.
"""

import shutil
import tempfile
from pathlib import Path

import pytest

from mpifl.comm import world


@pytest.fixture(scope="session")
def mpi():
    return world()


def shared_dir(mpi):
    """Yield one new temporary directory, the same path on every rank; rank 0
    removes it once every rank is past its last use (a CI runner's /tmp is not
    ours to fill: 3,000 runs of this suite left 1.6 GB)."""
    path = tempfile.mkdtemp(prefix="mpifl-test-") if mpi.Get_rank() == 0 else None
    path = mpi.bcast(path, root=0)
    try:
        yield Path(path)
    finally:
        mpi.Barrier()
        if mpi.Get_rank() == 0:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shared_tmp(mpi):
    """One temporary directory, the same path on every rank."""
    yield from shared_dir(mpi)


@pytest.fixture(scope="module")
def module_tmp(mpi):
    """One temporary directory for a module's tests, the same path on every rank."""
    yield from shared_dir(mpi)
