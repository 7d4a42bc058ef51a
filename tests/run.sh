#!/usr/bin/env bash
# The test command: tests/ (two at a time), then the MPI tests under 2 and 4 ranks and over simulated nodes
# (through mpi4py's runner, so a failing rank aborts the job instead of hanging).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
MPIEXEC=$(dirname "$PY")/mpiexec
# the serial tests on two processes (pytest-xdist): most of them wait on their own mpiexec
# or Python children, so two at a time keep both cores busy (26.8 min here, 2 cores)
"$PY" -m pytest -q -n 2 tests
"$MPIEXEC" -n 2 "$PY" -m mpi4py -m pytest -x -q -p no:cacheprovider tests/mpi
"$MPIEXEC" -n 4 "$PY" -m mpi4py -m pytest -x -q -p no:cacheprovider tests/mpi
# uneven blocks (2, 2, 3 clients) for the ring-based all-pairs evaluations
"$MPIEXEC" -n 3 "$PY" -m mpi4py -m pytest -x -q -p no:cacheprovider tests/mpi/algorithms/test_pfedlia_mpi.py tests/mpi/comm/test_comm.py
# simulated nodes: MPICH splits MPI_COMM_TYPE_SHARED into K groups (ranks dealt round-robin), so
# the node-local rules (GPU, threads), the preflight's layout report and the sums run as on K nodes:
# 2 x 2 ranks, 4 x 2 ranks, and an uneven 2 + 1 + 1
MPIR_CVAR_NUM_CLIQUES=2 "$MPIEXEC" -n 4 "$PY" -m mpi4py -m pytest -x -q -p no:cacheprovider tests/mpi/comm/test_setup.py \
    tests/mpi/test_check.py tests/mpi/comm/test_comm.py
MPIR_CVAR_NUM_CLIQUES=4 "$MPIEXEC" -n 8 "$PY" -m mpi4py -m pytest -x -q -p no:cacheprovider tests/mpi/comm/test_setup.py \
    tests/mpi/comm/test_comm.py
MPIR_CVAR_NUM_CLIQUES=3 "$MPIEXEC" -n 4 "$PY" -m mpi4py -m pytest -x -q -p no:cacheprovider tests/mpi/comm/test_setup.py \
    tests/mpi/test_check.py
