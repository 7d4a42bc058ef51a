"""Ditto: Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning
Through Personalization", ICML 2021.

Every client k keeps a personal model v_k beside FedAvg's global model w. The
global objective is FedAvg's, G(w) = sum_k p_k F_k(w); client k's personal one is

    min_v  h_k(v; w) = F_k(v) + (lam / 2) ||v - w||^2,   grad = grad F_k(v) + lam (v - w).

In round t each sampled client k (Algorithm 1 of the paper):
1. downloads w^t, trains a copy of it E epochs on F_k (``train.local_epochs``,
   fresh optimizer) and sends it back: w^{t+1} is FedAvg's p-weighted average;
2. trains v_k for ``ditto.personal_epochs`` epochs on h_k(v; w^t), the pull
   toward the model it downloaded, with its own optimizer state, kept between
   rounds like the clients' models in ``local``.

Clients are evaluated on v_k. lam = 0 gives ``local``'s models exactly (with
``algorithm.fraction=1`` and as many personal as local epochs); large lam pulls
v_k onto w.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=ditto ditto.lam=0.75

Choices where the paper leaves room:

- ``ditto.lam`` defaults to 0.75, DPFL's value (appendix F.6); the paper tunes it
  per dataset from {0.05, 0.1, 0.2, 0.5, 1, 2}.
- ``ditto.personal_epochs`` 0 (default) means ``train.local_epochs``: the
  authors' code takes one personal step per global step, on the same batch. Here
  both updates also draw the same batches (purpose "train"). PFLlib's
  ``plocal_epochs`` is a separate count (default 1).
- Only sampled clients update v_k (the paper's Algorithm 1); v_k starts as the
  initial model w^0.
- The personal model's optimizer is ``train.optimizer`` with its state kept per
  client (checkpointed); the global copy's restarts each round as in FedAvg.

State: the global model [P] (identical on all ranks) and per client v_k [n_local,
P] with its optimizer state. Logged: the mixing row of the global model (p over
the sampled clients, as FedAvg), ``/ditto/dist_to_global`` ||v_k - w^{t+1}|| per
client (the paper's view of how far personalization moves from the global
model), and ``/ditto/global_train_loss`` (the global copies' training loss;
``train_loss`` is the personal models').
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import own_rows_metrics, step
from mpifl.algorithms.ditto_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.state import per_client
from mpifl.train import Objective

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "Ditto: FedAvg's global model plus a personal model per client pulled toward it by (lam/2)||v - "
    "w||^2; evaluated on the personal model"
)
MIXING_ROW = "p over sampled clients (the global model)"


@dataclass
class State:
    model: torch.Tensor  # [P] global model w, identical on every rank
    personal: torch.Tensor = per_client()  # [n_local, P] v_k
    personal_opt: dict = per_client()  # v_k's optimizer state: name -> [n_local, ...]


def init(ctx: Context) -> State:
    c = ctx.clients
    return State(model=c.init.clone(), personal=c.init.repeat(c.n, 1), personal_opt=c.fresh_optimizer_state(c.n))


def round(ctx: Context, state: State, t: int) -> Round:
    c, p = ctx.clients, ctx.params
    mine = ctx.local_of(ctx.sample(t, ctx.cfg.algorithm.fraction))
    loss = np.full(ctx.comm.n_local, np.nan)
    with c.using(state.personal, state.personal_opt):
        loss[mine] = c.train(mine, p.personal_epochs or ctx.cfg.train.local_epochs, t,
                             objective=Objective(prox_center=state.model, prox_mu=p.lam))
    state.model, out = step(ctx, state.model, t, ctx.cfg.algorithm.fraction)
    out.extras["global_train_loss"] = out.train_loss
    out.extras["dist_to_global"] = torch.linalg.vector_norm(state.personal - state.model, dim=1).double().cpu().numpy()
    out.train_loss = loss
    return out


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx, state.personal)
