"""Built-in datasets kept on disk once made, so the next run reads them back.

Generating mnist1d takes longer than importing torch (its package alone pulls in
matplotlib), ``digits`` costs a scikit-learn import, and decompressing Debian's
Fashion-MNIST with its channel statistics a third of a second: for a short run
that is a large share of its wall time, paid again by every rank and every point
of a sweep. The arrays
a dataset function returns are stored as they are (``.npz``, read without
pickle), so a run that reads them gets the same bits as one that made them.

Where: ``$MPIFL_CACHE`` (empty: no cache), else ``$XDG_CACHE_HOME/mpifl``, else
``~/.cache/mpifl``. A file is named by everything that made it (the dataset, its
arguments, the versions of the packages that generate it); a file that is missing,
unreadable or not of the expected arrays is made again and replaced atomically
(concurrent ranks each write their own temporary file, the last rename wins, and
every copy is the same). A folder that cannot be written costs nothing but the
time: the data are made as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

ENV = "MPIFL_CACHE"


def folder() -> Path | None:
    """The cache folder, or None when ``$MPIFL_CACHE`` is set empty."""
    if ENV in os.environ:
        return Path(os.environ[ENV]).expanduser() if os.environ[ENV] else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mpifl"


def file_for(name: str, key: dict) -> Path | None:
    where = folder()
    if where is None:
        return None
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return where / f"{name}-{digest}.npz"


def _read(path: Path, fields: tuple[str, ...], rows: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            if set(z.files) != set(fields):
                return None
            out = {k: z[k] for k in fields}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    return out if len({len(out[k]) for k in rows}) == 1 else None


def _write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def cached(name: str, key: dict, fields: tuple[str, ...], make: Callable[[], dict[str, np.ndarray]],
           rows: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """``make()``'s arrays ``fields``, from the cache when it holds them; ``key``
    names everything that decides their values. The arrays ``rows`` (default: all)
    are one row per sample, of one length."""
    path = file_for(name, {**key, "fields": list(fields)})
    if path is not None and path.is_file():
        got = _read(path, fields, rows or fields)
        if got is not None:
            return got
    arrays = make()
    if path is not None:
        _write(path, arrays)
    return arrays
