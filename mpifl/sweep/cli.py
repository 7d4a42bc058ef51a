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
import sys
from pathlib import Path
from typing import Any

from mpifl import config as config_mod
from mpifl.errors import ConfigError
from mpifl.paths import RunDir, atomic_write_text
from mpifl.sweep.rundirs import stored_diff, write
from mpifl.sweep.runner import PREEMPTED, Interrupted, local_preflight, run_local
from mpifl.sweep.select import select
from mpifl.sweep.slurm import _sbatch, preflight, refuse_node_local, run_script, submission_plan, submit
from mpifl.sweep.spec import SlurmOptions, load
from mpifl.sweep.status import is_complete, status


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
        print(f"mpifl.sweep: error: {p}", file=sys.stderr)
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
        print(f"mpifl.sweep: error: {e}", file=sys.stderr)
        return 2
