"""A CRC-32 of every dataset's bytes in ``run.h5``, stored as its attribute
``crc32`` when the writer closes the file and checked by the reader.

HDF5's own checksums miss what matters in a log: Fletcher-32 sums 16-bit words
modulo 65535, so a 0x0000 word flipped to 0xFFFF (an int64 0 read as -1 in
``clients/label_hist``) leaves the sum unchanged, and a damaged chunk index can
make HDF5 read a chunk as never written (zeros, in ``graph/mixing``) without
opening the chunk at all. The CRC covers the dataset's values as read, so it
sees both.

Only a closed log carries the sums: a writer that reopens the file (a resumed or
extended run) drops them in its first commit (:func:`unseal`), and the next
clean close seals the file again (:func:`seal`). A log without them (written by
an older mpifl, or whose writer was killed) is read as before, with HDF5's
checksums only.
"""

from __future__ import annotations

import zlib

import h5py
import numpy as np

ATTR = "crc32"
NAMES_ATTR = "datasets_crc32"  # the file's: CRC-32 of its datasets' paths (a flipped name hides a dataset)
BLOCK_BYTES = 1 << 24  # read back this much of a dataset at a time


def crc32(ds: h5py.Dataset) -> int:
    """CRC-32 of the dataset's values in C order, read in blocks of rows."""
    if ds.shape is None:  # an empty (null) dataspace: nothing to sum
        return 0
    if not ds.shape:
        return zlib.crc32(np.ascontiguousarray(ds[()]).tobytes())
    rows = max(1, BLOCK_BYTES // max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64))))
    crc = 0
    for i in range(0, ds.shape[0], rows):
        crc = zlib.crc32(np.ascontiguousarray(ds[i:i + rows]), crc)
    return crc


def _datasets(f: h5py.File) -> list[h5py.Dataset]:
    out: list[h5py.Dataset] = []
    f.visititems(lambda _, obj: out.append(obj) if isinstance(obj, h5py.Dataset) else None)
    return out


class Running:
    """The CRC-32 of each extensible dataset, kept as the writer appends to it, so
    sealing does not read back (and decompress) what was just written. Rows never
    written before the last one read as the dataset's fill value (nan for the
    writer's floats, zeros otherwise: :func:`_fill`); a dataset
    rewritten out of order, or found with rows a previous writer wrote, is summed
    from the file."""

    def __init__(self) -> None:
        self.done: dict[str, tuple[int, int]] = {}  # path -> (rows summed, their CRC-32)
        self.stale: set[str] = set()  # rewritten out of order: summed from the file at seal

    def update(self, path: str, ds: h5py.Dataset, block: np.ndarray, at: int) -> None:
        """``block`` (C-contiguous) written as rows ``at ..`` of ``ds`` at ``path``
        (h5py's own name and shape lookups cost more than the sum of a small row)."""
        got = self.done.get(path)
        if got is None:
            if path in self.stale:
                return
            got = (at, crc32(ds[:at])) if at > 0 else (0, 0)  # an earlier writer's rows: summed once, from the file
        rows, crc = got
        if at < rows:
            self.stale.add(path)
            del self.done[path]
            return
        if at > rows:
            crc = _fill(crc, ds, at - rows)
        self.done[path] = (at + len(block), zlib.crc32(block, crc))

    def value(self, ds: h5py.Dataset) -> int:
        """The dataset's CRC-32 (its unwritten tail rows as its fill value)."""
        got = self.done.get(ds.name.lstrip("/"))
        if got is None or ds.shape[0] < got[0]:
            return crc32(ds)
        return _fill(got[1], ds, ds.shape[0] - got[0])


def _fill(crc: int, ds: h5py.Dataset, rows: int) -> int:
    """``crc`` continued over ``rows`` unwritten rows of ``ds``: its fill value's bytes."""
    row = np.full(ds.shape[1:], ds.fillvalue, dtype=ds.dtype).tobytes()
    if not any(row):
        return _zeros(crc, rows * len(row))
    per = max(1, BLOCK_BYTES // max(1, len(row)))
    block = row * min(rows, per)
    while rows > 0:
        k = min(rows, per)
        crc = zlib.crc32(block[:k * len(row)], crc)
        rows -= k
    return crc


def _zeros(crc: int, n: int) -> int:
    """``crc`` continued over ``n`` zero bytes."""
    block = bytes(min(n, BLOCK_BYTES))
    while n > 0:
        crc = zlib.crc32(block[:n], crc)
        n -= len(block)
    return crc


def _names_crc(datasets: list[h5py.Dataset]) -> int:
    return zlib.crc32("\n".join(sorted(ds.name for ds in datasets)).encode())


def seal(f: h5py.File, running: Running | None = None) -> None:
    """Store every dataset's CRC-32 (from ``running`` where it kept one, else read
    back), and one of their paths: the writer's last step before it closes the file."""
    datasets = _datasets(f)
    for ds in datasets:
        if ds.dtype.kind != "O":  # variable-length values have no fixed bytes: none is written
            ds.attrs[ATTR] = np.uint32(running.value(ds) if running is not None and ds.maxshape[:1] == (None,)
                                       else crc32(ds))
    f.attrs[NAMES_ATTR] = np.uint32(_names_crc(datasets))


def unseal(f: h5py.File) -> None:
    """Drop the sums: the writer is about to change the datasets."""
    for ds in _datasets(f):
        if ATTR in ds.attrs:
            del ds.attrs[ATTR]
    if NAMES_ATTR in f.attrs:
        del f.attrs[NAMES_ATTR]


def names_intact(f: h5py.File) -> bool:
    """The file's datasets are the ones it was sealed with (True when it has no sum)."""
    want = f.attrs.get(NAMES_ATTR)
    return want is None or int(want) == _names_crc(_datasets(f))


def intact(ds: h5py.Dataset) -> bool:
    """The dataset matches its stored CRC-32 (True when it has none)."""
    want = ds.attrs.get(ATTR)
    return want is None or int(want) == crc32(ds)
