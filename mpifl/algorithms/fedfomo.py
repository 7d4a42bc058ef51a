"""FedFomo: Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated
Learning with First Order Model Optimization" (ICLR 2021). Each client downloads
a few other clients' models and mixes in those that lower its validation loss,
weighted by loss improvement per unit of parameter distance.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedfomo fedfomo.m=5

Each round t, for every sampled client i (``algorithm.fraction``), on the rank
hosting it (decentralized: i decides from what it pulled and its own data):

1. candidates: M = ``fedfomo.m`` other clients, affinity-guided epsilon-greedy:
   with probability eps_t = ``eps`` (1 - ``eps_decay``)^t M uniform draws, else
   the M largest affinities P_i[j]; one permutation of the others from i's own
   stream (purpose ``fedfomo/candidates``) is both the uniform draw and the
   tie-break of the top-M (the same rule as FedeRiCo's neighbour sampling);
2. ``pull`` theta_j of the candidates (their current models, as the paper's
   server holds each client's last upload);
3. on i's held-out validation part V_i of its training data:
       w_ij = (L_i(theta_i) - L_i(theta_j)) / ||theta_j - theta_i||
   (0 where theta_j = theta_i), P_i[j] += w_ij (the raw weight, as the paper's
   affinity update), then w_ij <- max(w_ij, 0) / sum_k max(w_ik, 0);
4. if any w_ij > 0:  theta_i <- theta_i + sum_j w_ij (theta_j - theta_i);
5. E local epochs from theta_i (fresh optimizer) on the training part only.

Choices where the paper leaves room:
- V_i: a seeded random ``val_frac`` of client i's training samples (stream
  round -1, purpose ``fedfomo/val``; at least one sample when the client has two),
  fixed for the run and never trained on (FedeRiCo holds out part of the
  training data the same way). L_i is the mean cross-entropy over all of V_i.
- epsilon schedule: the paper anneals epsilon from 0.3; we read its decay of 0.05
  per round as geometric, eps_t = eps (1 - eps_decay)^t.
- candidates range over every other client (the paper's server offers the
  models it holds; ours hold every client's current row: clients never sampled
  still hold the initial model, whose weight is 0 while i is at the initial
  model too and otherwise measures the distance honestly).
- the affinity starts at 0 for every pair.

Logged per round: ``/fedfomo/weights`` [N, N] (normalised w_ij, zero rows for
clients not sampled), ``/fedfomo/affinity`` [N, N] (P after the round),
``/fedfomo/candidates`` [N, M] (-1 for clients not sampled), ``/graph/mixing``
(row i: w_i, or e_i where no candidate helped or i was not sampled).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import own_rows_metrics, sample_neighbours
from mpifl.algorithms.fedfomo_params import Params, check_config, held_out, selection_samples  # noqa: F401 - re-exported
from mpifl.algorithms.state import per_client
from mpifl.logging.mixing import Dense
from mpifl.train import per_sample_loss

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "FedFomo: each sampled client pulls `fedfomo.m` models (affinity-guided epsilon-greedy) and mixes in "
    "those that lower its held-out loss, weighted by loss drop per distance"
)
MIXING_ROW = "w_i over i's candidates (e_i if none helps)"

PURPOSE = "fedfomo/candidates"
VAL_PURPOSE = "fedfomo/val"


@dataclass
class State:
    affinity: np.ndarray = per_client()  # [n_local, N] P_i


def init(ctx: Context) -> State:
    return State(affinity=np.zeros((ctx.comm.n_local, ctx.N)))


def split(ctx: Context, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(training part, validation part) of local client r's training samples, as
    indices into the rank's ``x``."""
    c = ctx.clients
    lo, hi = c.split_range(r, "train")
    n = hi - lo
    k = held_out(ctx.params.val_frac, n)
    perm = ctx.rng(-1, int(c.ids[r]), VAL_PURPOSE).permutation(n)
    return lo + np.sort(perm[k:]), lo + np.sort(perm[:k])


@torch.no_grad()
def val_losses(ctx: Context, r: int, models: torch.Tensor, val: np.ndarray) -> np.ndarray:
    """Mean cross-entropy of each model row on local client r's samples ``val``."""
    c = ctx.clients
    if len(val) == 0:
        return np.zeros(len(models))
    x, y, w = c.batch(np.broadcast_to(val, (len(models), len(val))))
    logits = c.logits(models, x, np.full(len(models), r))
    ce = per_sample_loss(logits, y)
    return ce.double().mean(1).cpu().numpy()


def weights(L_own: float, L: np.ndarray, dist: np.ndarray) -> np.ndarray:
    """Raw w_j = (L_own - L_j) / dist_j, 0 where dist_j = 0."""
    safe = np.where(dist > 0, dist, 1.0)
    return np.where(dist > 0, (L_own - L) / safe, 0.0)


def normalised(w: np.ndarray) -> np.ndarray:
    """max(w, 0) / its sum; all zeros where nothing is positive."""
    w = np.maximum(w, 0.0)
    s = w.sum()
    return w / s if s > 0 else w


def round(ctx: Context, state: State, t: int) -> Round:
    f, c, comm = ctx.params, ctx.clients, ctx.comm
    n, ids, N = comm.n_local, comm.local_ids, ctx.N
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    mine = ctx.local_of(sampled)
    eps_t = f.eps * (1.0 - f.eps_decay) ** t
    cands = np.full((n, f.m), -1, np.int64)
    for r in mine:
        cands[r] = sample_neighbours(state.affinity[r], int(ids[r]), f.m, eps_t, ctx.rng(t, int(ids[r]), PURPOSE))
    held = comm.pull(c.params, {int(r): cands[r].tolist() for r in mine})

    W = np.zeros((n, N))
    mixing = np.zeros((n, N), np.float32)
    mixing[np.arange(n), ids] = 1.0
    parts = [split(ctx, int(r)) for r in mine]
    for r, (_, val) in zip(mine, parts):
        own = c.params[r]
        models = torch.stack([own, *(held[int(j)] for j in cands[r])])
        L = val_losses(ctx, int(r), models, val)
        dist = (models[1:] - own).double().norm(dim=1).cpu().numpy()
        raw = weights(L[0], L[1:], dist)
        state.affinity[r, cands[r]] += raw
        w = normalised(raw)
        if w.sum() > 0:
            wt = torch.as_tensor(w, dtype=own.dtype, device=own.device)
            c.params[r] = own + wt @ (models[1:] - own)
            W[r, cands[r]] = w
            mixing[r] = 0.0
            mixing[r, cands[r]] = w
    c.reset_optimizer(torch.as_tensor(mine, device=c.device))
    loss = np.full(n, np.nan)
    loss[mine] = c.train(mine, ctx.cfg.train.local_epochs, t, subsets=[tr for tr, _ in parts])
    return Round(train_loss=loss, mixing=Dense(mixing),
                 extras={"weights": W.astype(np.float32), "affinity": state.affinity.astype(np.float32),
                         "candidates": cands})


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx)
