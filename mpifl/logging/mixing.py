"""A round's mixing matrix: row i says whose models client i's model was built
from, and with what weights. Three forms, so that no dense N x N array is built
where a compact one says the same:

- :class:`Dense`: rows as a dense array or a ``scipy.sparse`` matrix (graphs,
  the identity of local training);
- :class:`Shared`: one row for every client (FedAvg: p over the sampled clients);
- :class:`Grouped`: a group id and a weight per client (cluster algorithms): row i
  is the weights restricted to i's group, or e_i where that is all zero.

An algorithm returns its rank's rows (``Round.mixing``; a ``Dense`` holds only the
local clients' ``[n_local, N]`` rows, the other two are the same on every rank);
the runtime gathers them into the whole ``[N, N]`` matrix on the writer. Each form
densifies itself, and encodes itself into what the log's compact format stores
(``mpifl.logging.h5``): ``/graph/mixing_kind`` holds :attr:`Mixing.KIND`, and
:meth:`Mixing.decode` reads a round back. The kind codes are on-disk values:
never renumber them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:  # imported where a sparse matrix is made or stored: not every run makes one
    from scipy import sparse

# the per-round datasets under /graph of the compact format; COO_* are flat, every
# round's non-zeros concatenated (row i's in [end[i-1], end[i]) of COO_END)
KIND, SHARED, GROUP = "mixing_kind", "mixing_shared", "mixing_group"
COO_ROW, COO_COL, COO_VAL, COO_END = "mixing_coo/row", "mixing_coo/col", "mixing_coo/val", "mixing_coo/end"


def issparse(m: Any) -> bool:
    """A scipy.sparse matrix? Answered without importing scipy.sparse (a tenth of a
    second at every start): a process that never imported it cannot hold one."""
    mod = sys.modules.get("scipy.sparse")
    return mod is not None and mod.issparse(m)


class Mixing:
    """One round's mixing matrix in one of its forms (the subclasses)."""

    KIND: ClassVar[int]  # stored in /graph/mixing_kind (compact logs)

    def densify(self) -> np.ndarray:
        """The rows as a dense float32 array."""
        raise NotImplementedError

    def encode(self) -> dict[str, np.ndarray]:
        """What the compact log stores for this round: dataset name (under /graph) ->
        value; ``mixing_coo/*`` are the non-zeros, appended to the flat datasets."""
        raise NotImplementedError

    @staticmethod
    def decode(read: Callable[[str], np.ndarray], n: int) -> Mixing:
        """A round of a compact log: ``read(name)`` gives that round's value of a
        dataset (``mixing_coo/*``: the round's own non-zeros); ``n`` clients."""
        return _BY_KIND[int(read(KIND))].from_stored(read, n)


@dataclass(eq=False)
class Dense(Mixing):
    """Rows as a dense array or a sparse matrix: ``[n_local, N]`` from an
    algorithm, ``[N, N]`` once gathered."""

    rows: np.ndarray | sparse.spmatrix | sparse.sparray
    KIND: ClassVar[int] = 0

    def densify(self) -> np.ndarray:
        m = self.rows
        return np.asarray(m.toarray() if issparse(m) else m, np.float32)

    def encode(self) -> dict[str, np.ndarray]:
        from scipy import sparse

        coo = sparse.coo_matrix(self.rows)
        keep = coo.data != 0
        return {KIND: np.int8(self.KIND), COO_ROW: coo.row[keep].astype(np.int32),
                COO_COL: coo.col[keep].astype(np.int32), COO_VAL: coo.data[keep].astype(np.float32)}

    @classmethod
    def from_stored(cls, read: Callable[[str], np.ndarray], n: int) -> Dense:
        m = np.zeros((n, n), np.float32)
        m[read(COO_ROW), read(COO_COL)] = read(COO_VAL)
        return cls(m)


@dataclass(eq=False)
class Shared(Mixing):
    """Every client's row is ``row`` ([N])."""

    row: np.ndarray
    KIND: ClassVar[int] = 1

    def densify(self) -> np.ndarray:
        n = len(self.row)
        return np.broadcast_to(np.asarray(self.row, np.float32), (n, n)).copy()

    def encode(self) -> dict[str, np.ndarray]:
        return {KIND: np.int8(self.KIND), SHARED: np.asarray(self.row, np.float32)}

    @classmethod
    def from_stored(cls, read: Callable[[str], np.ndarray], n: int) -> Shared:
        return cls(read(SHARED))


@dataclass(eq=False)
class Grouped(Mixing):
    """Row i is ``weight`` ([N]) restricted to the clients of i's ``group`` ([N]),
    or e_i where that is all zero (a group none of whose members took part)."""

    group: np.ndarray
    weight: np.ndarray
    KIND: ClassVar[int] = 2

    def densify(self) -> np.ndarray:
        return group_matrix(self.group, self.weight)

    def encode(self) -> dict[str, np.ndarray]:
        return {KIND: np.int8(self.KIND), GROUP: np.asarray(self.group, np.int32),
                SHARED: np.asarray(self.weight, np.float32)}

    @classmethod
    def from_stored(cls, read: Callable[[str], np.ndarray], n: int) -> Grouped:
        return cls(read(GROUP), read(SHARED))


_BY_KIND: dict[int, type] = {k.KIND: k for k in (Dense, Shared, Grouped)}


def group_matrix(group: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Dense rows of the grouped form: ``m[i, j] = weight[j]`` where j is in i's
    group, and ``m[i] = e_i`` where that row would be all zero."""
    group, weight = np.asarray(group), np.asarray(weight, np.float32)
    m = np.where(group[:, None] == group[None, :], weight[None, :], np.float32(0)).astype(np.float32)
    empty = np.flatnonzero(m.sum(1) == 0)
    m[empty, empty] = 1.0
    return m
