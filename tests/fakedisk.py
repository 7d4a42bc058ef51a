"""A file system that runs out of room, for the tests of refused writes
(tests/test_storage.py, tests/mpi/test_storage_mpi.py)."""

from __future__ import annotations

import errno
import io
import os


class FakeDisk:
    """``os.pwrite``/``os.pwritev`` (the journal's writes and the appends to
    run.h5.rounds) with ``budget`` bytes of room (``left``, may be changed): the
    write that exceeds it is cut short, every later one fails with ``err``;
    ``written`` counts the bytes. An ``err`` other than ENOSPC fails at once (no
    short write)."""

    def __init__(self, monkeypatch, budget: float, err: int = errno.ENOSPC):
        self.left, self.err, self.written = budget, err, 0
        self._pwrite = os.pwrite
        monkeypatch.setattr(os, "pwrite", self.pwrite)
        monkeypatch.setattr(os, "pwritev", self.pwritev)

    def _room(self, want: int) -> int:
        if self.left <= 0 or (self.err != errno.ENOSPC and want > self.left):
            raise OSError(self.err, os.strerror(self.err))
        n = int(min(want, self.left))
        self.left -= n
        self.written += n
        return n

    def pwrite(self, fd, buf, off):
        n = self._room(len(buf))
        return self._pwrite(fd, memoryview(buf).cast("B")[:n], off)

    def pwritev(self, fd, bufs, off):
        flat = b"".join(bytes(b) for b in bufs)
        n = self._room(len(flat))
        return self._pwrite(fd, flat[:n], off)


class FullFile(io.RawIOBase):
    """A file with ``room`` bytes of space: the write past it is cut short, the next refused."""

    def __init__(self, path, room: int):
        self.f = open(path, "wb", buffering=0)  # noqa: SIM115 - closed by close()
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(b), self.room)
        self.room -= n
        return self.f.write(bytes(memoryview(b).cast("B")[:n]))

    def fileno(self) -> int:
        return self.f.fileno()

    def close(self) -> None:
        self.f.close()
        super().close()
