"""What every algorithm module provides and receives.

An algorithm is a module with ``State`` (a dataclass), ``init(ctx) -> State``,
``round(ctx, state, t) -> Round`` and optionally ``evaluate(ctx, state, t)``.
It talks to other ranks only through ``ctx.comm`` (never mpi4py) and writes
nothing itself: what it returns is logged by the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from scipy import sparse

from ..data import FederatedData
from ..rng import GLOBAL, rng
from ..train import Clients

if TYPE_CHECKING:  # algorithms are imported by the config (their Params) before MPI is wanted
    from ..comm import Comm
    from ..config import Config


@dataclass
class Context:
    cfg: Config
    comm: Comm
    clients: Clients
    data: FederatedData

    @property
    def N(self) -> int:
        return self.data.n_clients

    @property
    def p(self) -> np.ndarray:
        """Client weights p_i = n_i^train / sum_j n_j^train, all N clients."""
        return self.data.weights()

    def rng(self, round: int, client: int, purpose: str) -> np.random.Generator:
        return rng(self.cfg.run.seed, round, client, purpose)

    def sample(self, round: int, fraction: float) -> np.ndarray:
        """The clients taking part in a round: the same on every rank."""
        m = max(1, int(round_half_up(fraction * self.N)))
        return np.sort(self.rng(round, GLOBAL, "sample").choice(self.N, m, replace=False))

    def local_of(self, ids: np.ndarray) -> np.ndarray:
        """Positions in this rank's block of those ``ids`` that live here."""
        ids = np.asarray(ids)
        mine = (ids >= self.comm.first) & (ids < self.comm.first + self.comm.n_local)
        return ids[mine] - self.comm.first


def round_half_up(x: float) -> float:
    return float(np.floor(x + 0.5))


@dataclass
class Round:
    """What one round produced on this rank (rows: this rank's clients)."""

    train_loss: np.ndarray  # [n_local], nan where a client did not train
    # [n_local, N] row-stochastic: a dense array or a scipy.sparse matrix (graphs,
    # identity); sparse ones travel and are stored as their non-zeros
    mixing: np.ndarray | sparse.spmatrix | sparse.sparray | None = None
    mixing_row: np.ndarray | None = None  # [N] when every client's row is the same
    # (group [N], weight [N]), the same on every rank, for cluster algorithms: row i
    # is weight restricted to i's group, or e_i where that is all zero
    mixing_groups: tuple[np.ndarray, np.ndarray] | None = None
    # per-round logs: name -> [n_local, ...]; stored at /<algorithm>/<name> (a name
    # holding "/" is a path from the root, e.g. "lia/influence")
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    # logged once, the round they appear: name -> [n_local, ...], stored as [N, ...]
    once: dict[str, np.ndarray] = field(default_factory=dict)
    # scalars or small JSON-able values for the log's root attributes (rank 0's count)
    attrs: dict[str, object] = field(default_factory=dict)


def own_rows_metrics(ctx: Context, params: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """val/test loss and accuracy of each client's own row (or one shared model)."""
    out = {}
    for split in ("val", "test"):
        loss, acc = ctx.clients.evaluate(split, params)
        out[f"{split}_loss"], out[f"{split}_acc"] = loss, acc
    return out


def identity_rows(ctx: Context) -> sparse.csr_matrix:
    """This rank's rows of the identity as a sparse ``[n_local, N]`` matrix (no dense
    ``n_local x N`` array at large N; ``.toarray()`` gives the dense one)."""
    n = ctx.comm.n_local
    return sparse.csr_matrix((np.ones(n, np.float32), (np.arange(n), ctx.comm.local_ids)), shape=(n, ctx.N))
