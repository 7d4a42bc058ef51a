"""Entry point: ``python -m mpifl.main CONFIG.yaml [section.key=value ...]``.

Launch with ``mpiexec -n R python -m mpi4py -m mpifl.main ...`` (or ``srun -n R``;
alone for one rank). User errors print one line and exit 2 on every rank;
anything else aborts all ranks.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

# section.key[.key...]=value; the value may hold anything, "=" included
OVERRIDE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+=")


EPILOG = """\
launch on R ranks:  mpiexec -n R python -m mpi4py -m mpifl.main CONFIG.yaml [section.key=value ...]
every config key (default, type, allowed values, meaning):  python -m mpifl.config
the resolved config of a file with overrides:  python -m mpifl.config CONFIG.yaml [section.key=value ...]
"""


def parse(argv: list[str], prog: str = "python -m mpifl.main", description: str = "Run one federated-learning job.",
          epilog: str = EPILOG) -> tuple[str | None, list[str]]:
    """(config path or None, overrides). The first argument is the config when it
    is an existing file or does not look like ``section.key=value``: a sweep over
    lr makes paths like ``results/lr=0.1/config.yaml``. Every entry point that takes
    ``CONFIG [section.key=value ...]`` parses it here."""
    ap = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", help="YAML config (defaults apply when omitted)")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    a = ap.parse_args(argv)
    if a.config is not None and not os.path.isfile(a.config) and OVERRIDE.match(a.config):
        return None, [a.config, *a.overrides]  # only overrides were given
    return a.config, a.overrides


def main(argv: list[str] | None = None) -> int:
    """Run one job; returns 0, 2 (user error, on every rank) or 75 (preempted after
    a checkpoint). Any other failure aborts every rank."""
    # arguments first: --help and usage errors must not wait for torch and MPI
    path, overrides = parse(sys.argv[1:] if argv is None else argv)
    from . import config, runtime
    from .comm import report_crash, world

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
    code = main()
    # past the interpreter: `python -m mpi4py` would turn a non-zero exit into an
    # MPI_Abort with its own lines; every rank is leaving together anyway
    if code:
        from .comm import exit_all

        exit_all(code)
