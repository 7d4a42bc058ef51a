"""FeSEM: Long, Xie, Shen, Zhou, Wang, Jiang, "Multi-center federated learning:
clients clustering for better personalization" (World Wide Web Journal, 2023;
arXiv:2005.01026, 2020). K centres in parameter space, fitted by stochastic
expectation maximisation: each client belongs to the nearest centre, each centre
is the average of its clients' models.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fesem fesem.k=4

Each round t, with S the sampled clients (``algorithm.fraction``), centres
omega_1..omega_K and r_i the centre of client i:

1. local update: client i in S downloads omega_{r_i} and trains E local epochs
   from it (fresh optimizer) -> theta_i; a client not yet assigned trains from
   its own model (the run's initial model);
2. E-step: r_i = argmin_k ||theta_i - omega_k||_2 for i in S (ties: smallest k);
3. M-step: omega_k = sum_{i in S, r_i = k} p_i theta_i / sum p_i, with
   p_i = n_i^train; a centre with no sampled member keeps its value.
One grouped Allreduce of [K, P] per round; each rank measures the distances of its
own sampled clients to the K centres every rank holds (the server's E-step, on
the uploads).

Choices where the paper leaves room:
- initial centres: the paper draws them at random. Random points in parameter
  space are far from every trained model, so each client would stay with the
  centre it started from; here, in round 0, the K centres are the trained models
  of K distinct clients drawn from that round's sampled clients (the run's seeded
  global stream, purpose ``fesem/init``), as plain k-means (Forgy's start) takes
  K data points. The round's sampled clients must therefore number at least K.
- the paper's loop is E-step, M-step, local update; this one trains first and
  then assigns the fresh models (the same cycle, begun at the local update), so
  the E-step sees each sampled client's model of this round, not one from the
  last time it was sampled;
- p-weighted centres (the paper averages; equal when the clients hold as many
  samples);
- ``fesem.k`` = 0 (the default) takes the true number of clusters of the
  partition (as the seed papers did); partitions without clusters need it set.

Evaluation: an assigned client evaluates its centre, one never sampled its own
(initial) model. Logged per round: ``/fesem/cluster`` [N] (r_i after the round;
-1: never assigned; read by ``python -m mpifl.analyze`` for the ARI),
``/fesem/distance`` [N, K] (E-step distances, nan for clients not sampled),
``/graph/mixing`` (p within each centre's sampled members).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import group_weights, local_update, own_rows_metrics
from mpifl.algorithms.fesem_params import Params, check_config  # noqa: F401 - re-exported
from mpifl.errors import ConfigError
from mpifl.logging.mixing import Grouped
from mpifl.rng import GLOBAL

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FeSEM: K centres in parameter space, clients assigned to the nearest by L2, centres = p-average of members"
MIXING_ROW = "p over sampled clients of i's centre"

INIT_PURPOSE = "fesem/init"


@dataclass
class State:
    assign: np.ndarray  # [N] centre of every client, -1 before its first round; the same on every rank
    centres: torch.Tensor  # [K, P]
    seeded: bool = False  # centres drawn (round 0)


def n_centres(ctx: Context) -> int:
    k = ctx.params.k or int(ctx.data.cluster.max()) + 1
    m = len(ctx.sample(0, ctx.cfg.algorithm.fraction))
    if k > m:
        raise ConfigError(f"fesem.k={k} is not allowed here; must be <= the clients sampled per round ({m})")
    return k


def init(ctx: Context) -> State:
    k = n_centres(ctx)
    return State(assign=np.full(ctx.N, -1, np.int64), centres=ctx.clients.init.repeat(k, 1))


def round(ctx: Context, state: State, t: int) -> Round:
    c, comm = ctx.clients, ctx.comm
    ids = comm.local_ids
    K = len(state.centres)
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    own = state.assign[ids]
    start = torch.where(torch.as_tensor(own >= 0, device=c.device)[:, None],
                        state.centres[torch.as_tensor(np.maximum(own, 0), device=c.device)], c.params)
    mine, loss = local_update(ctx, start, sampled, t)
    if not state.seeded:
        picks = np.sort(ctx.rng(t, GLOBAL, INIT_PURPOSE).choice(sampled, K, replace=False))
        state.centres = comm.allgather_ids(c.params, picks).to(state.centres)
        state.seeded = True

    # E-step on this rank's sampled clients, against the centres every rank holds
    dist = np.full((comm.n_local, K), np.nan)
    if len(mine):
        dist[mine] = torch.cdist(c.params[torch.as_tensor(mine, device=c.device)].double(),
                                 state.centres.double()).cpu().numpy()
    new_local = own.copy()
    new_local[mine] = np.argmin(dist[mine], axis=1)
    assign = comm.allgather_rows(new_local)

    # M-step: centres = p-weighted average of their sampled members
    w, wl = group_weights(ctx, assign, sampled)
    sums = comm.grouped_sum(c.params, wl, np.maximum(new_local, 0), K)
    hit = torch.as_tensor(np.isin(np.arange(K), assign[sampled]), device=sums.device)
    state.centres = torch.where(hit[:, None], sums.to(state.centres), state.centres)
    state.assign = assign
    return Round(train_loss=loss, mixing=Grouped(assign, w),
                 extras={"cluster": assign[ids].astype(np.int64), "distance": dist})


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    c = ctx.clients
    own = state.assign[ctx.comm.local_ids]
    rows = torch.where(torch.as_tensor(own >= 0, device=c.device)[:, None],
                       state.centres[torch.as_tensor(np.maximum(own, 0), device=c.device)], c.params)
    return own_rows_metrics(ctx, rows)
