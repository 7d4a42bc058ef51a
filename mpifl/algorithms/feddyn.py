"""FedDyn: Acar, Zhao, Navarro, Mattina, Whatmough, Saligrama, "Federated
Learning Based on Dynamic Regularization", ICLR 2021.

Each client's local objective is its loss corrected by a linear term from its
last gradient and pulled toward the server model, so that the clients' fixed
points agree with the global one. In round t each sampled client k (Algorithm 1)
starts from theta^{t-1} and runs E epochs (``train.local_epochs``) on

    R_k(theta) = L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + (alpha/2) ||theta - theta^{t-1}||^2,

then updates its gradient state,

    grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1}),   (0 at the start)

and the server

    h^t     = h^{t-1} - alpha sum_{k in P_t} p_k (theta_k^t - theta^{t-1}),   h^0 = 0
    theta^t = sum_{k in P_t} p_k theta_k^t / sum_{k in P_t} p_k - h^t / alpha

with alpha = ``feddyn.alpha``. alpha = 0 is FedAvg bit for bit (no term, h = 0).

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=feddyn feddyn.alpha=0.01

Choices where the paper leaves room:

- Weights: the paper averages over P_t uniformly and sums h's update with 1/m
  (m clients in all); here p_k (training-set size) takes both places, FedAvg's
  weights: equal sizes give the paper's exactly.
- The gradient of R_k is grad L_k + alpha (theta - c_k), c_k = theta^{t-1} +
  grad L_k(theta_k^{t-1}) / alpha: mpifl's proximal pull toward a per-client
  centre (``Objective.prox_center``), on every training path.
- ``feddyn.alpha`` defaults to 0.01, the middle of the paper's search set
  {0.1, 0.01, 0.001} (it tunes alpha per task; PFLlib's default is 1).
- Clients are evaluated with theta^t, the server model of Algorithm 1.
- Only sampled clients update their gradient state; the optimizer restarts every
  round, as in FedAvg.

State: theta and h [P] (identical on every rank), each client's gradient state
[n_local, P] (checkpointed). Logged: the mixing row (p over the sampled clients,
as FedAvg), ``/feddyn/h_norm`` ||h^t|| (the same in every row: the server's) and
``/feddyn/grad_norm`` ||grad L_k(theta_k^t)||, the linear term of every client.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import evaluate_global, local_update, sampled_weights
from mpifl.algorithms.feddyn_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.state import per_client
from mpifl.logging.mixing import Shared
from mpifl.train import Objective

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = ("FedDyn: FedAvg whose clients add a dynamic regulariser (their last gradient's linear term + "
           "(alpha/2)||w - w_global||^2, `feddyn.alpha`); the server corrects the average by its state h")
MIXING_ROW = "as fedavg"


@dataclass
class State:
    model: torch.Tensor  # [P] server model theta, identical on every rank
    h: torch.Tensor  # [P] server state h, identical on every rank
    grad: torch.Tensor = per_client()  # [n_local, P] each client's grad L_k(theta_k^{t-1})


def init(ctx: Context) -> State:
    c = ctx.clients
    return State(model=c.init.clone(), h=torch.zeros_like(c.init), grad=torch.zeros(c.n, c.P, device=c.device))


def round(ctx: Context, state: State, t: int) -> Round:
    c, comm, alpha = ctx.clients, ctx.comm, ctx.params.alpha
    prev = state.model
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    objective = Objective(prox_center=prev + state.grad / alpha, prox_mu=alpha) if alpha else None
    mine, loss = local_update(ctx, prev, sampled, t, objective)
    row, w = sampled_weights(ctx, sampled)
    average = comm.weighted_sum(c.params, w)
    if alpha:
        trained = mine[np.isfinite(loss[mine])]  # a dropped update is back at theta^{t-1}: no change
        k = torch.as_tensor(trained, device=c.device)
        state.grad[k] = state.grad[k] - alpha * (c.params[k] - prev)
        share = float(ctx.p[sampled].sum())  # sum_{k in P_t} p_k (theta_k - prev) = share (average - prev)
        state.h = state.h - alpha * share * (average - prev)
        state.model = average - state.h / alpha
    else:
        state.model = average
    extras = {"h_norm": np.full(comm.n_local, float(torch.linalg.vector_norm(state.h))),
              "grad_norm": torch.linalg.vector_norm(state.grad, dim=1).double().cpu().numpy()}
    return Round(train_loss=loss, mixing=Shared(row), extras=extras)


evaluate = evaluate_global
