"""FedAvg (McMahan et al., 2017): a fraction C of clients per round trains E
local epochs from the global model; the global model becomes the average of
their models weighted by p_i (training-set size). One Allreduce per round.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedavg algorithm.fraction=0.5

Every client is evaluated with the global model on its own val/test split; the
mixing row of every client is p over that round's sampled clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round, own_rows_metrics, sampled_weights
from mpifl.algorithms.mixing import Shared
from mpifl.train import NonFiniteError, Objective, Step

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedAvg: fraction C sampled, E local epochs, average weighted by train size"
MIXING_ROW = "p over sampled clients"


@dataclass
class State:
    model: torch.Tensor  # [P] the global model, identical on every rank


def init(ctx: Context) -> State:
    return State(model=ctx.clients.init.clone())


def download(ctx: Context, start: torch.Tensor, mine: np.ndarray, cols: torch.Tensor | None = None) -> None:
    """Local clients ``mine`` (positions) receive ``start`` ([P], or [n_local, P] per
    client) as their rows, with a fresh optimizer; the model counts as received.
    ``cols``: only these columns of a [P] ``start`` (a shared part: FedRep's body), the
    rest of each row stays the client's own."""
    c = ctx.clients
    if len(mine):
        idx = torch.as_tensor(mine, device=c.device)
        if cols is None:
            c.params[idx] = start if start.dim() == 1 else start[idx]
        else:
            c.params[idx[:, None], cols[None, :]] = start[cols]
        c.opt.reset(idx)
        ctx.comm.count(mine, recv=(c.P if cols is None else len(cols)) * ctx.comm.itemsize, models=1)


def local_update(ctx: Context, start: torch.Tensor, sampled: np.ndarray, t: int,
                 objective: Objective | None = None, step: Step | None = None,
                 batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sampled local clients download ``start`` ([P], or [n_local, P] per client)
    and train E epochs from a fresh optimizer (on ``objective``: FedProx's pull;
    by ``step``: the algorithm's own step, on batches of ``batch_size`` samples,
    default ``train.batch_size``); returns (local positions, losses [n_local], NaN
    where a client did not train or its update was dropped)."""
    c = ctx.clients
    mine = ctx.local_of(sampled)
    download(ctx, start, mine)
    loss = np.full(ctx.comm.n_local, np.nan)
    loss[mine] = c.train(mine, ctx.cfg.train.local_epochs, t, objective=objective, step=step, batch_size=batch_size)
    return mine, loss


def round(ctx: Context, state: State, t: int) -> Round:
    state.model, out = step(ctx, state.model, t, ctx.cfg.algorithm.fraction)
    return out


@dataclass
class ServerState:
    """FedAvg's state where the server keeps its own (FedAvgM, FedAdam, FedYogi)."""

    model: torch.Tensor  # [P] the global model x, identical on every rank
    server: ServerOptimizer  # its momentum or moments (checkpointed)


def server_round(ctx: Context, state: ServerState, t: int) -> Round:
    """``round`` of an algorithm whose ``state.server`` steps from the average
    (FedAvgM, FedAdam, FedYogi: a :class:`ServerOptimizer`)."""
    state.model, out = step(ctx, state.model, t, ctx.cfg.algorithm.fraction, server=state.server)
    return out


# a loss past this many times log(classes) (a uniform guess's) at the model clients
# start from: the server's step threw it out (lr=10 for FedAdam: 1e5 times), not training
WILD_LOSS = 1000


class ServerOptimizer(Protocol):
    """The server's step from the global model and the sampled clients' weighted
    average to the next global model (FedAvg: the average itself). Its state
    (momentum, moments) is a field of the algorithm's ``State``, so checkpoints
    keep it: a dataclass of tensors identical on every rank."""

    def step(self, model: torch.Tensor, average: torch.Tensor) -> torch.Tensor: ...

    # optional: ``key``, the config key of the step size (``fedadam.lr``), named when it diverges


def step(ctx: Context, model: torch.Tensor, t: int, fraction: float, objective: Objective | None = None,
         server: ServerOptimizer | None = None) -> tuple[torch.Tensor, Round]:
    """One FedAvg round from the global ``model`` [P]: the new model and the round
    (local training on ``objective`` when given; the new model is ``server``'s step
    from the clients' average, or the average itself)."""
    sampled = ctx.sample(t, fraction)
    try:
        _, loss = local_update(ctx, model, sampled, t, objective)
    except NonFiniteError as e:
        raise _diverged(ctx, model, server, t) or e from None
    row, w = sampled_weights(ctx, sampled)
    average = ctx.comm.weighted_sum(ctx.clients.params, w)
    return (average if server is None else server.step(model, average)), Round(train_loss=loss, mixing=Shared(row))


def _diverged(ctx: Context, model: torch.Tensor, server: ServerOptimizer | None, t: int) -> NonFiniteError | None:
    """The error naming the server's step size when the global model the clients
    started from already gives a wild loss (non-finite, or past :data:`WILD_LOSS`
    times a uniform guess's: the server's step diverged, not the clients'
    training); None otherwise."""
    key = getattr(server, "key", None)
    if key is None or ctx.clients.n == 0:
        return None
    loss, _ = ctx.clients.evaluate("train", model, np.arange(1))
    if np.all(loss <= WILD_LOSS * np.log(ctx.clients.n_classes)):  # NaN: not <=
        return None
    p = getattr(ctx.cfg, key.split(".")[0])
    return NonFiniteError(f"the global model the server's step made before round {t + 1} gives a loss of "
                          f"{float(loss[0]):.3g} on client {int(ctx.clients.ids[0])}'s training data: the "
                          f"server's step diverged; lower {key} (now {p.lr:g})")


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx, state.model)
