#!/usr/bin/env bash
# The test command: serial tests, then the MPI tests under 2 and 4 ranks
# (through mpi4py's runner, so a failing rank aborts the job instead of hanging).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
MPIEXEC=$(dirname "$PY")/mpiexec
"$PY" -m pytest -q tests
"$MPIEXEC" -n 2 "$PY" -m mpi4py -m pytest -x -q -p no:cacheprovider tests/mpi
"$MPIEXEC" -n 4 "$PY" -m mpi4py -m pytest -x -q -p no:cacheprovider tests/mpi
# uneven blocks (2, 2, 3 clients) for the ring-based all-pairs evaluations
"$MPIEXEC" -n 3 "$PY" -m mpi4py -m pytest -x -q -p no:cacheprovider tests/mpi/test_pfedlia_mpi.py tests/mpi/test_comm.py
