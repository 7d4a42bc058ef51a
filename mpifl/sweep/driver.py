"""What one ``sweep --local`` driver shares with the others on the same sweep, and
how it stops.

- Claims: a driver runs a point only while it holds that point's claim, an
  ``flock`` on ``<sweep>/logs/local_<i>.claim`` (dropped by the system when the
  driver dies). A point another driver holds is "running elsewhere": this driver
  goes on with the others and comes back to it at the end, waiting for the claim;
  a point the other finished is then done, one it left unfinished is run here. So
  two drivers on one sweep never report each other's points as failed and both
  end once every point is done.
- Its own log: each driver writes the lines it prints to
  ``<sweep>/logs/driver_<host>_<pid>.out`` as well.
- Stop signals: SIGTERM or SIGINT to the driver launches no more points and sends
  SIGTERM to the runs it started; each stops at its next round boundary with a
  checkpoint (exit 75, ``mpifl.run.runtime``), and the driver prints one line and
  exits 75. The runs sit in their own sessions, so a terminal's Ctrl-C reaches
  the driver alone.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpifl.sweep.spec import Sweep

PREEMPTED = 75  # mpifl.run.runtime.PREEMPTED: stopped by a signal after a checkpoint
POLL_S = 1.0  # how often a driver looks again at a claim another driver holds


def claim_file(sweep: Sweep, index: int) -> Path:
    return sweep.log_dir / f"local_{index}.claim"


def driver_log(sweep: Sweep) -> Path:
    return sweep.log_dir / f"driver_{socket.gethostname()}_{os.getpid()}.out"


class Driver:
    """One ``--local`` driver's claims, log, running processes and stop flag."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.log = driver_log(sweep)
        self.lock = threading.Lock()
        self.running: dict[int, int] = {}  # point index -> pid of its run
        self.signum = 0  # the stop signal received, 0 for none
        self._old: dict[int, object] = {}

    def say(self, line: str) -> None:
        """Print a line and append it to this driver's log."""
        print(line, flush=True)
        with self.lock, open(self.log, "a") as f:
            f.write(line + "\n")

    @contextmanager
    def claim(self, index: int, wait: bool) -> Iterator[bool]:
        """Hold point ``index``'s claim for the block; yields False (at once) when
        another driver holds it and ``wait`` is off, or when a stop signal arrives
        while waiting."""
        fd = os.open(claim_file(self.sweep, index), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not wait or self.signum:
                        yield False
                        return
                    time.sleep(POLL_S)
            yield True
        finally:
            os.close(fd)  # drops the lock

    def started(self, index: int, pid: int) -> None:
        with self.lock:
            self.running[index] = pid
            stopping = self.signum
        if stopping:  # launched while the signal arrived: stop it as the others
            _terminate(pid)

    def ended(self, index: int) -> None:
        with self.lock:
            self.running.pop(index, None)

    # ------------------------------------------------------------------ signals

    def __enter__(self) -> Driver:
        if threading.current_thread() is threading.main_thread():  # handlers belong to the main thread
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._stop)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _stop(self, signum: int, frame: object) -> None:
        with self.lock:
            first = not self.signum
            self.signum = signum
            pids = list(self.running.values())
        if first:
            for pid in pids:
                _terminate(pid)

    def stopped_line(self, finished: int) -> str:
        name = signal.Signals(self.signum).name
        return (f"mpifl.sweep: stopped by {name}: no more points launched; {finished} running point(s) stopped at "
                f"a round boundary with a checkpoint (exit {PREEMPTED}); run the same command to continue")


def _terminate(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
