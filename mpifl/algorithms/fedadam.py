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

from mpifl.algorithms.base import Context
from mpifl.algorithms.blocks import ServerAdaptive, ServerState, evaluate_global, server_round
from mpifl.algorithms.fedadam_params import Params  # noqa: F401 - re-exported

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "FedAdam: FedAvg whose server takes an Adam step on the average update (`fedadam.lr`, `beta1`, "
    "`beta2`, `tau`)"
)
MIXING_ROW = "as fedavg"


State = ServerState  # the global model and blocks.ServerAdaptive


def init(ctx: Context) -> State:
    x = ctx.clients.init.clone()
    return State(model=x, server=ServerAdaptive.fresh("adam", ctx.params, x))


round = server_round


evaluate = evaluate_global
