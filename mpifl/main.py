"""Entry point: ``python -m mpifl.main CONFIG.yaml [section.key=value ...]``.

Launch with ``mpiexec -n R``/``srun -n R`` (or alone for one rank). User errors
print one line and exit 2 on every rank; anything else aborts all ranks.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

# section.key[.key...]=value; the value may hold anything, "=" included
OVERRIDE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+=")


def parse(argv: list[str]) -> tuple[str | None, list[str]]:
    """(config path or None, overrides). The first argument is the config when it
    is an existing file or does not look like ``section.key=value``: a sweep over
    lr makes paths like ``results/lr=0.1/config.yaml``."""
    ap = argparse.ArgumentParser(prog="python -m mpifl.main", description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", help="YAML config (defaults apply when omitted)")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    a = ap.parse_args(argv)
    if a.config is not None and not os.path.isfile(a.config) and OVERRIDE.match(a.config):
        return None, [a.config, *a.overrides]  # only overrides were given
    return a.config, a.overrides


def main(argv: list[str] | None = None) -> int:
    """Run one job; returns 0, 2 (user error, on every rank) or 75 (preempted after
    a checkpoint). Any other failure aborts every rank."""
    from . import config, runtime
    from .comm import report_crash, world

    path, overrides = parse(sys.argv[1:] if argv is None else argv)
    mpi = world()
    try:
        cfg = config.load(path, overrides, n_ranks=mpi.Get_size())
        runtime.run(cfg, mpi)
    except config.ConfigError as e:
        if mpi.Get_rank() == 0:
            print(f"mpifl: error: {e}", file=sys.stderr, flush=True)
        return 2
    except runtime.Preempted:
        return runtime.PREEMPTED
    except BaseException as e:  # noqa: BLE001 - any crash must take every rank down
        if isinstance(e, SystemExit) and not e.code:
            return 0
        report_crash(mpi, e)
    return 0


if __name__ == "__main__":
    from .comm import exit_all

    code = main()
    # past the interpreter: `python -m mpi4py` would turn a non-zero exit into an
    # MPI_Abort with its own lines; every rank is leaving together anyway
    if code:
        exit_all(code)
