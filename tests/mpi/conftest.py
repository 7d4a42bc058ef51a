"""Fixtures for tests run under ``mpiexec -n K python -m mpi4py -m pytest -x tests/mpi``.

Every rank runs every test; a failing rank aborts the job (mpi4py's runner), so
a broken collective fails fast instead of hanging.
"""

import tempfile
from pathlib import Path

import pytest

from mpifl.comm import world


@pytest.fixture(scope="session")
def mpi():
    return world()


@pytest.fixture
def shared_tmp(mpi):
    """One temporary directory, the same path on every rank."""
    path = tempfile.mkdtemp(prefix="mpifl-test-") if mpi.Get_rank() == 0 else None
    path = mpi.bcast(path, root=0)
    yield Path(path)
    mpi.Barrier()
