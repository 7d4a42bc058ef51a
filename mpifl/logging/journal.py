"""A file object for h5py that changes the file on disk only by whole commits.

HDF5 updates its metadata (superblock, object headers, chunk indices) and
uncompressed chunks in place and is not journaled: a SIGKILL inside a flush
leaves a file whose pieces belong to two different rounds, which HDF5 may refuse
to open. :class:`Journaled` sits under h5py's ``fileobj`` driver and keeps every
write to bytes that the last commit's file already held in memory;
:meth:`Journaled.commit` writes them to a journal file next to the log, then
into the log:

- killed before the journal is complete (its trailer, carrying the commit's
  number, is written last): the log still holds the previous commit, untouched;
- killed after: the journal is replayed when the log is next opened (by the
  writer, for good, or by a reader, in memory only). Replaying a journal whose
  writes are already in the log changes nothing.

Writes past the end of the last commit's file (new chunks: most of a round's
bytes at large N) go straight to the log: nothing committed points there, and
HDF5 ignores bytes past the end of the file it knows about.

This protects against the process dying (SIGKILL, the OOM killer, ``scancel``),
not against the machine losing its page cache (power loss): that would need an
fsync per round.

A write the file system refuses (a full disk or quota, an I/O error) is never
committed: a write below the last commit's end only reaches the log through a
commit, and one past it that fails (or is cut short) is kept in memory, so HDF5
reads back what it wrote, and makes every later :meth:`Journaled.commit` raise
that error. The log on disk keeps the last commit. The failure is not raised
inside HDF5's callback: h5py would carry the exception into its next calls
(``SystemError``, then a crash at close).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MAGIC = b"MPIFLJ02"
TRAILER = b"MPIFLEND"
_HEAD = struct.Struct("<8sQQQ")  # magic, commit number, file size after the commit, number of extents
_EXTENT = struct.Struct("<QQ")  # offset in the log, bytes
_TAIL = struct.Struct("<8sQQ")  # trailer, commit number, bytes before it
_IOV = 512  # buffers per pwritev (IOV_MAX is 1024 on Linux)

Extents = list[tuple[int, bytes]]


def journal_path(log: Path) -> Path:
    """The journal of ``log``: ``run.h5`` -> ``run.h5.journal``."""
    return log.with_name(log.name + ".journal")


def read_journal(path: Path) -> tuple[int, Extents] | None:
    """(file size, [(offset, bytes)]) of a complete journal; None when there is
    none, it was cut short (its commit never happened) or it was already applied.

    The journal is rewritten in place by every commit, so bytes of an older,
    longer one may follow it: its length comes from its header, and its trailer
    must carry the header's commit number."""
    try:
        with open(path, "rb") as f:
            data = f.read(_HEAD.size)
            if data[:len(MAGIC)] != MAGIC:  # none, or applied: readers look here on every open
                return None
            data += f.read()
    except FileNotFoundError:
        return None
    if len(data) < _HEAD.size:
        return None
    magic, seq, size, n = _HEAD.unpack_from(data, 0)
    if magic != MAGIC or n > len(data) // _EXTENT.size:
        return None
    index = [_EXTENT.unpack_from(data, _HEAD.size + i * _EXTENT.size) for i in range(n)]
    at = _HEAD.size + n * _EXTENT.size
    body = at + sum(k for _, k in index)
    if len(data) < body + _TAIL.size or _TAIL.unpack_from(data, body) != (TRAILER, seq, body):
        return None
    out = []
    for off, k in index:
        out.append((off, data[at:at + k]))
        at += k
    return size, out


def _mark(path: Path) -> bytes | None:
    """The journal's header (its magic, zeroed once applied, and commit number):
    it changes with every commit; None when there is no journal, no writer."""
    try:
        with open(path, "rb") as f:
            return f.read(_HEAD.size)
    except FileNotFoundError:
        return None


def _lock(fd: int, how: int) -> bool:
    """flock, or False where the file system has none (some NFS and Lustre mounts)."""
    try:
        fcntl.flock(fd, how)
        return True
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise


@contextmanager
def still(log: Path) -> Iterator[bytes | None]:
    """Hold ``log`` at its last commit while a reader reads it. Yields None: read
    the log in place (no writer has it open, or the writer's next commit waits on
    this reader's shared lock on the journal until the block ends); or, where the
    file system has no ``flock``, the bytes of the last commit, copied.

    HDF5 reads its metadata lazily, so a reader meeting a commit half applied
    sees pieces of two rounds, and HDF5's C code may crash (not raise) on them.
    Every commit holds the journal's exclusive lock (:meth:`Journaled.commit`)."""
    jpath = journal_path(log)
    while True:
        try:
            fd = os.open(jpath, os.O_RDONLY)
        except FileNotFoundError:
            yield None  # no writer (one that begins now commits its first round a round later)
            return
        try:
            if not _lock(fd, fcntl.LOCK_SH):
                yield _copy(log)
                return
            try:  # a journal replaced while we waited (a writer closed, another began) locks nothing
                same = os.fstat(fd).st_ino == os.stat(jpath).st_ino
            except FileNotFoundError:
                same = False
            if same:
                pending = read_journal(jpath)  # a commit whose writer was killed before it reached the log
                yield None if pending is None else _overlay(log.read_bytes(), pending)
                return
        finally:
            os.close(fd)


def _overlay(data: bytes, pending: tuple[int, Extents]) -> bytes:
    size, extents = pending
    buf = bytearray(data[:size].ljust(size, b"\0"))
    for off, b in extents:
        buf[off:off + len(b)] = b
    return bytes(buf)


def _copy(log: Path, tries: int = 200) -> bytes:
    """Without locks: the log's bytes read between two looks at the journal's
    header, which every commit changes (a new number, then the zeroed magic once
    applied). The same header before the read, after it and after reading the
    journal: no commit began applying during the read, or the one applying is in
    the journal, complete, and is laid over the bytes read."""
    jpath = journal_path(log)
    for i in range(tries):
        m0 = _mark(jpath)
        data = log.read_bytes()
        m1 = _mark(jpath)
        pending = read_journal(jpath) if m1 == m0 else None
        if m1 == m0 and _mark(jpath) == m1:
            return data if pending is None else _overlay(data, pending)
        time.sleep(min(0.01 * (i + 1), 0.2))  # a commit under way: it takes milliseconds
    raise OSError(errno.EBUSY, "the log kept changing while being read", str(log))


def _merge(writes: Extents) -> Extents:
    """Writes in the order made -> disjoint extents sorted by offset, the later
    write winning where two overlap; touching extents are joined."""
    order = sorted(range(len(writes)), key=lambda i: writes[i][0])
    groups: list[list[int]] = []
    end = -1
    for i in order:
        off, b = writes[i]
        if groups and off <= end:
            groups[-1].append(i)
            end = max(end, off + len(b))
        else:
            groups.append([i])
            end = off + len(b)
    out = []
    for g in groups:
        if len(g) == 1:
            out.append(writes[g[0]])
            continue
        lo = min(writes[i][0] for i in g)
        buf = bytearray(max(writes[i][0] + len(writes[i][1]) for i in g) - lo)
        for i in sorted(g):  # in the order written
            off, b = writes[i]
            buf[off - lo:off - lo + len(b)] = b
        out.append((lo, bytes(buf)))
    return out


class Journaled:
    """The log ``path`` as a file object for ``h5py.File(obj, mode)``.

    ``mode``: ``"w"`` a new empty file, ``"r+"`` an existing one (a complete
    journal left by a kill is replayed into it first), ``"r"`` read only (a
    complete journal is applied in memory; nothing on disk changes)."""

    def __init__(self, path: str | Path, mode: str = "r+"):
        self.path = Path(path)
        self.journal = journal_path(self.path)
        self.readonly = mode == "r"
        flags = {"r": os.O_RDONLY, "r+": os.O_RDWR, "w": os.O_RDWR | os.O_CREAT | os.O_TRUNC}[mode]
        self.fd = os.open(self.path, flags, 0o666)
        self.jfd: int | None = None
        self.pos = 0
        self.writes: Extents = []  # below the last commit's end, in the order made
        self.error: OSError | None = None  # the first refused write: no commit after it
        self.seq = int.from_bytes(os.urandom(8), "little") >> 1  # an old journal's trailer never matches
        pending = None if mode == "w" else read_journal(self.journal)
        self.size = self.disk = os.fstat(self.fd).st_size
        if pending is not None:
            self.size, self.writes = pending
        if self.readonly:
            self.committed = 1 << 62  # every write would be an error anyway
            return
        self.jfd = os.open(self.journal, os.O_RDWR | os.O_CREAT, 0o666)
        locked = _lock(self.jfd, fcntl.LOCK_EX)
        try:
            if pending is not None:
                self._apply(self.writes)
            os.ftruncate(self.jfd, 0)
        finally:
            if locked:
                fcntl.flock(self.jfd, fcntl.LOCK_UN)
        self.committed = self.size

    # -- what h5py's fileobj driver calls

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else (self.pos + offset if whence == 1 else self.size + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        mv = memoryview(buf).cast("B")
        n, off = len(mv), self.pos
        got = os.preadv(self.fd, [mv], off) if n else 0
        if got < n:
            mv[got:] = bytes(n - got)
        end = off + n
        for w_off, b in self.writes:  # in the order made: the last one wins
            lo, hi = max(off, w_off), min(end, w_off + len(b))
            if lo < hi:
                mv[lo - off:hi - off] = b[lo - w_off:hi - w_off]
        self.pos = end
        return n

    def read(self, size: int = -1) -> bytes:
        size = self.size - self.pos if size < 0 else size
        buf = bytearray(max(size, 0))
        self.readinto(buf)
        return bytes(buf)

    def write(self, buf) -> int:
        if self.readonly:
            raise OSError("the log is open read-only")
        off = self.pos
        n = len(buf)
        end = off + n
        if end <= self.committed or self.error is not None:
            # the last commit's bytes: kept until the next commit (after a refused
            # write, everything: nothing reaches the log any more)
            self.writes.append((off, bytes(buf)))
        elif off >= self.committed:  # past it: nothing committed points here
            self._past_end(buf, off)
        else:
            mv = memoryview(buf).cast("B")
            cut = self.committed - off
            self.writes.append((off, bytes(mv[:cut])))
            self._past_end(mv[cut:], self.committed)
        self.pos = end
        if end > self.size:
            self.size = end
        return n

    def _past_end(self, buf, off: int) -> None:
        """Bytes past the last commit's end, straight to the log; when refused, kept
        in memory and remembered for the next commit to raise (see the module)."""
        try:
            pwrite_all(self.fd, buf, off)
        except OSError as e:
            self.error = self.error or e
            self.writes.append((off, bytes(buf)))
            return
        self.disk = max(self.disk, off + len(buf))

    def truncate(self, size: int | None = None) -> int:
        self.size = self.pos if size is None else size
        return self.size

    def flush(self) -> None:
        """HDF5's own flushes are not commits: a round is committed as a whole."""

    def close(self) -> None:
        for fd in (self.fd, self.jfd):
            if fd is not None:
                os.close(fd)
        self.fd = self.jfd = None  # type: ignore[assignment]

    # -- commits

    def commit(self) -> None:
        """Make every write since the last commit durable against a kill, at once.
        Raises ``OSError`` (naming the log) when a write since the last commit, or
        the commit's own, was refused; the log then keeps the last commit and no
        later commit is made."""
        if self.readonly:
            return
        if self.error is None:
            try:
                self._commit()
            except OSError as e:
                self.error = e
        if self.error is not None:
            e = self.error
            raise OSError(e.errno or errno.EIO, e.strerror or str(e), str(self.path))

    def _commit(self) -> None:
        locked = _lock(self.jfd, fcntl.LOCK_EX)  # readers in place wait (journal.still)
        try:
            self._commit_locked()
        finally:
            if locked:
                fcntl.flock(self.jfd, fcntl.LOCK_UN)

    def _commit_locked(self) -> None:
        if self.writes:
            self.seq += 1
            extents = _merge(self.writes)
            head = b"".join([_HEAD.pack(MAGIC, self.seq, self.size, len(extents)),
                             *(_EXTENT.pack(off, len(b)) for off, b in extents)])
            body = _pwritev(self.jfd, [head, *(b for _, b in extents)], 0)
            pwrite_all(self.jfd, _TAIL.pack(TRAILER, self.seq, body), body)  # the commit point
            self._apply(extents)
            pwrite_all(self.jfd, bytes(8), 0)  # applied: readers need not replay it
        elif self.disk != self.size:
            os.ftruncate(self.fd, self.size)
            self.disk = self.size
        self.committed = self.size

    def _apply(self, extents: Extents) -> None:
        for off, b in extents:
            pwrite_all(self.fd, b, off)
            self.disk = max(self.disk, off + len(b))
        if self.disk != self.size:  # shorter than HDF5's end of file would read as truncated
            os.ftruncate(self.fd, self.size)
            self.disk = self.size
        self.writes = []


def pwrite_all(fd: int, buf, at: int) -> None:
    """All of ``buf`` at ``at``: a short write (a disk filling up) is finished,
    or fails with the system's error; it never passes for a complete one."""
    done = os.pwrite(fd, buf, at)
    if done == len(buf):
        return
    mv = memoryview(buf).cast("B")
    while done < len(mv):
        k = os.pwrite(fd, mv[done:], at + done)
        if k <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += k


def _pwritev(fd: int, bufs: list, at: int) -> int:
    """All of ``bufs`` at ``at`` in as few calls as the system allows; returns the bytes."""
    start = at
    for i in range(0, len(bufs), _IOV):
        part = bufs[i:i + _IOV]
        want = sum(len(b) for b in part)
        done = os.pwritev(fd, part, at)
        if done != want:  # short write (a full disk): finish it piece by piece, or fail
            pwrite_all(fd, b"".join(part)[done:], at + done)
        at += want
    return at - start
