"""FedAvgM: FedAvg with server momentum. T.-M. H. Hsu, H. Qi, M. Brown,
"Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification", arXiv:1909.06335, 2019; the server-optimizer view of S. J. Reddi
et al., "Adaptive Federated Optimization", ICLR 2021 (Algorithm 1 with SGD with
momentum as ServerOpt).

Clients train as in FedAvg (``algorithm.fraction`` sampled, E local epochs from
the global model x_t); their p-weighted average xbar_t is not taken as the next
model but as a pseudo-gradient step:

    Delta_t = x_t - xbar_t                        (the average update, as a gradient)
    v_t     = beta v_{t-1} + Delta_t,   v_{-1} = 0
    x_{t+1} = x_t - eta_s v_t

with ``fedavgm.lr`` = eta_s and ``fedavgm.momentum`` = beta. beta = 0, eta_s = 1 is
FedAvg.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedavgm fedavgm.momentum=0.9

Choices where the papers leave room:
- The momentum is PyTorch's SGD form (v accumulates Delta undamped, no Nesterov),
  which is Flower's ``FedAvgM`` definition exactly (its ``aggregate_fit``, checked
  on the same client models by ``bench/peer_flower_fedavgm.py``).
- Defaults eta_s = 1 and beta = 0.9, a usual momentum value; Hsu et al. sweep
  both, and neither paper fixes one pair for every task.
- The momentum v is the server's and identical on every rank (checkpointed once).

Logged: as FedAvg (the mixing row p over the sampled clients).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mpifl.algorithms.base import Context
from mpifl.algorithms.blocks import ServerState, evaluate_global, server_round
from mpifl.algorithms.fedavgm_params import Params  # noqa: F401 - re-exported

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedAvgM: FedAvg whose server steps with momentum on the average update (`fedavgm.lr`, `fedavgm.momentum`)"
MIXING_ROW = "as fedavg"


@dataclass
class ServerMomentum:
    """x <- x - lr v,  v <- beta v + (x - average): SGD with momentum on the
    pseudo-gradient (``blocks.ServerOptimizer``)."""

    lr: float
    beta: float
    v: torch.Tensor  # [P] momentum, identical on every rank

    @property
    def key(self) -> str:
        """The config key of the step size, named when the step diverges."""
        return "fedavgm.lr"

    def step(self, model: torch.Tensor, average: torch.Tensor) -> torch.Tensor:
        self.v = self.beta * self.v + (model - average)
        return model - self.lr * self.v


State = ServerState  # the global model and ServerMomentum


def init(ctx: Context) -> State:
    p, x = ctx.params, ctx.clients.init.clone()
    return State(model=x, server=ServerMomentum(p.lr, p.momentum, torch.zeros_like(x)))


round = server_round


evaluate = evaluate_global
