"""Where a sweep stands: ``python -m mpifl.sweep SWEEP.yaml --status``.

Each point's state comes from its run directory (the log's complete rounds,
``/rounds/wall_s`` for the ETA, the last evaluated mean test accuracy), from what
``--local`` and ``--submit`` leave in ``<sweep>/logs`` (a local run's process id
while it runs and its exit status after; the array job ids submitted), and, where
SLURM answers, from ``squeue`` and ``sacct`` for those jobs:

- ``waiting``: nothing logged yet (``queued`` when SLURM holds it pending);
- ``running r/R``: with its last accuracy and an ETA from the mean round time;
- ``done``: every round logged, with its final accuracy;
- ``failed``: exited non-zero (or SLURM says so), with its log and the log's last line;
- ``preempted``: stopped by a signal after a checkpoint (exit 75; SLURM: requeued),
  continues from there when run again;
- ``stopped r/R``: a partial log and nothing running it (killed, or run elsewhere).

Rounds are numbered from 1, as on the console.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mpifl.paths import RunDir, atomic_write_text

if TYPE_CHECKING:
    from mpifl.config import Config
    from mpifl.sweep.spec import Point, Sweep

PREEMPTED = 75  # mpifl.run.runtime.PREEMPTED, without importing torch
SUBMITTED = "submitted.txt"  # <sweep>/logs/: one line per array submitted, "JOBID 0-3,5[ OFFSET]"
MAX_ARRAY_SIZE = 1001  # SLURM's default MaxArraySize: array task ids 0..1000
SLURM_FAILED = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED", "BOOT_FAIL", "DEADLINE")
SLURM_REQUEUED = ("PREEMPTED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED")


# --------------------------------------------------------------------------- markers written by --local



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


def local_log(sweep: Sweep, index: int) -> Path:
    return sweep.log_dir / f"local_{index}.out"


def _pid_file(sweep: Sweep, index: int) -> Path:
    return sweep.log_dir / f"local_{index}.pid"


def _exit_file(sweep: Sweep, index: int) -> Path:
    return exit_marker(sweep.log_dir, index)


def exit_marker(log_dir: Path, index: int) -> Path:
    """Where ``--local`` leaves point ``index``'s exit status, under ``<sweep>/logs``."""
    return log_dir / f"local_{index}.exit"


def mark_started(sweep: Sweep, index: int, pid: int) -> None:
    """A local run of point ``index`` began as process ``pid`` on this host."""
    _exit_file(sweep, index).unlink(missing_ok=True)
    atomic_write_text(_pid_file(sweep, index), f"{pid} {socket.gethostname()}\n")


def mark_finished(sweep: Sweep, index: int, rc: int) -> None:
    atomic_write_text(_exit_file(sweep, index), f"{rc}\n")
    _pid_file(sweep, index).unlink(missing_ok=True)


def record_submission(sweep: Sweep, job: str, indices: list[int], offset: int = 0) -> None:
    """Remember which points an array job runs (as ranges; its task i runs point
    ``offset + i``), for ``--status``."""
    from mpifl.errors import ranges

    path = sweep.log_dir / SUBMITTED
    old = path.read_text() if path.is_file() else ""
    atomic_write_text(path, old + f"{job} {ranges(indices)}" + (f" {offset}" if offset else "") + "\n")


def _local(sweep: Sweep, index: int) -> tuple[bool, int | None]:
    """(running here now, exit status of the last local run or None)."""
    pid_file, exit_file = _pid_file(sweep, index), _exit_file(sweep, index)
    if pid_file.is_file():
        try:
            pid, host = pid_file.read_text().split()[:2]
            if host != socket.gethostname():
                return True, None  # another machine's run: cannot ask, take it as running
            os.kill(int(pid), 0)
            return True, None
        except PermissionError:  # alive, another user's
            return True, None
        except (ProcessLookupError, ValueError, OSError):
            pass  # the runner died without writing its exit status
    if exit_file.is_file():
        try:
            return False, int(exit_file.read_text().split()[0])
        except (ValueError, IndexError):
            return False, None
    return False, None


# --------------------------------------------------------------------------- SLURM


def _submitted(sweep: Sweep) -> dict[int, str]:
    """Point index -> ``JOB_TASK``, SLURM's name of the array task last submitted
    for it (task = index - the array's offset)."""
    path = sweep.log_dir / SUBMITTED
    out: dict[int, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) not in (2, 3) or not (len(parts) == 2 or parts[2].isdigit()):
            continue
        offset = int(parts[2]) if len(parts) == 3 else 0
        for item in parts[1].split(","):
            a, _, b = item.partition("-")
            if a.isdigit() and (b == "" or b.isdigit()):
                for i in range(int(a), int(b or a) + 1):
                    out[i] = f"{parts[0]}_{i - offset}"
    return out


def max_array_size() -> int:
    """SLURM's MaxArraySize (``scontrol show config``), or its default where
    scontrol does not answer: the largest array task id is one less."""
    text = _ask(["scontrol", "show", "config"]) or ""
    m = re.search(r"^\s*MaxArraySize\s*=\s*(\d+)", text, re.M)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else MAX_ARRAY_SIZE


def _ask(cmd: list[str]) -> str | None:
    exe = shutil.which(cmd[0])
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def slurm_states(jobs: set[str]) -> dict[str, str]:
    """``JOB_INDEX`` -> SLURM state of each array task of ``jobs``: squeue for the
    queued and running ones, sacct (where accounting is kept) for the rest.
    Empty where SLURM does not answer."""
    if not jobs:
        return {}
    out: dict[str, str] = {}
    acct = _ask(["sacct", "-j", ",".join(sorted(jobs)), "-n", "-P", "-X", "-o", "JobID,State"])
    for line in (acct or "").splitlines():
        parts = line.split("|")
        if len(parts) >= 2 and "_" in parts[0] and "[" not in parts[0]:
            out[parts[0]] = parts[1].split()[0] if parts[1] else ""
    queue = _ask(["squeue", "-h", "-r", "-j", ",".join(sorted(jobs)), "-o", "%i|%T"])
    for line in (queue or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) == 2 and "_" in parts[0]:
            out[parts[0]] = parts[1]  # the queue's word is the newer one
    return out


# --------------------------------------------------------------------------- one point


@dataclass
class PointState:
    state: str  # waiting, queued, running, done, failed, preempted, stopped
    rounds_done: int
    rounds: int
    text: str  # the rest of the line


def log_facts(cfg) -> tuple[int, float | None, int, float | None]:
    """(complete rounds, last evaluated mean test_acc or None, its round from 1, mean
    round wall time or None); (0, None, 0, None) without a readable log."""
    from mpifl.logging.h5 import open_run

    log = RunDir(cfg.run_dir).log
    if not log.is_file():
        return 0, None, 0, None
    try:
        run = open_run(log)
        with run.reading():
            n = run.n_rounds
            if n == 0:
                return 0, None, 0, None
            acc = run.metric("test_acc")
            rounds = run.rounds
            wall = run.get("rounds/wall_s") if "rounds/wall_s" in run.datasets else None
    except (OSError, KeyError, ValueError):
        return -1, None, 0, None
    done = np.flatnonzero(~np.isnan(acc).all(axis=1))
    last, at = (float(np.nanmean(acc[done[-1]])), int(rounds[done[-1]]) + 1) if len(done) else (None, 0)
    per_round = float(np.mean(wall)) if wall is not None and len(wall) else None
    return int(rounds[-1]) + 1, last, at, per_round


def last_line(path: Path) -> str:
    """The last line of a run's output that names an error (mpifl's one-line
    error, not the MPI library's abort notice after it), else its last line."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [x.strip() for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    errors = [x for x in lines if re.search(r"\berror\b", x, re.IGNORECASE) and "MPI_Abort" not in x]
    return errors[-1] if errors else (lines[-1] if lines else "")


def _eta(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}min"
    return f"{seconds / 3600:.1f}h"


def point_state(sweep: Sweep, p: Point, slurm: dict[str, str], tasks: dict[int, str]) -> PointState:
    cfg = p.config
    total = cfg.run.rounds
    done, acc, at, per_round = log_facts(cfg)
    acc_text = f"test_acc {acc:.4f}" + (f" (round {at})" if at != done else "") if acc is not None else ""
    if done == -1:
        return PointState("failed", 0, total, f"unreadable log {RunDir(cfg.run_dir).log}")
    if done >= total:
        final = f"  final test_acc {acc:.4f}" if acc is not None else ""
        return PointState("done", done, total, f"{done}/{total}{final}")
    running, rc = _local(sweep, p.index)
    job_task = tasks.get(p.index)  # JOB_TASK
    task = slurm.get(job_task) if job_task else None
    log = sweep.log_dir / f"{job_task}.out" if task is not None else local_log(sweep, p.index)
    progress = f"{done}/{total}"
    if running or task in ("RUNNING", "COMPLETING", "CONFIGURING"):
        if done == 0:
            return PointState("running", done, total, f"0/{total}, starting")
        eta = f"  eta {_eta(per_round * (total - done))}" if per_round is not None else ""
        return PointState("running", done, total, f"{progress}  {acc_text}{eta}".rstrip())
    if task in SLURM_REQUEUED or rc == PREEMPTED:
        return PointState("preempted", done, total, f"{progress}  checkpointed; continues when run again"
                          + ("" if task is None else f" (SLURM: {task.lower()})"))
    if task == "PENDING":
        return PointState("queued" if done == 0 else "preempted", done, total,
                          "pending in SLURM's queue" if done == 0 else f"{progress}  requeued, pending")
    if task in SLURM_FAILED or (task == "COMPLETED") or (rc is not None and rc != 0):
        why = f"SLURM: {task.lower()}" if task is not None else f"exit {rc}"
        return PointState("failed", done, total, f"{progress}  {why}; {log}: {last_line(log) or '(empty)'}")
    if done == 0:
        return PointState("waiting", done, total, "")
    return PointState("stopped", done, total, f"{progress}  {acc_text}  not running; continues when run again")


# --------------------------------------------------------------------------- the report


ORDER = ("done", "running", "queued", "waiting", "preempted", "stopped", "failed")


def report(sweep: Sweep, echo=print) -> dict[str, int]:
    """Print one line per point and the totals; returns the count per state."""
    tasks = _submitted(sweep)
    jobs = {t.split("_")[0] for t in tasks.values()}
    slurm = slurm_states(jobs)
    width = max(len(p.name) for p in sweep.chosen())
    counts: dict[str, int] = {}
    for p in sweep.chosen():
        s = point_state(sweep, p, slurm, tasks)
        counts[s.state] = counts.get(s.state, 0) + 1
        echo(f"[{p.index}] {p.name:<{width}}  {s.state:<9} {s.text}".rstrip())
    where = f"; SLURM jobs {', '.join(sorted(jobs))}" if jobs else ""
    asked = "" if not jobs else (" (squeue/sacct answered)" if slurm else " (SLURM did not answer)")
    chosen = "" if sweep.selected is None else f" ({len(sweep.chosen())} of {len(sweep.points)} selected)"
    echo(f"sweep {sweep.name}: {len(sweep.chosen())} points{chosen}: "
         + ", ".join(f"{counts[k]} {k}" for k in ORDER if k in counts) + where + asked)
    return counts
