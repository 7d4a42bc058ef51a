"""One job per run directory: rank 0 holds a lock on ``<run>/run.lock`` for the
run's whole life.

A second launch into the same directory (a job resubmitted while the first still
runs, two array tasks given one ``run.name``) finds the lock held and stops in
one line naming the holder, before it changes anything there. The lock is an
``flock`` on the file: the kernel, or the lock manager of a shared file system,
drops it when the holding process dies however it dies, so a killed job never
blocks the next. The holder writes its host, pid and SLURM job into the file
after locking, for that message.

The file is removed when the job ends (a killed job's stays, and the next job
takes it over). Removing a file others may have open is safe because a locker
checks, once it holds the lock, that the path still names the file it locked,
and starts over if not.

A file system that refuses flock (Lustre mounted ``-o noflock``) gets a warning
and an unlocked run; one that keeps locks per node (Lustre ``-o localflock``,
BeeGFS without ``tuneUseGlobalFileLocks``) cannot be told apart from a real one.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from mpifl.errors import FULL, UNWRITABLE, ConfigError, shorten, storage_error
from mpifl.paths import RunDir

MARK = "mpifl run lock"  # first line of a lock file mpifl wrote
HOLDER_KEYS = ("host", "pid", "slurm_job", "since")
UNSUPPORTED = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL}  # flock refused by the file system


class RunLock:
    """The lock a job holds on its run directory; :meth:`release` when it ends."""

    def __init__(self, path: Path, fd: int | None, made: list[Path]) -> None:
        self.path, self.fd, self.made = path, fd, made

    def release(self) -> None:
        """Remove the lock file, then unlock (in that order: see the module's doc);
        the directories this job made and left empty (its setup failed) go too."""
        if self.fd is not None:
            if _names(self.path, self.fd):
                self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None
        for d in self.made:  # deepest first
            try:
                d.rmdir()  # only when empty
            except OSError:
                break
        self.made = []


def acquire(rd: RunDir) -> RunLock:
    """Lock ``rd`` for this process, making the directory if needed; a
    ConfigError naming the holder when another job has it."""
    where = str(rd.root)
    made = [d for d in (rd.root, *rd.root.parents) if not d.exists()]
    for _ in range(50):  # each retry follows a holder removing the file or directory in between
        try:
            rd.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(rd.lock, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno in FULL:
                raise storage_error("the run directory", rd.root, e, "nothing was logged yet") from None
            if e.errno in UNWRITABLE:
                raise  # the caller names the key (run.out_dir) of a directory the user cannot write
            raise ConfigError(f"cannot create the run directory {where!r} or its {rd.lock.name} ({e.strerror}); "
                              f"pick a writable run.out_dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ConfigError(f"run directory {where!r} is in use by another mpifl job ({holder}); two jobs writing "
                              f"one run would corrupt it: wait for that one to end (or cancel it), or use another "
                              f"run.name") from None
        except OSError as e:
            os.close(fd)
            if e.errno not in UNSUPPORTED:
                raise
            print(f"mpifl: warning: the file system of {where!r} refuses file locks ({e.strerror}): a second job "
                  f"started into this run directory will not be stopped", file=sys.stderr, flush=True)
            return RunLock(rd.lock, None, made)
        if not _names(rd.lock, fd):  # its holder removed it as we opened it: lock the one there now
            os.close(fd)
            continue
        old = os.pread(fd, 4096, 0)
        if old and not old.startswith(MARK.encode()):
            os.close(fd)
            raise ConfigError(f"run directory {where!r} holds a file {rd.lock.name!r} that mpifl did not write; "
                              f"use another run.name")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, _me().encode(), 0)
        except OSError as e:
            RunLock(rd.lock, fd, made).release()
            if e.errno in FULL:
                raise storage_error("the run lock", rd.lock, e, "nothing else in the run directory was changed") \
                    from None
            raise
        return RunLock(rd.lock, fd, made)
    raise ConfigError(f"run directory {where!r} could not be locked: its {rd.lock.name} kept changing; "
                      f"is another job starting and stopping there?")


def _names(path: Path, fd: int) -> bool:
    """Does ``path`` still name the file open as ``fd``?"""
    try:
        st = os.stat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _me() -> str:
    job = os.environ.get("SLURM_JOB_ID", "")
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    since = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    values = (socket.gethostname(), str(os.getpid()), job, since)
    return MARK + "\n" + "".join(f"{k}={v}\n" for k, v in zip(HOLDER_KEYS, values))


def _holder(fd: int) -> str:
    """The holder's own words ("host h, pid p, SLURM job j, since t"), read back
    from the lock file; it writes them right after locking, so an empty file is
    read again for a moment."""
    for _ in range(10):
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        if text.startswith(MARK):
            break
        time.sleep(0.05)
    else:
        return "holder not recorded"
    fields = dict(line.split("=", 1) for line in text.splitlines()[1:] if "=" in line)
    shown = {"host": "host", "pid": "pid", "slurm_job": "SLURM job", "since": "since"}
    parts = [f"{shown[k]} {shorten(''.join(ch for ch in fields[k] if ch.isprintable()), 60)}"
             for k in HOLDER_KEYS if fields.get(k)]
    return ", ".join(parts) or "holder not recorded"
