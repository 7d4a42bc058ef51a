"""Selecting a block of client rows and storing an update of them back.

A training step reads the rows it updates as ``X[sel]``: a view when ``sel`` is a
slice (contiguous rows, updated in place, nothing to store back), a copy when it
is an index tensor (stored back with :func:`write_back`).
"""

from __future__ import annotations

import numpy as np
import torch


def rows_selector(rows: np.ndarray, device: torch.device | str) -> slice | torch.Tensor:
    """A slice (view, no copy) when the rows are contiguous, else an index tensor."""
    if len(rows) and np.all(np.diff(rows) == 1):
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return torch.as_tensor(rows, device=device)


def write_back(dst: torch.Tensor, sel: slice | torch.Tensor, value: torch.Tensor) -> None:
    """Store ``value``, computed from ``dst[sel]``, as rows ``sel`` of ``dst``: nothing
    to do for a slice (``value`` is a view of ``dst``), a scatter for an index tensor."""
    if not isinstance(sel, slice):
        dst[sel] = value
