"""Reading dataset pickles (CIFAR's python batches) without running their code.

``pickle.load`` calls whatever a file names, so a batch planted on a shared
dataset disk would run code on every rank. :func:`load` admits what CIFAR
batches hold and nothing else: dicts, lists, str, bytes, numbers, and numpy
arrays (and numpy scalars) of numeric dtypes.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

# the globals a numpy array's pickle names (numpy 1 and numpy 2 module names)
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("_codecs", "encode"),  # how Python 3 writes bytes at protocol 2
}


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refused global {module[:60]}.{name[:60]}")
        return super().find_class(module, name)


def load(path: str | Path) -> Any:
    """The pickle at ``path``, with encoding latin1 (CIFAR's are Python 2 pickles).
    Raises ``pickle.UnpicklingError`` for anything but the admitted types."""
    with open(path, "rb") as f:
        out = _Restricted(f, encoding="latin1").load()
    _check(out)
    return out


def _check(value: Any) -> None:
    """Object arrays would carry anything back in; only numeric ones pass."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            todo += list(v.keys()) + list(v.values())
        elif isinstance(v, (list, tuple)):
            todo += list(v)
        elif isinstance(v, (np.ndarray, np.generic)):
            if v.dtype.kind not in "biuf":
                raise pickle.UnpicklingError(f"refused numpy dtype {v.dtype}")
        elif not isinstance(v, (str, bytes, int, float, type(None))):
            raise pickle.UnpicklingError(f"refused {type(v).__name__}")
