"""pFedMe: Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau
Envelopes", NeurIPS 2020.

Each client i keeps a personalized model theta_i that solves, on its own data,
the problem of the Moreau envelope of its loss f_i at its local model w_i:

    theta_i(w_i) = argmin_theta  f_i(theta) + (lam/2) ||theta - w_i||^2.

In round t (Algorithm 1) every client starts from w_i = w^t, theta_i = w^t and
takes, on each batch D of its ``train.local_epochs`` epochs,

    K times:  theta_i <- theta_i - eta_p (grad f_i(theta_i; D) + lam (theta_i - w_i))   (inner solve)
    then:     w_i     <- w_i - eta lam (w_i - theta_i)                                 (local update)

and the server averages the sampled clients' local models S with a mixing step

    w^{t+1} = (1 - beta) w^t + beta sum_{i in S} p_i w_i / sum_{i in S} p_i

with eta = ``train.lr``, eta_p = ``pfedme.personal_lr``, lam = ``pfedme.lam``,
K = ``pfedme.K`` and beta = ``pfedme.beta``. Clients are evaluated on theta_i.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=pfedme pfedme.lam=15

Reduction: lam = 0 leaves w_i (and so w^t) at the initial model w^0, and each
client's theta_i after round t is w^0 trained by plain SGD (step eta_p) K times
on each of that round's batches: with K = 1 and eta_p = ``train.lr``, the model
a ``local`` client would reach in round t from w^0 (Local restarted every round
from the initial model), to float rounding: the algorithm step and Local's plain
step order their sums apart (tests/mpi/algorithms/test_baselines4b.py, to 1e-5).

Choices where the paper leaves room:

- Who trains: the paper's Algorithm 1 has every client update each round and the
  server aggregate a sample S of them (``pfedme.all_train=true``, the default);
  ``false`` trains only S, as PFLlib (the same at ``algorithm.fraction=1``).
  Clients outside S keep theta_i from their training for evaluation; their w_i
  is not used (every round restarts from w^t).
- Weights: the paper averages S uniformly; here p_i (training-set size), FedAvg's
  and PFLlib's weights: equal sizes give the paper's exactly.
- The inner solve starts at w^t each round and carries theta_i from batch to
  batch (warm start), as the authors' code; K steps take the same batch.
- The inner steps are plain gradient descent (the paper's); the local update goes
  through ``train.optimizer`` with the gradient lam (w_i - theta_i) (plain SGD,
  the default, is the paper's step).
- Defaults: the paper's MNIST setting (lam = 15, K = 5, beta = 1) and the
  authors' published MNIST command's personal learning rate 0.1.
- The reported training loss is f_i(theta_i; D) at the last inner step.

Batched: every training path (the step is an algorithm step,
``mpifl.train.Step``, on the rank's clients together). State: the global model
[P] (identical on every rank) and theta_i [n_local, P] (checkpointed). Logged:
the mixing row (p over S, the average's; the new model also keeps 1 - beta of
the old), ``/pfedme/dist_to_local`` ||theta_i - w_i|| (how far personalization
moved from the client's local model this round) and ``/pfedme/dist_to_global``
||theta_i - w^{t+1}||.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import local_update, own_rows_metrics, sampled_weights
from mpifl.algorithms.pfedme_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.state import per_client
from mpifl.logging.mixing import Shared
from mpifl.train import Step, StepView

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = ("pFedMe: each client's personalized model solves its Moreau envelope (K inner steps, "
           "`pfedme.lam`), its local model steps toward it; the server beta-mixes the average")
MIXING_ROW = "p over sampled clients (the average beta mixes in)"


@dataclass
class State:
    model: torch.Tensor  # [P] global model w^t, identical on every rank
    theta: torch.Tensor = per_client()  # [n_local, P] personalized models theta_i


def init(ctx: Context) -> State:
    c = ctx.clients
    return State(model=c.init.clone(), theta=c.init.repeat(c.n, 1))


def moreau_step(theta: torch.Tensor, lam: float, K: int, personal_lr: float) -> Step:
    """The step of the equations above: K inner steps of theta_i (``theta``,
    [n_local, P]) on the batch, then w_i's step by lam (w_i - theta_i)."""

    def fn(view: StepView, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        local, th = view.params, view["theta"]
        for _ in range(K):
            g, loss = view.grads(th, x, y, w)
            th.sub_(g.add_(th - local, alpha=lam), alpha=personal_lr)
        view.step_(local, lam * (local - th))
        return loss

    return Step(fn, {"theta": theta})


def round(ctx: Context, state: State, t: int) -> Round:
    c, comm, p = ctx.clients, ctx.comm, ctx.params
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    train = np.arange(ctx.N) if p.all_train else sampled
    mine = ctx.local_of(train)
    state.theta[torch.as_tensor(mine, device=c.device)] = state.model
    _, loss = local_update(ctx, state.model, train, t, step=moreau_step(state.theta, p.lam, p.K, p.personal_lr))
    row, w = sampled_weights(ctx, sampled)
    average = comm.weighted_sum(c.params, w)
    state.model = average if p.beta == 1 else state.model + p.beta * (average - state.model)
    extras = {"dist_to_local": torch.linalg.vector_norm(state.theta - c.params, dim=1).double().cpu().numpy(),
              "dist_to_global": torch.linalg.vector_norm(state.theta - state.model, dim=1).double().cpu().numpy()}
    return Round(train_loss=loss, mixing=Shared(row), extras=extras)


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx, state.theta)
