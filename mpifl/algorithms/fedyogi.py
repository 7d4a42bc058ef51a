"""FedYogi: S. J. Reddi, Z. Charles, M. Zaheer, Z. Garrett, K. Rush, J. Konečný,
S. Kumar, H. B. McMahan, "Adaptive Federated Optimization", ICLR 2021
(Algorithm 2, Yogi as the server optimizer).

FedAdam (``fedadam``) with Yogi's second moment, which moves toward Delta_t^2 by
at most (1 - beta2) Delta_t^2 per round instead of decaying geometrically:

    Delta_t = xbar_t - x_t                                (average client update)
    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t,        m_{-1} = 0
    v_t     = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2),   v_{-1} = tau^2
    x_{t+1} = x_t + eta_s m_t / (sqrt(v_t) + tau)

with ``fedyogi.lr`` = eta_s, ``fedyogi.beta1``, ``fedyogi.beta2``, ``fedyogi.tau``.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedyogi fedyogi.lr=0.01

Choices where the paper leaves room, and how Flower differs:
- Algorithm 2 as printed: no bias correction, v_{-1} = tau^2 (the least its input
  allows). Flower's ``FedYogi`` (flwr 1.42) has the same update and no bias
  correction either, but starts v at 0 (v_0 differs by beta2 tau^2).
- Defaults as ``fedadam``'s: beta1 = 0.9, beta2 = 0.99 (the paper's), tau = 1e-3
  and eta_s = 0.01 (tuned per task in the paper; Flower's FedYogi defaults: eta
  0.01, tau 1e-3).
- State, checkpoints and logs are FedAdam's.
"""

from __future__ import annotations

from mpifl.algorithms.base import Context
from mpifl.algorithms.blocks import ServerAdaptive, ServerState, evaluate_global, server_round
from mpifl.algorithms.fedyogi_params import Params  # noqa: F401 - re-exported

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedYogi: FedAdam with Yogi's second moment (`fedyogi.lr`, `beta1`, `beta2`, `tau`)"
MIXING_ROW = "as fedavg"


State = ServerState  # the global model and blocks.ServerAdaptive


def init(ctx: Context) -> State:
    x = ctx.clients.init.clone()
    return State(model=x, server=ServerAdaptive.fresh("yogi", ctx.params, x))


round = server_round
evaluate = evaluate_global
