"""What a sweep is, as loaded from its file: its points (one run config each),
its SLURM options and the checks that keep them safe to write into an sbatch
script. The parts of ``mpifl.sweep.cli`` (its status, drivers and point selection)
name these types, so they live apart from the commands that use them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpifl import config as config_mod
from mpifl.errors import ConfigError, check, shorten
from mpifl.paths import beneath

if TYPE_CHECKING:  # building Config imports every algorithm: only when points are loaded
    from mpifl.config import Config


@dataclass
class SlurmOptions:
    ntasks: int = 1  # MPI ranks per run (srun tasks)
    cpus_per_task: int = 1  # also OMP_NUM_THREADS and torch threads per rank
    gpus_per_task: int = 0  # 0: no GPU request (the run picks CPU)
    mpi: str = "pmi2"  # srun --mpi plugin that starts the MPI library's ranks
    time: str = "01:00:00"  # per run; requeued ahead of it (signal_s)
    signal_s: int = 300  # seconds before the time limit to requeue
    partition: str = ""
    account: str = ""
    mem: str = ""  # e.g. 16G; empty: the cluster's default
    max_parallel: int = 0  # array throttle (%N); 0 = no limit
    python: str = ""  # interpreter on the compute nodes; empty: this one
    sbatch: list[str] = field(default_factory=list)  # extra "#SBATCH" arguments, e.g. ["--qos=long"]
    srun: list[str] = field(default_factory=list)  # extra srun arguments
    setup: list[str] = field(default_factory=list)  # shell lines before the launch, e.g. module load
    allow_local_paths: bool = False  # a one-node cluster: workdir, python, out_dir may be under /tmp

    @classmethod
    def from_dict(cls, raw: Any, where: str = "slurm") -> SlurmOptions:
        """Options from a mapping, each value coerced as config keys are
        (``mpifl.config.build``), then the ranges and script-safety checks."""
        out = config_mod.build(cls, {} if raw is None else raw, where)
        for f in fields(cls):
            v = getattr(out, f.name)
            if isinstance(v, int) and not isinstance(v, bool):
                check(v >= 0, f"{where}.{f.name}", v, "must be an integer >= 0")
        check(out.ntasks >= 1, f"{where}.ntasks", out.ntasks, "must be >= 1")
        check(out.cpus_per_task >= 1, f"{where}.cpus_per_task", out.cpus_per_task, "must be >= 1")
        check(re.fullmatch(r"[A-Za-z0-9_.-]+", out.mpi) is not None, f"{where}.mpi", out.mpi,
              "an srun --mpi plugin name, e.g. pmi2, pmix")
        check_script_values(out, where)
        return out


# What may reach a #SBATCH line unquoted. SLURM's own formats, narrowed to
# characters with no meaning to sbatch's or bash's parsing.
SLURM_FORMATS = {
    "time": (r"(UNLIMITED|INFINITE|infinite|unlimited|([0-9]+-)?[0-9]+(:[0-9]+){0,2})",
             "a SLURM time limit such as 01:00:00, 2-00:00:00 or 90"),
    "partition": (r"[A-Za-z0-9_.,-]*", "partition names (letters, digits, _ . , -)"),
    "account": (r"[A-Za-z0-9_.-]*", "an account name (letters, digits, _ . -)"),
    "mem": (r"([0-9]+[KMGTkmgt]?)?", "an amount such as 16G or 4000M"),
}


def no_control(key: str, value: str) -> None:
    if config_mod.CONTROL.search(value):
        raise ConfigError(f"{key}={shorten(repr(value))} is not allowed; "
                          f"no newlines or other control characters (it goes into an sbatch script)")


def check_script_values(opts: SlurmOptions, where: str = "slurm") -> None:
    """Every option that reaches an sbatch script: no control character (a newline
    would start a shell line), and the values written unquoted on #SBATCH lines in
    SLURM's own formats. ``setup`` lines are shell the user wrote, run as written."""
    for f in fields(opts):
        v = getattr(opts, f.name)
        for i, x in enumerate(v if isinstance(v, list) else [v]):
            if isinstance(x, str):
                no_control(f"{where}.{f.name}" + (f"[{i}]" if isinstance(v, list) else ""), x)
        if f.name in SLURM_FORMATS and not re.fullmatch(SLURM_FORMATS[f.name][0], str(v)):
            raise ConfigError(f"{where}.{f.name}={shorten(repr(v))} is not allowed; "
                              f"{SLURM_FORMATS[f.name][1]}")


@dataclass
class Point:
    index: int
    name: str  # the run name, also the directory under <sweep>/runs
    values: dict[str, Any]  # grid key -> value of this point
    config: Config


@dataclass
class Sweep:
    name: str
    path: Path  # the sweep file
    base: Path | None
    root: Path  # the sweep directory
    set: dict[str, Any]
    grid: dict[str, list] | list[dict[str, list]]  # one grid, or a list whose union is swept
    slurm: SlurmOptions
    points: list[Point]
    selected: list[Point] | None = None  # --only / --points (mpifl.sweep.select); None: every point

    runs_file = beneath("runs.txt")
    script = beneath("array.sbatch")
    log_dir = beneath("logs")

    def chosen(self) -> list[Point]:
        """The points this command acts on: the selection, else every point."""
        return self.points if self.selected is None else self.selected
