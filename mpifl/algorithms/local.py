"""Local training: every client trains alone on its own data (mixing = identity).

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=local
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import Context, Round, identity_rows, own_rows_metrics

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "every client trains alone"
MIXING_ROW = "identity"


@dataclass
class State:
    pass


def init(ctx: Context) -> State:
    return State()


def round(ctx: Context, state: State, t: int) -> Round:
    loss = ctx.clients.train(np.arange(ctx.comm.n_local), ctx.cfg.train.local_epochs, t)
    return Round(train_loss=loss, mixing=identity_rows(ctx))


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx)
