"""FedAMP: Huang, Chu, Zhou, Wang, Liu, Pei, Zhang, "Personalized Cross-Silo
Federated Learning on Non-IID Data", AAAI 2021.

Every client keeps its own model w_i; the objective adds to the clients' losses
an attention-inducing function of their pairwise distances,

    min_W  sum_i F_i(w_i) + lam sum_{i<j} A(||w_i - w_j||^2),   A(x) = 1 - exp(-x / sigma),

which FedAMP minimises by alternating a step on the attention term (at the
server) and a proximal step on the losses (at the clients). In round t, with S
the sampled clients and w_j their current models, the server sends client i in
S its message

    u_i = sum_{j in S} xi_ij w_j,   xi_ij = alpha A'(||w_i - w_j||^2)  (j != i),   xi_ii = 1 - sum_{j != i} xi_ij,

A'(x) = exp(-x / sigma) / sigma: the closer two models, the more weight (the
attention), and the client solves, by ``train.local_epochs`` epochs of
``train.optimizer`` from its own model,

    w_i <- argmin_w  F_i(w) + (lam / (2 alpha)) ||w - u_i||^2

with alpha = ``fedamp.alpha`` (the paper's alpha_k, constant here), lam =
``fedamp.lam``, sigma = ``fedamp.sigma``. Clients are evaluated on w_i.

    python -m mpifl.main jobs/quickstart.yaml algorithm.name=fedamp fedamp.alpha=0.05 fedamp.lam=0.05 fedamp.sigma=1

Reduction: lam = 0 drops the proximal term, so every sampled client trains its
own model alone: ``local`` with ``local.sampled_only=true``, bit for bit
(tests/mpi/algorithms/test_baselines4b.py). (At the other end, sigma large against the
distances with alpha = sigma / |S| makes every xi_ij 1/|S|: u_i is the uniform
average of S, FedProx's pull toward it.)

Choices where the paper leaves room:

- The attention runs over the round's sampled clients S (the paper's cross-silo
  setting has every client in every round, ``algorithm.fraction=1``); clients
  outside S keep their model.
- The proximal problem is solved from the client's own w_i (a warm start from
  its last solution) with a fresh optimizer each round.
- xi_ii is not clipped: alpha sum_j A' > 1 makes it negative (the step on the
  attention term overshoots); the logged mixing rows show it.
- Distances are computed in float64 on every rank from the same gathered models,
  and every rank forms all of S's messages, so the rows agree on any number of
  ranks. They come from the centred models' Gram matrix (``attention``), which
  agrees with summing each pair's squared differences to about 1e-14 relative,
  not to the bit.
- Defaults alpha = lam = 1 are PFLlib's (``-alk``, ``-lam``); the paper tunes
  them per task. sigma sets the distance scale and, with alpha, the weights at
  zero distance (alpha / sigma each): sigma = 100 keeps xi_ii >= 0 while the
  models are still close for up to 101 clients a round. PFLlib's sigma = 1 gives
  xi_ii = 1 - 19 alpha on 20 clients' first rounds and diverges on the
  quickstart (test accuracy 0 by round 2). On the quickstart (squared distances
  about 1) the command above keeps xi_ii near 0.8 and puts the rest of each row
  on the client's own cluster by round 6.
- The paper's heuristic variant HeurFedAMP (cosine similarity) is not
  implemented.

Batched: every training path (the proximal term is ``Objective.prox_center``).
State: nothing beyond the clients' rows (their models, checkpointed). The
sampled models travel once to every rank (``allgather_ids``): each sampled
client is charged one model sent and one received (u_i). Logged:
``/graph/mixing`` (row i: xi_i over S for i in S, e_i for the others) and
``/fedamp/dist_to_message`` ||w_i - u_i|| after training (NaN outside S).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import own_rows_metrics
from mpifl.algorithms.fedamp_params import Params  # noqa: F401 - re-exported
from mpifl.logging.mixing import Dense
from mpifl.train import Objective

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = ("FedAMP: the server sends each client an attention-weighted message u_i = sum_j xi_ij w_j "
           "(xi from exp(-||w_i - w_j||^2 / sigma)), clients take a proximal step around it")
MIXING_ROW = "xi_i over the sampled clients (attention)"


@dataclass
class State:
    pass  # the clients' models are their rows


def init(ctx: Context) -> State:
    return State()


def attention(models: torch.Tensor, alpha: float, sigma: float) -> np.ndarray:
    """xi [m, m] of the ``models`` [m, P]: alpha A'(||w_i - w_j||^2) off the
    diagonal, 1 minus the row's sum on it (float64)."""
    # The squared distances from one Gram matrix, ||a||^2 + ||b||^2 - 2 a.b, in place of
    # m passes over [m, P] differences (8 s a round at 100 clients of the room's MLP, 0.1
    # s this way). Centred first: distances do not move, and the norms shrink to the
    # models' spread, so the subtraction cancels few digits (within 1e-13 of the direct
    # sums, tests/algorithms/test_fedamp_attention.py). Read from the upper triangle so
    # that xi_ij and xi_ji see the same distance bit for bit.
    w = models.double()
    w = w - w.mean(0)
    sq = (w * w).sum(1)
    d = (sq[:, None] + sq[None, :] - 2.0 * (w @ w.T)).clamp_min_(0.0).triu_(1)
    d = (d + d.T).cpu().numpy()
    xi = alpha * np.exp(-d / sigma) / sigma
    np.fill_diagonal(xi, 0.0)
    np.fill_diagonal(xi, 1.0 - xi.sum(1))
    return xi


def round(ctx: Context, state: State, t: int) -> Round:
    f, c, comm = ctx.params, ctx.clients, ctx.comm
    ids, P = comm.local_ids, c.P
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    mine = ctx.local_of(sampled)
    models = comm.allgather_ids(c.params, sampled).to(c.params)  # [m, P] the uploads
    xi = attention(models, f.alpha, f.sigma)
    messages = torch.as_tensor(xi, dtype=models.dtype, device=models.device) @ models  # [m, P], the same everywhere
    pos = np.searchsorted(sampled, ids[mine])
    idx = torch.as_tensor(mine, device=c.device)
    centre = c.params.clone()
    centre[idx] = messages[torch.as_tensor(pos, device=c.device)]
    comm.count(mine, sent=P * comm.itemsize, recv=P * comm.itemsize, models=1)
    c.reset_optimizer(idx)
    loss = np.full(comm.n_local, np.nan)
    loss[mine] = c.train(mine, ctx.cfg.train.local_epochs, t,
                         objective=Objective(prox_center=centre, prox_mu=f.lam / f.alpha))
    mixing = np.zeros((comm.n_local, ctx.N), np.float32)
    mixing[np.arange(comm.n_local), ids] = 1.0
    mixing[mine] = 0.0
    mixing[np.ix_(mine, sampled)] = xi[pos]
    dist = np.full(comm.n_local, np.nan)
    dist[mine] = torch.linalg.vector_norm(c.params[idx] - centre[idx], dim=1).double().cpu().numpy()
    return Round(train_loss=loss, mixing=Dense(mixing), extras={"dist_to_message": dist})


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx)
