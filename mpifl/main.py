"""Entry point: ``python -m mpifl.main CONFIG.yaml [section.key=value ...]``.

Launch with ``mpiexec -n R python -m mpi4py -m mpifl.main ...`` (or ``srun -n R``;
alone for one rank). User errors print one line and exit 2 on every rank;
anything else aborts all ranks.
"""

from __future__ import annotations

import os
import sys

from mpifl.cli import parse

EPILOG = """\
launch forms:
  one rank:          python -m mpifl.main CONFIG.yaml [section.key=value ...]
  R ranks:           mpiexec -n R python -m mpi4py -m mpifl.main CONFIG.yaml [section.key=value ...]
  SLURM, R ranks:    srun -n R python -m mpi4py -m mpifl.main CONFIG.yaml [...]   (--mpi=pmi2 for MPICH)
  preflight:         srun -n R python -m mpi4py -m mpifl.check CONFIG.yaml [...]
every config key (default, type, allowed values, meaning):  python -m mpifl.config
the resolved config of a file with overrides:  python -m mpifl.config CONFIG.yaml [section.key=value ...]
"""


def _option_hint(unknown: list[str]) -> str:
    """:func:`mpifl.config.option_hint`, imported only when an option needs it (``--help`` stays fast)."""
    from mpifl.config import option_hint

    return option_hint(unknown)


def launch_rank() -> int:
    """This process's rank, before torch and before MPI is asked: mpi4py's runner's
    (``python -m mpi4py``) where it has started MPI, else the launcher's variables
    (MPICH's and Open MPI's mpiexec, srun), else 0."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def leave_early(code: int) -> None:
    """Exit with ``code`` without importing torch (what :func:`mpifl.comm.exit_all`
    does, less the import): MPI finalised where mpi4py's runner started it, which
    would turn a non-zero exit into an MPI_Abort with its own lines."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except OSError:
            pass
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run one job; returns 0, 2 (user error, on every rank), 74 (a write of the log
    or a checkpoint refused: full disk or quota, I/O error; on every rank) or 75
    (preempted after a checkpoint). Any other failure aborts every rank."""
    # arguments first: --help and usage errors must not wait for torch and MPI
    path, overrides = parse(sys.argv[1:] if argv is None else argv, prog="python -m mpifl.main",
                            description="Run one federated-learning job.", epilog=EPILOG, hint=_option_hint)
    from mpifl import config
    from mpifl.errors import STORAGE_EXIT, ConfigError, StorageError

    try:  # the file and its keys, before torch and MPI are imported (seconds): a typo answers at once
        config.check_keys(path, overrides)
    except ConfigError as e:
        if launch_rank() == 0:
            print(f"mpifl: error: {e}", file=sys.stderr, flush=True)
        return 2
    from mpifl.comm import report_crash, world
    from mpifl.run import runtime

    mpi = world()
    try:
        cfg = config.load(path, overrides, n_ranks=mpi.Get_size())
        _warn_unread(cfg, mpi.Get_rank())
        runtime.run(cfg, mpi)
    except ConfigError as e:
        if mpi.Get_rank() == 0:
            print(f"mpifl: error: {e}", file=sys.stderr, flush=True)
        return 2
    except StorageError as e:  # every rank raised it together; what was committed is kept
        if mpi.Get_rank() == 0:
            print(f"mpifl: error: {e}", file=sys.stderr, flush=True)
        return STORAGE_EXIT
    except runtime.Preempted:
        return runtime.PREEMPTED
    except BaseException as e:  # noqa: BLE001 - any crash must take every rank down
        if isinstance(e, SystemExit) and not e.code:
            return 0
        report_crash(mpi, e)
    return 0


def _warn_unread(cfg, rank: int) -> None:
    """One line on rank 0 naming the keys of algorithms the run does not select
    (mpifl.config.identity: not part of the run's identity)."""
    from mpifl.config.identity import unread_text

    text = unread_text(cfg.to_dict())
    if text and rank == 0:
        print(f"mpifl: warning: {text}: not read by algorithm.name={cfg.algorithm.name}; ignored, and not part of "
              f"the run's identity", file=sys.stderr, flush=True)


if __name__ == "__main__":
    code = main()
    # past the interpreter: `python -m mpi4py` would turn a non-zero exit into an
    # MPI_Abort with its own lines, and tearing the interpreter down (torch's modules)
    # costs a third of a second of every run; the run has closed its files, and
    # every rank is leaving together anyway. A profiler or tracer (cProfile,
    # coverage) writes its results at exit: then a success leaves the usual way.
    if code and "torch" not in sys.modules:  # a mistake in the config or its keys: no wait for torch to leave
        leave_early(code)
    if code or (sys.getprofile() is None and sys.gettrace() is None):
        from mpifl.comm import exit_all

        exit_all(code)
