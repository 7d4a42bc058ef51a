"""SLURM: the array script of a sweep and the one-run script (rendered from the
templates in ``slurm/``), the checks before a submission, and ``sbatch`` of the
unfinished points in arrays no larger than the cluster's MaxArraySize."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpifl.errors import ConfigError
from mpifl.paths import REPO, RunDir
from mpifl.sweep.spec import SlurmOptions, Sweep, check_script_values, no_control

if TYPE_CHECKING:  # building Config imports every algorithm: only when points are loaded
    from mpifl.config import Config
from mpifl.sweep.status import is_complete

TEMPLATES = REPO / "slurm"


def render(template: str, values: dict[str, Any]) -> str:
    """Fill ``{{name}}`` placeholders; unknown or unused names are errors."""
    text = (TEMPLATES / template).read_text()
    used = set(re.findall(r"{{(\w+)}}", text))
    missing = used - set(values)
    if missing:
        raise KeyError(f"template {template} needs {sorted(missing)}")
    extra = set(values) - used
    if extra:
        raise KeyError(f"template {template} has no {sorted(extra)}")
    out = []
    for line in text.splitlines():
        whole = re.fullmatch(r"{{(\w+)}}", line)
        if whole and str(values[whole.group(1)]) == "":
            continue
        out.append(re.sub(r"{{(\w+)}}", lambda m: str(values[m.group(1)]), line))
    return "\n".join(out) + "\n"


def _common(opts: SlurmOptions, job_name: str, log_dir: Path, workdir: Path) -> dict[str, Any]:
    """The placeholders both templates share, each validated or quoted for its place."""
    check_script_values(opts)
    no_control("workdir (the current directory)", str(workdir))
    no_control("run.out_dir", str(log_dir))
    # the job name only labels the job: characters with a meaning anywhere become _
    job_name = re.sub(r"[^A-Za-z0-9_.+=-]", "_", job_name)[:200]
    given = {"gpus-per-task": opts.gpus_per_task, "partition": opts.partition, "account": opts.account,
             "mem": opts.mem}
    sbatch = [f"--{flag}={value}" for flag, value in given.items() if value] + list(opts.sbatch)
    return {
        "job_name": job_name, "ntasks": opts.ntasks, "cpus_per_task": opts.cpus_per_task,
        "time": opts.time, "signal_s": opts.signal_s, "mpi": opts.mpi,
        "log_dir": shlex.quote(str(log_dir)), "workdir": shlex.quote(str(workdir)),
        "python": shlex.quote(opts.python or sys.executable),
        "sbatch_extra": "\n".join(f"#SBATCH {a}" for a in sbatch),
        "srun_extra": "".join(f" {shlex.quote(a)}" for a in opts.srun),
        "setup": "\n".join(opts.setup),
        "assumptions": _assumptions(opts, log_dir),
    }


def _assumptions(opts: SlurmOptions, log_dir: Path) -> str:
    """The script's comment on what it takes for granted (docs/cluster.md)."""
    gpus = f"{opts.gpus_per_task} GPU(s)" if opts.gpus_per_task else "no GPU"
    where = (["# - node-local paths allowed (slurm.allow_local_paths): a one-node cluster"] if opts.allow_local_paths
             else ["# - the cd folder, the interpreter and the run directories are on storage",
                   "#   every compute node mounts"])
    env = (f"# - the {len(opts.setup)} setup line(s) below give the nodes python and MPI" if opts.setup
           else "# - no setup lines (slurm.setup): python runs on the nodes without module loads")
    return "\n".join([
        "# Assumes (docs/cluster.md):", *where, env,
        f"# - srun --mpi={opts.mpi} starts the MPI library's ranks (MPI_Init fails, or every rank",
        "#   is rank 0: set slurm.mpi, pmix for Open MPI, pmi2 for MPICH; `srun python -m",
        "#   mpifl.check` tells)",
        f"# - {opts.ntasks} rank(s), each with {opts.cpus_per_task} CPU(s) and {gpus}",
        f"# - USR1 {opts.signal_s} s before the time limit -> checkpoint -> exit 75 -> requeue; a",
        "#   requeued job waits in PD (BeginTime) for about two minutes",
        f"# - SLURM's log: {log_dir}",
    ])


def refuse_node_local(opts: SlurmOptions, workdir: Path, out_dir: Path) -> None:
    """A script for a cluster must not cd into, run an interpreter from, or write
    below a node-local folder: the compute nodes would not find them, and the job
    would fail there, far from the cause. ``slurm.allow_local_paths`` lets a
    one-node cluster do it."""
    from mpifl.check import node_local

    if opts.allow_local_paths:
        return
    for what, path in (("the working directory", workdir), ("the interpreter (slurm.python)",
                                                              opts.python or sys.executable),
                       ("the output folder (out_dir, run.out_dir)", out_dir)):
        root = node_local(path)
        if root:
            raise ConfigError(f"{what} {str(path)!r} is under the node-local {root}, which compute nodes do not "
                              f"share; use a folder on shared storage, or slurm.allow_local_paths: true "
                              f"(--allow-local-paths) on a one-node cluster")


def preflight(configs: list[Config], opts: SlurmOptions, workdir: Path) -> list[str]:
    """``mpifl.check``'s local parts before ``--submit`` (no MPI launch): one line
    per problem, each said once however many points share it."""
    from mpifl.check import launch_problems, local_problems

    found = [p for cfg in configs for p in local_problems(cfg, opts.ntasks)]
    found += launch_problems(opts.python or sys.executable, opts.mpi, opts.ntasks, workdir)
    return list(dict.fromkeys(found))


def array_script(sweep: Sweep, workdir: Path) -> str:
    values = _common(sweep.slurm, sweep.name, sweep.log_dir, workdir)
    values.update({
        "sweep_name": sweep.name, "n_points": len(sweep.points), "last_index": len(sweep.points) - 1,
        "throttle": f"%{sweep.slurm.max_parallel}" if sweep.slurm.max_parallel else "",
        "runs_file": shlex.quote(str(sweep.runs_file)),
    })
    return render("array.sbatch", values)


def run_script(cfg: Config, opts: SlurmOptions, workdir: Path) -> str:
    no_control("run.name", cfg.run.name)
    no_control("run.out_dir", cfg.run.out_dir)
    rd = RunDir(cfg.run_dir.resolve())
    values = _common(opts, cfg.run.name, rd.root, workdir)
    values.update({"run_dir": shlex.quote(str(rd.root)), "script": shlex.quote(str(rd.root / "run.sbatch"))})
    return render("run.sbatch", values)


def _sbatch_exe() -> str:
    exe = shutil.which("sbatch")
    if exe is None:
        raise ConfigError("--submit needs sbatch, which was not found; use --local to run here")
    return exe


def _sbatch(args: list[str]) -> str:
    res = subprocess.run([_sbatch_exe(), "--parsable", *args], check=False, capture_output=True, text=True)
    if res.returncode != 0:
        raise ConfigError(f"sbatch failed (exit {res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout.strip().split(";")[0]


SPEC_MAX = 4096  # characters of one --array value: far below the kernel's 128 KiB per argument


@dataclass(frozen=True)
class Array:
    """One sbatch submission of the array script: task i runs point ``offset + i``
    (``MPIFL_ARRAY_OFFSET``, read by slurm/array.sbatch)."""

    offset: int
    indices: list[int]  # the points, ascending

    @property
    def spec(self) -> str:
        """``--array``'s value without the throttle, as ranges: ``0-999``, ``0-3,5``."""
        from mpifl.errors import ranges

        return ranges([i - self.offset for i in self.indices])


def plan_arrays(todo: list[int], max_array_size: int, spec_max: int = SPEC_MAX) -> list[Array]:
    """The submissions that run the points ``todo`` (ascending): one array whose task
    ids are the point indices when they stay below SLURM's MaxArraySize (the largest
    task id is MaxArraySize - 1); else consecutive arrays, each starting at task 0
    with an offset and spanning fewer than MaxArraySize indices. An array whose
    ``--array`` value would pass ``spec_max`` characters (points scattered by the
    done ones between them) is halved until it fits."""
    if not todo:
        return []
    if todo[-1] < max_array_size:
        arrays = [Array(0, list(todo))]
    else:
        chunks: list[list[int]] = []
        for i in todo:
            if chunks and i - chunks[-1][0] < max_array_size:
                chunks[-1].append(i)
            else:
                chunks.append([i])
        arrays = [Array(c[0], c) for c in chunks]
    out: list[Array] = []
    while arrays:
        a = arrays.pop(0)
        if len(a.indices) == 1 or len(a.spec) <= spec_max:
            out.append(a)
            continue
        h = len(a.indices) // 2
        arrays[:0] = [Array(a.offset, a.indices[:h]), Array(a.indices[h], a.indices[h:])]
    return out


def submission_plan(sweep: Sweep) -> list[Array]:
    """The arrays ``--submit`` will send for the unfinished points, worked out
    before anything is written: sbatch must be there, and SLURM's MaxArraySize
    (``scontrol show config``; 1001, its default, where it does not answer) bounds
    each array."""
    from mpifl.sweep.status import max_array_size

    todo = [p.index for p in sweep.chosen() if not is_complete(p.config)]
    if todo:
        _sbatch_exe()
    return plan_arrays(todo, max_array_size())


def submit(sweep: Sweep, plan: list[Array] | None = None) -> list[str]:
    """Submit the unfinished points (``plan``: :func:`submission_plan`'s arrays);
    returns the job ids, one per array (none: nothing to do). With
    ``slurm.max_parallel`` each array waits for the one before (afterany), so the
    throttle holds for the whole sweep."""
    from mpifl.sweep.status import record_submission

    plan = submission_plan(sweep) if plan is None else plan
    jobs: list[str] = []
    throttle = f"%{sweep.slurm.max_parallel}" if sweep.slurm.max_parallel else ""
    for a in plan:
        args = [f"--array={a.spec}{throttle}"]
        if a.offset:
            args.append(f"--export=ALL,MPIFL_ARRAY_OFFSET={a.offset}")
        if throttle and jobs:
            args.append(f"--dependency=afterany:{jobs[-1]}")
        try:
            job = _sbatch([*args, str(sweep.script)])
        except ConfigError as e:
            if not jobs:
                raise
            raise ConfigError(f"{e} (after {len(jobs)} of {len(plan)} arrays were submitted: jobs "
                              f"{', '.join(jobs)}; `--status` shows their points)") from None
        record_submission(sweep, job, a.indices, a.offset)
        jobs.append(job)
    return jobs
