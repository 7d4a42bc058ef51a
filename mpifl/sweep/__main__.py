"""``python -m mpifl.sweep``: see :mod:`mpifl.sweep`."""

import sys

from mpifl.cli import quiet_pipe
from mpifl.sweep.cli import main

sys.exit(quiet_pipe(main))
