"""Several jobs one after another in one launch, for reference runs:

    mpiexec -n R python tests/many_jobs.py JOBS.json   # a JSON list of argument lists

Every rank imports torch and mpifl once where a launch per job pays it each time
(4-5 s a rank on the test machine: most of a short test run). Only a reference
is made this way; a run a test checks is launched as a user launches it. Stops at
the first job that does not exit 0, with its status."""

import json
import sys
from pathlib import Path

from mpifl.comm import exit_all
from mpifl.main import main

if __name__ == "__main__":
    code = 0
    for argv in json.loads(Path(sys.argv[1]).read_text()):
        code = main(argv)
        if code:
            print(f"many_jobs: {argv} exited {code}", file=sys.stderr)
            break
    exit_all(code)
