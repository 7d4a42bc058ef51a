"""``--local``: a sweep's unfinished points run on this machine, ``--parallel``
at a time, on warm workers (:mod:`mpifl.sweep.worker`) or one ``mpiexec`` each;
several drivers on one sweep share it point by point (:mod:`mpifl.sweep.driver`)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpifl.errors import ConfigError
from mpifl.paths import RunDir
from mpifl.sweep.spec import Point, Sweep

if TYPE_CHECKING:  # building Config imports every algorithm: only when points are loaded
    from mpifl.config import Config
from mpifl.sweep.status import is_complete


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
    from mpifl.sweep import status as sweep_status

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
            out.write(f"mpifl.sweep: python -m mpifl.main {shlex.quote(str(config))} (warm worker)\n")
            out.flush()
            return pool.run(config, log, started)
        cmd = local_command(cfg, ranks, python)
        out.write(f"mpifl.sweep: {shlex.join(cmd)}\n")
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
