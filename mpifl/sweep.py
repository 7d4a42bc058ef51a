"""Sweeps: ``python -m mpifl.sweep SWEEP.yaml [--dry-run | --submit | --local | --status] [--set k=v]``.

A sweep file names a base config, overrides for every point and a grid (here
jobs/sweeps/dpfl-budget.yaml with more of the options)::

    name: dpfl-budget               # sweep directory: <out_dir>/<name>
    base: ../dpfl-cifar10-dir.yaml  # relative to this file; optional
    out_dir: results                # optional; default: the base config's run.out_dir
    set:                            # optional; dotted keys applied to every point
      run.rounds: 100
    grid:                           # the cartesian product of these lists
      dpfl.budget: [inf, 0.2N, 0.1N]
      run.seed: [0, 1, 2]
      # grid: [{...}, {...}]           a list of grids: the union of their products
      # base: [../a.yaml, ../b.yaml]   a grid over config files instead of one base;
      # algorithm.name: [~, local]     ~ keeps the base's own value
    slurm:                          # optional; see SlurmOptions
      ntasks: 4
      gpus_per_task: 1
      time: "02:00:00"

Every point becomes a validated config in its own run directory,
``<sweep>/runs/<NNN_key-value_...>/config.yaml`` (``run.out_dir`` and ``run.name``
are set by the sweep), and ``<sweep>/array.sbatch`` runs line
``MPIFL_ARRAY_OFFSET`` + i + 1 of ``<sweep>/runs.txt`` as array task i (the offset
is 0 unless ``--submit`` splits the points at SLURM's MaxArraySize). A run
directory is the unit of work: re-running the sweep keeps each point's config
of the same experiment (a larger ``run.rounds`` rewrites it and extends the run,
``mpifl.config.identity``; another experiment's is refused), ``--submit`` and
``--local`` skip runs whose log is complete, and a resubmitted point continues
in the same directory. ``--local --parallel N`` runs N points at once (each with
``--ranks`` ranks): on a workstation, N x ranks x ``run.threads`` up to the cores.
One-rank points run on N warm workers (``mpifl.sweep.worker``) that import torch and
mpifl once and fork a child per point, which skips each run's start-up;
``--mpiexec`` starts every point as its own ``mpiexec`` process instead.

``--set section.key=value`` (or ``section.key=value`` after the file) applies to
every point, after the file's ``set:``, and is recorded in each point's config:
``--set run.rounds=3 --out-dir /tmp/try`` tries someone's sweep small.
``--status`` prints each point's state (``mpifl.sweep.status``).

``python -m mpifl.sweep --run CONFIG.yaml [a.b=v ...]`` renders the one-run
script ``<run_dir>/run.sbatch`` instead (and submits it with ``--submit``).

Templates live in ``slurm/`` at the repository root; ``{{name}}`` placeholders
are filled here, and a placeholder alone on its line that renders empty drops the
line.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mpifl import config as config_mod
from mpifl.errors import ConfigError, shorten
from mpifl.paths import RunDir, atomic_write_text
from mpifl.sweep.select import select
from mpifl.sweep.spec import Point, SlurmOptions, Sweep, check_script_values, no_control
from mpifl.yamlio import read_yaml

if TYPE_CHECKING:  # building Config imports every algorithm: only when points are loaded
    from mpifl.config import Config

TEMPLATES = Path(__file__).resolve().parent.parent / "slurm"
RESERVED = ("run.name", "run.out_dir")  # the sweep owns where each point runs
BASE = "base"  # the grid key that varies the config file itself
_ABSENT = object()  # a key of another grid in a list of grids


# --------------------------------------------------------------------------- loading


def _mapping(raw: Any, key: str) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key} must be a mapping of section.key: value, got {raw!r}")
    return raw


def _slug(value: Any) -> str:
    if value is None:  # a grid's ~: the base's own value
        return "base"
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    text = text.strip("[]{}'\" ")  # a minus sign must survive: -1 is not 1
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text) or "-"


def _label_parts(key: str) -> list[str]:
    """``algorithm.name`` reads better as ``algorithm``."""
    parts = key.split(".")
    return parts[:-1] if parts[-1] == "name" and len(parts) > 1 else parts


def _point_names(keys: list[str], combos: list[tuple]) -> list[str]:
    """``007_budget-0.2N_seed-1``: the shortest key suffixes that stay distinct
    (``python -m mpifl.main`` tells a config path from an override by what it
    is, so a sweep or out_dir named ``lr=0.1`` works too)."""
    labels = []
    for key in keys:
        parts = _label_parts(key)
        for n in range(1, len(parts) + 1):
            label = ".".join(parts[-n:])
            if sum(_label_parts(k)[-n:] == parts[-n:] for k in keys) == 1:
                break
        labels.append(label)
    width = max(3, len(str(len(combos) - 1)))
    slug = [(lambda v: _slug(Path(str(v)).stem)) if k == BASE else _slug for k in keys]
    return [f"{i:0{width}d}" + "".join(f"_{lab}-{f(v)}" for lab, f, v in zip(labels, slug, combo) if v is not _ABSENT)
            for i, combo in enumerate(combos)]


def _read_base(sweep: Path, value: Any, where: str) -> tuple[Path, dict]:
    """A base config file (relative to the sweep file) and its sections."""
    base = (sweep.parent / str(value)).resolve()
    if not base.is_file():
        raise ConfigError(f"{where}={value!r} is not allowed; no such file {str(base)!r}")
    raw = read_yaml(base, f"{where}={str(value)!r}") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}={value!r} must hold a mapping of sections")
    return base, raw


def load(path: str | Path, out_dir: str | None = None, slurm_overrides: dict | None = None,
         n_ranks: int | None = None, overrides: list[str] = ()) -> Sweep:
    """Read a sweep file and resolve and validate every point (nothing is written).
    ``overrides``: ``section.key=value`` for every point (``--set``), after the
    file's ``set``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {str(path)!r} not found")
    spec = read_yaml(path, f"sweep file {str(path)!r}") or {}
    if not isinstance(spec, dict):
        raise ConfigError(f"sweep file {str(path)!r} must hold a mapping")
    allowed = ("name", "base", "out_dir", "set", "grid", "slurm")
    unknown = sorted(set(spec) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in sweep file {str(path)!r}; valid keys: {', '.join(allowed)}")
    name = spec.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.+=-]+", name) or name in (".", ".."):
        raise ConfigError(f"name={name!r} is not allowed; a plain directory name (letters, digits, _ . + = -)")
    base = None
    raw: dict = {}
    if spec.get("base") is not None:
        base, raw = _read_base(path, spec["base"], "base")
    sets = _mapping(spec.get("set"), "set")
    # A list of grids is their union: a table whose rows vary different keys (pFedLIA's
    # p2p row beside the baselines) without the product of every key with every other.
    grids = spec.get("grid")
    grids = [_mapping(g, f"grid[{i}]") for i, g in enumerate(grids)] if isinstance(grids, list) \
        else [_mapping(grids, "grid")]
    if not grids:
        raise ConfigError("grid=[] is not allowed; a mapping of lists, or a list of such mappings")
    for grid in grids:
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"grid.{key}={values!r} is not allowed; must be a non-empty list of values")
    sets = {**sets, **command_line_set(overrides, grids)}
    for key in [*sets, *(k for g in grids for k in g)]:
        if key in RESERVED:
            raise ConfigError(f"{key} is not allowed in a sweep; the sweep sets it for every point")
    bases = {}
    base_values = [v for g in grids for v in g.get(BASE, [])]
    if base_values:
        if base is not None:
            raise ConfigError(f"grid.base and base={spec['base']!r} are not allowed together; keep one of them")
        if not all(BASE in g for g in grids):
            raise ConfigError("grid.base must be in every grid of the list, or in none")
        bases = {str(v): _read_base(path, v, "grid.base")[1] for v in base_values}
        raw = bases[str(base_values[0])]
    slurm_raw = dict(_mapping(spec.get("slurm"), "slurm"))
    slurm_raw.update(slurm_overrides or {})
    slurm = SlurmOptions.from_dict(slurm_raw)
    if out_dir is None:
        out_dir = spec.get("out_dir") or (raw.get("run") or {}).get("out_dir") or "results"
    root = (Path(str(out_dir)) / name).resolve()

    keys = list(dict.fromkeys(k for g in grids for k in g))
    combos = [tuple(dict(zip(g, c)).get(k, _ABSENT) for k in keys)
              for g in grids for c in itertools.product(*g.values())]
    points = []
    for i, (pname, combo) in enumerate(zip(_point_names(keys, combos), combos)):
        values = {k: v for k, v in zip(keys, combo) if v is not _ABSENT}
        point_raw = copy.deepcopy(bases[str(values[BASE])] if BASE in values else raw)
        for key, value in sets.items():
            config_mod.assign(point_raw, key, copy.deepcopy(value), "set")
        for key, value in values.items():
            if key != BASE and value is not None:
                config_mod.assign(point_raw, key, copy.deepcopy(value), "grid")
        config_mod.assign(point_raw, "run.name", pname, "sweep")
        config_mod.assign(point_raw, "run.out_dir", str(root / "runs"), "sweep")
        try:
            cfg = config_mod.from_dict(point_raw, n_ranks=n_ranks or slurm.ntasks)
        except ConfigError as e:
            raise ConfigError(f"point {pname}: {e}") from None
        points.append(Point(i, pname, values, cfg))
    return Sweep(name, path.resolve(), base, root, sets, grids[0] if len(grids) == 1 else grids, slurm, points)


def command_line_set(overrides: list[str], grids: list[dict]) -> dict[str, Any]:
    """``--set section.key=value`` items as a ``set:`` mapping. A key the grid varies
    is refused: it would make the points alike."""
    out: dict[str, Any] = {}
    for item in overrides:
        key, value = config_mod.override(item)
        if any(key in g for g in grids):
            raise ConfigError(f"--set {shorten(repr(item))} is not allowed; grid.{key} varies it between points "
                              f"(edit the sweep file, or copy it, to change the grid)")
        out[key] = value
    return out


# --------------------------------------------------------------------------- scripts


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
    sbatch = []
    if opts.gpus_per_task:
        sbatch.append(f"--gpus-per-task={opts.gpus_per_task}")
    if opts.partition:
        sbatch.append(f"--partition={opts.partition}")
    if opts.account:
        sbatch.append(f"--account={opts.account}")
    if opts.mem:
        sbatch.append(f"--mem={opts.mem}")
    sbatch += opts.sbatch
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


# --------------------------------------------------------------------------- state


def rounds_done(cfg: Config) -> int | None:
    """Rounds the run's log holds as done (``Run.rounds_done``); None without a
    readable log."""
    from mpifl.logging.h5 import open_run

    try:
        return open_run(cfg.run_dir).rounds_done
    except (OSError, KeyError, ValueError):
        return None


def is_complete(cfg: Config) -> bool:
    """The run's log has done all of ``cfg``'s rounds (a partial or unreadable log
    has not; a log extended past them has)."""
    done = rounds_done(cfg)
    return done is not None and done >= cfg.run.rounds


def status(cfg: Config) -> str:
    done = rounds_done(cfg)
    if done is not None:
        return "done" if done >= cfg.run.rounds else f"{done}/{cfg.run.rounds} rounds"
    return "new" if not RunDir(cfg.run_dir).log.exists() else "unreadable log"


def stored_diff(path: Path, cfg: Config) -> str:
    """The experiment keys (:mod:`mpifl.config.identity`) in which the config file
    ``path`` differs from ``cfg``, as "k (a -> b), ..."; "" when it is the same
    experiment (its run.rounds, run.threads... may differ: the run continues)."""
    from mpifl.config.identity import config_diff

    try:
        old = read_yaml(path, f"config file {str(path)!r}")
    except ConfigError:
        old = None
    return config_diff(old, cfg.to_dict()) if isinstance(old, dict) else "unreadable"


def write(sweep: Sweep, workdir: Path, force: bool = False) -> None:
    """Configs, runs.txt and array.sbatch. A point's existing config of another
    experiment is an error; one that differs in keys that may change between a
    run and its continuation (run.rounds, run.threads, ...) is replaced, unless
    its run is complete (an extended run keeps its larger run.rounds)."""
    workdir = Path(workdir).resolve()  # the script cds there from wherever SLURM starts it
    for p in sweep.points:
        rd = RunDir(p.config.run_dir)
        text = p.config.to_yaml()
        if rd.config.exists() and rd.config.read_text() == text:
            continue
        if rd.config.exists() and not force:
            diff = stored_diff(rd.config, p.config)
            if diff:
                raise ConfigError(f"{rd.config} holds a different config than this sweep makes for point {p.name}: "
                                  f"{diff}; use another sweep name or out_dir, or --force to overwrite it")
            if is_complete(p.config):  # a run extended past this sweep's rounds keeps the config it ran
                continue
        atomic_write_text(rd.config, text)
    sweep.log_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(sweep.runs_file, "".join(f"{p.config.run_dir}\n" for p in sweep.points))
    atomic_write_text(sweep.root / "sweep.yaml", yaml.safe_dump({
        "name": sweep.name, "source": str(sweep.path), "base": str(sweep.base) if sweep.base else None,
        "set": sweep.set, "grid": sweep.grid, "slurm": sweep.slurm.__dict__,
        "points": [{"name": p.name, "values": p.values} for p in sweep.points],
    }, sort_keys=False))
    atomic_write_text(sweep.script, array_script(sweep, workdir))
    sweep.script.chmod(0o755)


def _mpiexec() -> str | None:
    sibling = Path(sys.executable).parent / "mpiexec"
    return str(sibling) if sibling.is_file() else shutil.which("mpiexec")


def local_command(cfg: Config, ranks: int, python: str | None = None) -> list[str]:
    py = python or sys.executable
    cmd = [py, "-m", "mpi4py", "-m", "mpifl.main", str(RunDir(cfg.run_dir).config)]
    launcher = _mpiexec()
    if launcher is None:
        if ranks != 1:
            raise ConfigError(f"slurm.ntasks={ranks} needs mpiexec, which was not found; use --ranks 1")
        return cmd
    return [launcher, "-n", str(ranks), *cmd]


def local_preflight(points: list[Point], ranks: int) -> list[str]:
    """``mpifl.check``'s local parts (placement, data root, run.out_dir) for every
    point ``--local`` will run, before it starts any: one line per problem, naming
    the first point that has it and how many more do."""
    from mpifl.check import local_problems

    found: dict[str, list[str]] = {}
    for p in points:
        for problem in local_problems(p.config, ranks):
            found.setdefault(problem, []).append(p.name)
    return [f"point {names[0]}" + (f" (and {len(names) - 1} more)" if len(names) > 1 else "") + f": {problem}"
            for problem, names in found.items()]


PREEMPTED = 75  # mpifl.run.runtime.PREEMPTED: the exit of a run, and of the driver, stopped by a signal
USER_ERROR = 2  # a point's exit status for a user error (ConfigError): the next points would fail alike


class Interrupted(Exception):
    """``--local`` stopped by SIGTERM or SIGINT: its runs checkpointed (exit 75)."""


def run_local(sweep: Sweep, ranks: int, workdir: Path, parallel: int = 1, warm: bool = True,
              keep_going: bool = False) -> int:
    """Run the unfinished points here, ``parallel`` at a time in index order;
    returns the number that failed. Each run has its own directory and log, so
    runs at once share nothing but the machine. One-rank points run on
    ``parallel`` warm workers (:mod:`mpifl.sweep.worker`: torch and mpifl imported once,
    a forked child per point) unless ``warm`` is off; others through mpiexec.
    A point that ends with a user error (exit 2) stops the launching of further
    points, unless ``keep_going``. Points another driver holds wait for it, and a
    stop signal stops every run at a checkpoint (:mod:`mpifl.sweep.driver`;
    raises :class:`Interrupted` once they have)."""
    from concurrent.futures import ThreadPoolExecutor

    from mpifl.sweep.driver import Driver

    sweep.log_dir.mkdir(parents=True, exist_ok=True)
    with Driver(sweep) as d:
        todo = []
        for p in sweep.chosen():
            if is_complete(p.config):
                d.say(f"[{p.index}] {p.name}: done, skipped")
            else:
                todo.append(p)
        d.say(f"sweep {sweep.name}: running {len(todo)} of {len(sweep.chosen())} point(s), {parallel} at a time; "
              f"each one's output in {sweep.log_dir}/local_<i>.out, this driver's lines in {d.log}; `--status` in "
              f"another shell shows progress")
        python = sweep.slurm.python or None
        pool = None
        if warm and ranks == 1 and todo:
            from mpifl.sweep.worker import Pool

            pool = Pool(min(parallel, len(todo)), python, workdir)
        halt: list[Point] = []  # the point whose user error stopped the launching
        elsewhere: list[Point] = []  # held by another driver when their turn came

        def one(p: Point, wait: bool = False) -> int | None:
            if halt or d.signum:
                return None  # not started
            with d.claim(p.index, wait) as mine:
                if not mine:
                    if not d.signum:
                        d.say(f"[{p.index}] {p.name}: running elsewhere (another sweep driver holds it); "
                              f"looked at again at the end")
                        elsewhere.append(p)
                    return None
                if is_complete(p.config):
                    d.say(f"[{p.index}] {p.name}: done elsewhere")
                    return 0
                rc = _run_claimed(sweep, p, ranks, workdir, python, pool, d)
            if rc == USER_ERROR and not keep_going:
                halt.append(p)
            return rc

        try:
            with ThreadPoolExecutor(parallel) as ex:  # threads only wait on the runs' processes
                ran = dict(zip((p.index for p in todo), ex.map(one, todo)))
                ran.update(zip((p.index for p in elsewhere), ex.map(lambda p: one(p, wait=True), list(elsewhere))))
        finally:
            if pool is not None:
                pool.close()
        codes = {i: rc for i, rc in ran.items() if rc is not None}
        if d.signum:
            d.say(d.stopped_line(sum(rc == PREEMPTED for rc in codes.values())))
            raise Interrupted()
        d.say(local_summary(sweep, codes, len(ran) - len(codes)))
        if halt:
            d.say(halted_line(halt[0], len(ran) - len(codes)))
    return sum(rc != 0 for rc in codes.values())


def _run_claimed(sweep: Sweep, p: Point, ranks: int, workdir: Path, python: str | None, pool: Any, d: Any) -> int:
    """One point's run, its claim held by this driver: marked for ``--status``, its line printed."""
    from mpifl.sweep.cli import status as sweep_status

    log = sweep_status.local_log(sweep, p.index)
    t0 = time.monotonic()

    def started(pid: int) -> None:
        sweep_status.mark_started(sweep, p.index, pid)
        d.started(p.index, pid)

    rc = run_point(p.config, ranks, workdir, log, python, pool, started=started)
    d.ended(p.index)
    sweep_status.mark_finished(sweep, p.index, rc)
    d.say(finished_line(p, rc, time.monotonic() - t0, log))
    return rc


def halted_line(p: Point, not_started: int) -> str:
    """Why ``--local`` started no more points: a user error the rest would likely share."""
    return (f"stopped launching: [{p.index}] {p.name} ended with a user error (exit {USER_ERROR}); {not_started} "
            f"point(s) not started; fix it and run the sweep again, or pass --keep-going to run them anyway")


def run_point(cfg: Config, ranks: int, workdir: Path, log: Path, python: str | None = None, pool: Any = None,
              started: Callable[[int], None] | None = None) -> int:
    """One point's run, its output appended to ``log`` after a line saying how it
    runs; returns its exit status. On a warm worker of ``pool`` (an
    :class:`mpifl.sweep.worker.Pool`) when given, else ``mpiexec -n ranks``
    (:func:`local_command`). ``started(pid)``: the process running it has begun."""
    config = RunDir(cfg.run_dir).config
    with open(log, "a") as out:
        if pool is not None:
            out.write(f"mpifl.sweep.cli: python -m mpifl.main {shlex.quote(str(config))} (warm worker)\n")
            out.flush()
            return pool.run(config, log, started)
        cmd = local_command(cfg, ranks, python)
        out.write(f"mpifl.sweep.cli: {shlex.join(cmd)}\n")
        out.flush()
        # its own session: a terminal's Ctrl-C reaches the driver, which stops it at a checkpoint
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if started is not None:
            started(proc.pid)
        return proc.wait()


def finished_line(p: Point, rc: int, seconds: float, log: Path) -> str:
    """What ``--local`` prints when a point's run ends: its final accuracy, or
    why it stopped and where its output is."""
    from mpifl.sweep.status import PREEMPTED, last_line, log_facts

    done, acc, _, _ = log_facts(p.config)
    took = f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.1f}min"
    if rc == 0:
        return f"[{p.index}] {p.name}: done in {took}, {done}/{p.config.run.rounds} rounds" + \
            (f", final test_acc {acc:.4f}" if acc is not None else "")
    what = "preempted (checkpointed; continues when run again)" if rc == PREEMPTED else f"FAILED (exit {rc})"
    return f"[{p.index}] {p.name}: {what} after {took}, {max(done, 0)}/{p.config.run.rounds} rounds; " \
        f"{log}: {last_line(log) or '(empty)'}"


def local_summary(sweep: Sweep, codes: dict[int, int], not_started: int = 0) -> str:
    """The last lines of ``--local``: how many points ran to the end, and each
    failed one with its output file."""
    from mpifl.sweep.status import local_log

    skipped = len(sweep.chosen()) - len(codes) - not_started
    failed = [i for i, rc in codes.items() if rc != 0]
    lines = [f"sweep {sweep.name}: {len(codes) - len(failed)} done"
             + (f" ({skipped} were already complete)" if skipped else "")
             + f", {len(failed)} failed" + (f", {not_started} not started" if not_started else "")
             + (":" if failed else "")]
    lines += [f"  [{i}] {sweep.points[i].name}: exit {codes[i]}, {local_log(sweep, i)}" for i in sorted(failed)]
    return "\n".join(lines)


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
        from mpifl.check import ranges

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


# --------------------------------------------------------------------------- CLI


def _slurm_flags(a: argparse.Namespace) -> dict[str, Any]:
    keys = ("ntasks", "cpus_per_task", "gpus_per_task", "mpi", "time", "partition", "account", "mem", "python",
            "allow_local_paths")
    return {k: getattr(a, k) for k in keys if getattr(a, k) is not None}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mpifl.sweep", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", help="SWEEP.yaml, or with --run a run's CONFIG.yaml")
    ap.add_argument("overrides", nargs="*", help="section.key=value: with --run for the run, else as --set")
    ap.add_argument("--run", action="store_true", help="one run: render <run_dir>/run.sbatch from CONFIG.yaml")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="list the points and their state; write nothing")
    mode.add_argument("--submit", action="store_true", help="write, then sbatch the unfinished points")
    mode.add_argument("--local", action="store_true", help="write, then run the unfinished points here with mpiexec")
    mode.add_argument("--status", action="store_true",
                      help="each point's state (waiting, running r/R with ETA, done, failed, preempted) and totals, "
                           "from the run directories and, where SLURM answers, squeue/sacct; writes nothing")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every point, e.g. --set run.rounds=3 (recorded in each point's "
                         "config.yaml); may be repeated")
    ap.add_argument("--only", action="append", default=[], metavar="KEY=V1,V2",
                    help="act on the points whose config holds one of these values (compared after the config's "
                         "coercion; base=FILE for a grid of files); may be repeated, each must match")
    ap.add_argument("--points", metavar="0-9,15", help="act on these point indices only (as --dry-run numbers them)")
    ap.add_argument("--out-dir", help="parent of the sweep directory (default: the sweep file's out_dir)")
    ap.add_argument("--ranks", type=int, help="--local: MPI ranks per run (default slurm.ntasks)")
    ap.add_argument("--parallel", type=int, default=1, metavar="N",
                    help="--local: runs at once (default 1); N x ranks x run.threads should fit the cores")
    ap.add_argument("--mpiexec", action="store_true",
                    help="--local: start one-rank points with mpiexec too, each a fresh process (default: N warm "
                         "workers import torch and mpifl once and fork a child per point)")
    ap.add_argument("--keep-going", action="store_true",
                    help="--local: go on launching points after one ends with a user error (exit 2)")
    ap.add_argument("--force", action="store_true", help="overwrite point configs that differ from this sweep")
    g = ap.add_argument_group("SLURM options (override the sweep file's slurm section)")
    g.add_argument("--ntasks", type=int)
    g.add_argument("--cpus-per-task", type=int)
    g.add_argument("--gpus-per-task", type=int)
    g.add_argument("--mpi")
    g.add_argument("--time")
    g.add_argument("--partition")
    g.add_argument("--account")
    g.add_argument("--mem")
    g.add_argument("--python", help="interpreter on the compute nodes (default: this one)")
    g.add_argument("--allow-local-paths", action="store_true", default=None,
                   help="allow a workdir, interpreter or out_dir under /tmp and the like (a one-node cluster)")
    return ap


def _main_run(a: argparse.Namespace, workdir: Path) -> int:
    opts = SlurmOptions.from_dict(_slurm_flags(a), "option")
    cfg = config_mod.load(a.file, a.overrides, n_ranks=opts.ntasks)
    rd = RunDir(cfg.run_dir.resolve())
    script = run_script(cfg, opts, workdir)
    if a.dry_run:
        print(script, end="")
        return 0
    if a.local or a.status:
        raise ConfigError(f"{'--local' if a.local else '--status'} with --run: launch it directly, "
                          "mpiexec -n N python -m mpi4py -m mpifl.main CONFIG.yaml (its log shows its progress)")
    if a.set:
        raise ConfigError(f"--set with --run: give the overrides after the config, {a.file} {' '.join(a.set)}")
    if a.only or a.points:
        raise ConfigError("--only and --points pick points of a sweep; --run has one run")
    diff = stored_diff(rd.config, cfg) if rd.config.exists() and not a.force else ""
    if diff:
        raise ConfigError(f"{rd.config} holds a different config: {diff}; pick another run.name or pass --force")
    refuse_node_local(opts, workdir, rd.root)
    if a.submit and _refused(preflight([cfg], opts, workdir)):
        return 2
    atomic_write_text(rd.config, cfg.to_yaml())
    atomic_write_text(rd.root / "run.sbatch", script)
    print(f"wrote {rd.root / 'run.sbatch'}")
    if a.submit:
        print(f"submitted job {_sbatch([str(rd.root / 'run.sbatch')])}")
    return 0


def _refused(problems: list[str]) -> bool:
    for p in problems:
        print(f"mpifl.sweep.cli: error: {p}", file=sys.stderr)
    return bool(problems)


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    workdir = Path.cwd().resolve()
    try:
        if a.run:
            return _main_run(a, workdir)
        if a.parallel < 1:  # before anything is written
            raise ConfigError(f"--parallel={a.parallel} is not allowed; a positive number of runs at once")
        sweep = load(a.file, a.out_dir, _slurm_flags(a), n_ranks=a.ranks, overrides=[*a.set, *a.overrides])
        sweep.selected = select(sweep.points, a.only, a.points)
        if a.status:
            from mpifl.sweep.status import report

            report(sweep)
            return 0
        if a.dry_run:
            print(f"sweep {sweep.name}: {len(sweep.points)} runs in {sweep.root}"
                  + (f"; {len(sweep.chosen())} selected" if sweep.selected is not None else ""))
            for p in sweep.chosen():
                vals = " ".join(f"{k}={'~' if v is None else v}" for k, v in p.values.items())
                print(f"[{p.index}] {p.name}  {vals}  ({status(p.config)})")
            return 0
        if not a.local:
            refuse_node_local(sweep.slurm, workdir, sweep.root)
        if a.submit and _refused(preflight([p.config for p in sweep.chosen() if not is_complete(p.config)],
                                           sweep.slurm, workdir)):
            return 2
        if a.local and _refused(local_preflight([p for p in sweep.chosen() if not is_complete(p.config)],
                                                a.ranks or sweep.slurm.ntasks)):
            return 2
        plan = submission_plan(sweep) if a.submit else []  # sbatch and the array sizes, before writing
        write(sweep, workdir, force=a.force)
        print(f"sweep {sweep.name}: {len(sweep.points)} configs under {sweep.root / 'runs'}; script {sweep.script}")
        if a.submit:
            jobs = submit(sweep, plan)
            if not jobs:
                print("nothing to submit: every run is complete")
            elif len(jobs) == 1:
                print(f"submitted array job {jobs[0]}")
            else:
                print(f"submitted {len(jobs)} array jobs ({sum(len(x.indices) for x in plan)} points; SLURM's "
                      f"MaxArraySize bounds each array): {', '.join(jobs)}")
        elif a.local:
            ranks = a.ranks or sweep.slurm.ntasks
            try:
                failed = run_local(sweep, ranks, workdir, a.parallel, warm=not a.mpiexec, keep_going=a.keep_going)
            except Interrupted:
                return PREEMPTED
            if failed:  # the failed ones are listed
                return 1
        else:
            print(f"submit with: python -m mpifl.sweep {a.file} --submit   (or: sbatch {sweep.script})")
        return 0
    except ConfigError as e:
        print(f"mpifl.sweep.cli: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from mpifl.cli import quiet_pipe

    sys.exit(quiet_pipe(main))
