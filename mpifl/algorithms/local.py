"""Local training: every client trains alone on its own data (mixing = identity).

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=local

Two protocols, by ``local.sampled_only``:

- ``false`` (default): every client trains ``train.local_epochs`` epochs every
  round, so after R rounds each has seen R * E epochs of its own data: what a
  client alone can reach.
- ``true``: only the clients sampled that round train (``algorithm.fraction`` of
  them, the draw every FedAvg-like method here makes in round t), the others
  keep their model; each client trains in about fraction * R rounds. This is
  the Local-only baseline of FL-bench (KarhouTam/FL-bench), which pFedLIA used
  for its baselines: ``src/server/local.py``'s ``LocalServer`` (a
  ``FedAvgServer`` whose clients keep all their parameters personal) trains
  through the trainer of ``src/utils/trainer.py``, whose ``_serial_train`` and
  ``_parallel_train`` loop over ``server.selected_clients`` only, and
  ``FedAvgServer.train`` sets ``selected_clients`` each round from a stream of
  ``random.sample(train_clients, max(1, int(client_num * join_ratio)))``.
  Every client is still evaluated every round (FL-bench's final test, too,
  covers every client's own model).

With ``train.optimizer=sgd`` and no momentum (the tables' setting) a client's
optimizer holds no state, so keeping or resetting it between rounds (FL-bench
resets it by default) makes no difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import identity_rows, own_rows_metrics
from mpifl.algorithms.local_params import Params  # noqa: F401 - re-exported

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "every client trains alone"
MIXING_ROW = "identity"


@dataclass
class State:
    pass


def init(ctx: Context) -> State:
    return State()


def round(ctx: Context, state: State, t: int) -> Round:
    if not ctx.params.sampled_only:
        loss = ctx.clients.train(np.arange(ctx.comm.n_local), ctx.cfg.train.local_epochs, t)
        return Round(train_loss=loss, mixing=identity_rows(ctx))
    mine = ctx.local_of(ctx.sample(t, ctx.cfg.algorithm.fraction))
    loss = np.full(ctx.comm.n_local, np.nan)
    if len(mine):
        loss[mine] = ctx.clients.train(mine, ctx.cfg.train.local_epochs, t)
    return Round(train_loss=loss, mixing=identity_rows(ctx))


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx)
