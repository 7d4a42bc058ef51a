"""FedProx: Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization
in Heterogeneous Networks", MLSys 2020.

FedAvg whose clients minimise their loss plus a proximal term toward the model
they downloaded. In round t each sampled client k starts from the global model
w^t and runs E local epochs of the optimizer on

    h_k(w; w^t) = F_k(w) + (mu / 2) ||w - w^t||^2,   grad = grad F_k(w) + mu (w - w^t)

and the server sets w^{t+1} = sum_{k in S_t} p_k w_k / sum_{k in S_t} p_k.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedprox fedprox.mu=0.1

Choices where the paper leaves room:

- ``fedprox.mu`` defaults to 0.1, DPFL's value (appendix F.6, "lambda = 0.1 for
  all datasets"); mu = 0 is FedAvg bit for bit (the same code path).
- Sampling and aggregation are FedAvg's (``algorithm.fraction`` uniformly, then
  p-weighted), as in DPFL's and PFLlib's FedProx; the paper's analysis samples
  clients with probability p_k and averages them uniformly, which has the same
  expectation.
- Every sampled client runs the full E epochs: the paper's gamma-inexact partial
  work of stragglers is not simulated.
- The optimizer is ``train.optimizer`` (fresh every round as in FedAvg); the
  paper's is SGD, mpifl's default.

Logged: the mixing row (p over the sampled clients, as FedAvg) and
``/fedprox/drift``, ||w_k - w^t|| of each sampled client's update (nan for the
others): what the proximal term holds back.
"""

from __future__ import annotations

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import GlobalModel, evaluate_global, init_global
from mpifl.algorithms.blocks import step as fedavg_step  # this module's step is FedProx's
from mpifl.algorithms.fedprox_params import Params  # noqa: F401 - re-exported
from mpifl.train import Objective

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedProx: FedAvg whose local loss adds (mu/2)||w - w_global||^2 (`fedprox.mu`)"
MIXING_ROW = "as fedavg"


State = GlobalModel
init = init_global
evaluate = evaluate_global


def step(ctx: Context, model: torch.Tensor, t: int, mu: float) -> tuple[torch.Tensor, Round]:
    """One FedProx round from the global ``model`` [P] with proximal weight ``mu``
    (an argument: FedProx+FT trains with FedProx's): the new model and the round."""
    objective = Objective(prox_center=model, prox_mu=mu)
    new, out = fedavg_step(ctx, model, t, ctx.cfg.algorithm.fraction, objective)
    out.extras["drift"] = drift(ctx, model, out.train_loss)
    return new, out


def round(ctx: Context, state: State, t: int) -> Round:
    state.model, out = step(ctx, state.model, t, ctx.params.mu)
    return out


def drift(ctx: Context, start: torch.Tensor, loss: np.ndarray) -> np.ndarray:
    """||w_k - start|| of the clients that trained this round (finite loss), else nan."""
    out = np.full(ctx.comm.n_local, np.nan)
    trained = np.flatnonzero(np.isfinite(loss))
    if len(trained):
        rows = ctx.clients.params[torch.as_tensor(trained, device=start.device)]
        out[trained] = torch.linalg.vector_norm(rows - start, dim=1).double().cpu().numpy()
    return out
