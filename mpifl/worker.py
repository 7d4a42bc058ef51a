"""Warm worker of a local sweep: imports torch, MPI's library and mpifl once, then
runs one-rank points one after another, each in a child forked for it.

    python -m mpifl.sweep.worker      # a line of JSON per point on stdin, one per answer on stdout

A point's run is ``python -m mpi4py -m mpifl.main CONFIG`` without the start-up:
the child is a copy of a process that has imported everything and computed
nothing, so it has its own process state, initialises MPI itself (a singleton
world of one rank, as ``mpiexec -n 1`` gives), starts from the random state of a
fresh process and writes its output to the point's log. A crash, a kill or a user
error ends that child alone; the worker answers with its exit status and takes
the next point. The worker never initialises MPI (a forked MPI library must not
have been started) and never runs a torch operation (a forked OpenMP pool would
not work in the child).

Job: ``{"config": PATH, "log": PATH}``; answers: ``{"pid": PID}`` once the child
runs, then ``{"rc": STATUS}``, negative when the child was killed by that signal
(as :class:`subprocess.Popen` reports it). The worker ends when its stdin closes.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path


def _child(config: str, log: str, answers: int) -> int:
    """The point's run, in the forked child; returns its exit status."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C stops the run as it would a process
    os.close(answers)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    # a fresh process's random state: torch's default seed, numpy's global
    # generator from the OS (Python's random module reseeds itself at fork)
    import numpy as np
    import torch

    torch.manual_seed(torch.initial_seed())
    np.random.seed()
    from mpi4py import MPI

    MPI.Init_thread(MPI.THREAD_MULTIPLE)  # what `python -m mpi4py` asks for (mpi4py.rc.thread_level)
    from mpifl.main import main

    code = main([config])
    sys.stdout.flush()
    sys.stderr.flush()
    MPI.Finalize()
    return code


def run_forked(config: str, log: str, answers: int, started: Callable[[int], None] = lambda pid: None) -> int:
    """Run one point in a forked child and wait for it; its exit status.
    ``started(pid)`` is called in the worker once the child exists."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _child(config, log, answers)
        except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into the worker
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    started(pid)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def warm_up() -> None:
    """Everything a run imports before its first round, and nothing run."""
    import mpi4py

    mpi4py.rc.initialize = False  # each child initialises its own MPI
    mpi4py.rc.finalize = False
    from mpi4py import MPI  # noqa: F401 - loads the library, starts nothing

    from mpifl import config, main  # noqa: F401 - torch, h5py, the runtime

    config.config_class()  # every algorithm module (the config's sections)


def serve() -> int:
    warm_up()
    answers = os.dup(1)
    os.dup2(2, 1)  # anything the worker itself prints goes to stderr, never into the answers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the running child's; the worker ends with stdin
    try:
        with os.fdopen(answers, "w", closefd=False) as reply:

            def say(**answer: int) -> None:
                try:
                    reply.write(json.dumps(answer) + "\n")
                    reply.flush()
                except BrokenPipeError:  # the sweep is gone: the run goes on, nobody listens
                    pass

            while True:
                line = sys.stdin.readline()
                if not line:
                    break
                job = json.loads(line)
                say(rc=run_forked(str(job["config"]), str(job["log"]), answers, lambda pid: say(pid=pid)))
    except BrokenPipeError:  # the sweep went first: an answer say() could not send fails again at close
        pass
    return 0


class Pool:
    """``n`` warm workers (``python -m mpifl.sweep.worker``) shared by threads: :meth:`run`
    takes an idle one, runs a point on it and gives it back. A worker that dies is
    replaced; the point it was running fails, with a line in its log."""

    def __init__(self, n: int, python: str | None = None, cwd: Path | None = None) -> None:
        self.cmd = [python or sys.executable, "-m", "mpifl.sweep.worker"]
        self.cwd = cwd
        self.idle: queue.Queue[subprocess.Popen] = queue.Queue()
        for _ in range(n):  # all at once: they import in parallel
            self.idle.put(self._start())

    def _start(self) -> subprocess.Popen:
        # its own session: a terminal's Ctrl-C reaches the sweep driver alone, which stops the runs at a checkpoint
        return subprocess.Popen(self.cmd, cwd=self.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                start_new_session=True)

    def run(self, config: Path, log: Path, started: Callable[[int], None] | None = None) -> int:
        """Exit status of the point's run (``python -m mpifl.main CONFIG`` into ``log``);
        ``started(pid)`` once its process runs."""
        w = self.idle.get()
        answer: dict = {}
        try:
            w.stdin.write(json.dumps({"config": str(config), "log": str(log)}) + "\n")
            w.stdin.flush()
            while "rc" not in answer:
                line = w.stdout.readline()
                if not line:
                    break
                answer = json.loads(line)
                if "pid" in answer and started is not None:
                    started(int(answer["pid"]))
        except (BrokenPipeError, OSError):
            pass
        if "rc" in answer:
            self.idle.put(w)
            return int(answer["rc"])
        rc = w.wait()
        with open(log, "a") as f:
            f.write(f"mpifl.sweep.cli: the warm worker running this point died (exit {rc})\n")
        self.idle.put(self._start())
        return rc or 1

    def close(self) -> None:
        """Close every worker's stdin and wait for them to finish."""
        workers = []
        while not self.idle.empty():
            workers.append(self.idle.get())
        for w in workers:
            w.stdin.close()
        for w in workers:
            w.wait()
            w.stdout.close()


if __name__ == "__main__":
    code = serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no teardown of torch's modules: nothing is left to write
