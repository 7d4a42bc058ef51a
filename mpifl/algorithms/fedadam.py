"""FedAdam: S. J. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush, J. Konečný,
S. Kumar, H. B. McMahan, "Adaptive Federated Optimization", ICLR 2021
(Algorithm 2, Adam as the server optimizer).

Clients train as in FedAvg (``algorithm.fraction`` sampled, E local epochs from
the global model x_t); the server treats their p-weighted average update as the
gradient of Adam, coordinate-wise:

    Delta_t = xbar_t - x_t                                (average client update)
    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t,        m_{-1} = 0
    v_t     = beta2 v_{t-1} + (1 - beta2) Delta_t^2,      v_{-1} = tau^2
    x_{t+1} = x_t + eta_s m_t / (sqrt(v_t) + tau)

with ``fedadam.lr`` = eta_s, ``fedadam.beta1``, ``fedadam.beta2``, ``fedadam.tau``
(the adaptivity: a small tau makes each step close to eta_s per coordinate).
FedYogi (``fedyogi``) is the same with Yogi's v.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedadam fedadam.lr=0.01

Choices where the paper leaves room, and how Flower differs:
- The paper's Algorithm 2 as printed: no bias correction, v_{-1} = tau^2 (the
  least its input allows). Flower's ``FedAdam`` (flwr 1.42) starts v at 0 and
  scales eta by the bias correction sqrt(1 - beta2^(r+1)) / (1 - beta1^(r+1)) in
  its round r >= 1, which the paper does not have; mpifl follows the paper, whose
  hyper-parameters are the ones reported. Both take Delta = average - x (the
  update, not its negative) and add eta_s m / (sqrt v + tau).
- Defaults: beta1 = 0.9 and beta2 = 0.99, the paper's; tau = 1e-3 and eta_s =
  0.01 (the paper tunes eta_s and tau per task on grids of powers of 10; Flower's
  defaults are eta 0.1, tau 1e-9 for FedAdam).
- m and v are the server's, identical on every rank (checkpointed once).

Logged: as FedAvg (the mixing row p over the sampled clients).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from mpifl.algorithms import fedavg
from mpifl.algorithms.base import Context
from mpifl.errors import check

if TYPE_CHECKING:
    from mpifl.config.sections import ConfigBase as Config

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "FedAdam: FedAvg whose server takes an Adam step on the average update (`fedadam.lr`, `beta1`, "
    "`beta2`, `tau`)"
)
MIXING_ROW = "as fedavg"


@dataclass
class Params:
    """Hyper-parameters: the config section ``fedadam``."""

    lr: float = 0.01  # server learning rate eta_s
    beta1: float = 0.9  # decay of the first moment m (paper: 0.9)
    beta2: float = 0.99  # decay of the second moment v (paper: 0.99)
    tau: float = 1e-3  # adaptivity tau in eta_s m / (sqrt(v) + tau); v starts at tau^2

    def validate(self, cfg: Config) -> None:
        check(self.lr > 0 and math.isfinite(self.lr), "lr", self.lr, "must be a finite number > 0")
        check(0 <= self.beta1 < 1, "beta1", self.beta1, "must be in [0, 1)")
        check(0 <= self.beta2 < 1, "beta2", self.beta2, "must be in [0, 1)")
        check(self.tau > 0 and math.isfinite(self.tau), "tau", self.tau, "must be a finite number > 0")


@dataclass
class ServerAdaptive:
    """Adam's or Yogi's step on the average client update (``fedavg.ServerOptimizer``)."""

    rule: Literal["adam", "yogi"]
    lr: float
    beta1: float
    beta2: float
    tau: float
    m: torch.Tensor  # [P] first moment, identical on every rank
    v: torch.Tensor  # [P] second moment

    @classmethod
    def fresh(cls, rule: Literal["adam", "yogi"], p: Params, model: torch.Tensor) -> ServerAdaptive:
        return cls(rule, p.lr, p.beta1, p.beta2, p.tau, torch.zeros_like(model),
                   torch.full_like(model, p.tau * p.tau))

    @property
    def key(self) -> str:
        """The config key of the step size, named when the step diverges."""
        return f"fed{self.rule}.lr"

    def step(self, model: torch.Tensor, average: torch.Tensor) -> torch.Tensor:
        delta = average - model
        self.m = self.beta1 * self.m + (1 - self.beta1) * delta
        d2 = delta * delta
        if self.rule == "adam":
            self.v = self.beta2 * self.v + (1 - self.beta2) * d2
        else:  # Yogi: v moves toward Delta^2 by at most (1 - beta2) Delta^2
            self.v = self.v - (1 - self.beta2) * d2 * torch.sign(self.v - d2)
        return model + self.lr * self.m / (torch.sqrt(self.v) + self.tau)


State = fedavg.ServerState  # the global model and ServerAdaptive


def init(ctx: Context) -> State:
    x = ctx.clients.init.clone()
    return State(model=x, server=ServerAdaptive.fresh("adam", ctx.params, x))


round = fedavg.server_round


evaluate = fedavg.evaluate
