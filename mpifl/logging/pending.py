"""Rounds waiting for run.h5 (``log.flush_s`` > 0), kept on disk meanwhile.

With ``log.flush_s`` > 0 the writer updates run.h5 at most that often: one HDF5
write per dataset and one commit for every round since, where a commit per
round cost most of the log step of millisecond rounds (bench/README.md, "Logging
share"). Each round in between is appended to ``run.h5.rounds`` as one record,
in one ``write(2)``, so a kill at any instant still leaves every finished round
on disk, in run.h5 or here. ``open_run`` reads both (the rounds here are added
to an in-memory copy of the log), the next writer moves them into run.h5 for
good, and a flush or a normal end empties the file.

A record: ``MAGIC``, the payload's length and its CRC-32, then the payload: the
length of a JSON header, the header (the round, its timings, its attributes,
and the group, name, dtype and shape of each array) and the arrays' bytes. A
record cut short by a kill or a full disk is shorter than its length says and is
ignored (it can only be the last). A whole record that fails its CRC or does not
decode was changed after it was written: :class:`Damaged`. Arrays come back
through ``np.frombuffer`` of a plain numeric dtype: nothing read from the file is
unpickled or evaluated.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from mpifl.logging.journal import pwrite_all
from mpifl.logging.mixing import Shared

MAGIC = b"MPIFLR01"
_FRAME = struct.Struct("<8sQI")  # magic, payload bytes, CRC-32 of the payload
_HLEN = struct.Struct("<I")  # header bytes, at the start of the payload
_KINDS = "biuf"  # dtype kinds a record may hold: bool, integers, floats


class Damaged(ValueError):
    """A whole record of ``run.h5.rounds`` fails its CRC-32 or cannot be decoded."""


def rounds_path(log: Path) -> Path:
    """The pending rounds of ``log``: ``run.h5`` -> ``run.h5.rounds``."""
    return log.with_name(log.name + ".rounds")


class Stored:
    """A round's mixing matrix as the log stores it: the dense matrix, or the
    compact form's arrays (``Mixing.encode``); it answers the writer's two
    questions with exactly the arrays it was given."""

    def __init__(self, dense: np.ndarray | None = None, encoded: dict[str, np.ndarray] | None = None):
        self.dense, self.encoded = dense, encoded

    def densify(self) -> np.ndarray:
        assert self.dense is not None, "a compact round read back as dense"
        return self.dense

    def encode(self) -> dict[str, np.ndarray]:
        assert self.encoded is not None, "a dense round read back as compact"
        return self.encoded


def encode(rec: dict[str, Any], compact: bool) -> bytes:
    """One framed record of a round as ``Writer.write_round`` takes it; the mixing
    matrix in the log's form (``compact``)."""
    arrays: list[tuple[str, str, np.ndarray]] = [("rows", k, np.asarray(v)) for k, v in rec["rows"].items()]
    arrays += [("once", k, np.asarray(v)) for k, v in rec["once"].items()]
    m = rec["mixing"]
    if compact:
        arrays += [("mixing", k, np.asarray(v)) for k, v in m.encode().items()] if m is not None else []
    elif type(m) is Shared:  # FedAvg's N x N copies of one row: the row (4 MB -> 4 KB a round at N = 1000)
        arrays.append(("mixing", "shared", np.asarray(m.row, np.float32)))
    elif m is not None:
        arrays.append(("mixing", "", np.asarray(m.densify())))
    plain = {}
    for k, v in rec["attrs"].items():  # numpy values keep their dtype (an HDF5 attribute's type)
        if isinstance(v, (np.ndarray, np.generic)):
            arrays.append(("attrs", k, np.asarray(v)))
        else:
            plain[k] = v
    for _, k, a in arrays:
        if a.dtype.kind not in _KINDS:
            raise TypeError(f"{k}: a {a.dtype} array cannot be logged")
    head = json.dumps({"t": int(rec["t"]), "compact": compact,
                       "rounds": {k: float(v) for k, v in rec["rounds"].items()}, "attrs": plain,
                       "arrays": [[g, k, a.dtype.str, list(a.shape)] for g, k, a in arrays]}).encode()
    payload = b"".join([_HLEN.pack(len(head)), head, *(np.ascontiguousarray(a).tobytes() for _, _, a in arrays)])
    return _FRAME.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def _decode(payload: bytes) -> dict[str, Any]:
    (n,) = _HLEN.unpack_from(payload, 0)
    head = json.loads(payload[_HLEN.size:_HLEN.size + n])
    at = _HLEN.size + n
    rec: dict[str, Any] = {"t": int(head["t"]), "rounds": dict(head["rounds"]), "rows": {}, "once": {},
                           "attrs": dict(head["attrs"]), "mixing": None}
    mixing: dict[str, np.ndarray] = {}
    for group, key, dtype, shape in head["arrays"]:
        dt = np.dtype(dtype)
        if dt.kind not in _KINDS or dt.hasobject:
            raise ValueError(f"dtype {dtype!r}")
        count = int(np.prod(shape, dtype=np.int64))
        a = np.frombuffer(payload, dt, count, at).reshape(shape).copy()
        at += count * dt.itemsize
        if group == "mixing":
            mixing[key] = a
        elif group == "attrs":
            rec["attrs"][key] = a if a.ndim else a[()]
        else:
            rec[group][key] = a
    if at != len(payload):
        raise ValueError("length")
    if "shared" in mixing and not head["compact"]:  # Shared's own densify of the float32 row it casts to
        rec["mixing"] = Shared(mixing["shared"])
    elif mixing:
        rec["mixing"] = Stored(encoded=mixing) if head["compact"] else Stored(dense=mixing[""])
    return rec


def read(path: Path) -> list[dict[str, Any]]:
    """The complete records of ``path`` in the order written ([] when there is
    none); a record cut short (the last) is left out. Raises :class:`Damaged`
    naming the file and the record where a whole one fails its check."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out, at = [], 0
    while at + _FRAME.size <= len(data):
        magic, n, crc = _FRAME.unpack_from(data, at)
        payload = data[at + _FRAME.size:at + _FRAME.size + n]
        if magic == MAGIC and len(payload) < n:  # cut short by a kill or a full disk
            break
        try:
            if magic != MAGIC or zlib.crc32(payload) != crc:
                raise ValueError("checksum")
            out.append(_decode(payload))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise Damaged(f"{str(path)!r}: record {len(out) + 1} (at byte {at}) fails its check: the file changed "
                          f"after it was written") from None
        at += _FRAME.size + n
    return out


class Appender:
    """The writer's end of ``run.h5.rounds``: records appended, then emptied when
    run.h5 holds their rounds."""

    def __init__(self, log: Path):
        self.path = rounds_path(log)
        self.fd: int | None = None
        self.size = 0  # bytes of the complete records in the file: where the next one goes
        self.records = 0  # complete records appended since the file was last emptied

    def append(self, record: bytes) -> None:
        """All of ``record`` or an ``OSError``: a short write (a full disk) is
        finished or fails (the journal's ``pwrite_all``); what it left is a cut
        record, which readers ignore."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o666)
            self.size = os.fstat(self.fd).st_size
        pwrite_all(self.fd, record, self.size)
        self.size += len(record)
        self.records += 1

    def clear(self) -> None:
        """run.h5 holds every round here (committed): empty the file."""
        if self.fd is not None and self.size:
            os.ftruncate(self.fd, 0)
            self.size = 0
        self.records = 0

    def close(self, remove: bool = False) -> None:
        """``remove``: run.h5 holds every round; else the file stays where it holds a
        complete record (a round run.h5 may lack) and goes where it holds none."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if remove or (self.path.exists() and not _holds_records(self.path)):
            self.path.unlink(missing_ok=True)


def _holds_records(path: Path) -> bool:
    try:
        return bool(read(path))
    except Damaged:
        return True  # kept: what a reader will name, not for the writer to throw away
