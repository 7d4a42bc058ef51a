"""APFL: Y. Deng, M. M. Kamani, M. Mahdavi, "Adaptive Personalized Federated
Learning", arXiv:2003.13461, 2020.

Every client keeps a local model v_i and a mixing weight alpha_i in [0, 1] and
holds a copy w_i of the global model; its personalized model is the mixture

    vbar_i = alpha_i v_i + (1 - alpha_i) w_i.

Each local step on a batch xi (the paper's Algorithm 1, all three updates from
the values before the step, on the same batch):

    w_i     <- w_i - eta grad f_i(w_i; xi)
    v_i     <- v_i - eta alpha_i grad f_i(vbar_i; xi)            (chain rule: d vbar / d v = alpha)
    alpha_i <- clip(alpha_i - eta <v_i - w_i, grad f_i(vbar_i; xi)>, 0, 1)

(d f_i(vbar) / d alpha = <v - w, grad f_i(vbar)>). The global model is
synchronised every round (tau = one round of ``train.local_epochs`` epochs, as
DPFL appendix F.6 runs it): w <- sum_i p_i w_i over the sampled clients (FedAvg,
p by training-set size), sent back to every client.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=apfl apfl.alpha=0.5

Choices where the paper left room:
- ``apfl.alpha`` (initial alpha_i) defaults to 0.5, the authors' code's default
  (FedTorch ``--fed_personal_alpha``); ``apfl.adaptive=false`` keeps it fixed (the
  paper's fixed-alpha runs). alpha's step size is ``train.lr`` (the paper's eta_t),
  projected onto [0, 1]; no extra regulariser on alpha (the authors' code adds
  0.02 alpha to its gradient; the paper does not).
- v_i starts at the initial global model; w_i's optimizer state is fresh each
  round (it is a copy of the downloaded model), v_i's persists (it is the
  client's own model). Both use ``train.optimizer`` (the paper: plain SGD).
- Only the sampled clients train (w_i, v_i, alpha_i); the others keep theirs.
- Under ``train.on_nonfinite=skip`` a dropped client keeps v_i, its optimizer
  state and alpha_i from before the round as well as w_i (the step's state,
  ``mpifl.train.Step``).
- Evaluation: client i's mixture alpha_i v_i + (1 - alpha_i) w with the new
  global w (after synchronisation w_i = w).

Logs: the mixing row (p over the sampled clients: FedAvg of w), ``/apfl/alpha``
(alpha_i every round, what the paper plots), the training loss of the mixture.
PFLlib's APFL (``clientapfl.py``) differs from the paper: it trains v_i on its own
loss instead of at the mixture and then overwrites v_i with the mixture each
round (bench/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.apfl_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import local_update, own_rows_metrics, sampled_weights
from mpifl.algorithms.state import per_client
from mpifl.logging.mixing import Shared
from mpifl.train import Step, StepView

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "APFL: local model v_i and global w mixed as alpha_i v_i + (1 - alpha_i) w, alpha_i learned by its "
    "gradient (`apfl.alpha` initial, `apfl.adaptive`), w synchronised every round"
)
MIXING_ROW = "p over sampled clients (FedAvg of w)"


@dataclass
class State:
    model: torch.Tensor  # [P] the global model w, identical on every rank
    v: torch.Tensor = per_client()  # [n_local, P] local models v_i
    v_opt: dict = per_client()  # v_i's optimizer state (rows as v)
    alpha: torch.Tensor = per_client()  # [n_local] mixing weights alpha_i


def init(ctx: Context) -> State:
    c = ctx.clients
    return State(model=c.init.clone(), v=c.init.repeat(c.n, 1), v_opt=c.fresh_optimizer_state(c.n),
                 alpha=torch.full((c.n,), float(ctx.params.alpha), device=c.device))


def mixture(state: State, w: torch.Tensor) -> torch.Tensor:
    """alpha_i v_i + (1 - alpha_i) w_i for every local client (``w``: [P] or rows)."""
    a = state.alpha[:, None]
    return a * state.v + (1 - a) * w


def round(ctx: Context, state: State, t: int) -> Round:
    c = ctx.clients
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    _, loss = local_update(ctx, state.model, sampled, t, step=_step(ctx, state))
    row, w = sampled_weights(ctx, sampled)
    state.model = ctx.comm.weighted_sum(c.params, w)
    return Round(train_loss=loss, mixing=Shared(row), extras={"alpha": state.alpha.cpu().numpy().copy()})


def _step(ctx: Context, state: State) -> Step:
    """The APFL step of the equations above, for ``Clients.train``: w_i is the
    clients' own row; v_i, its optimizer state and alpha_i are the step's state
    (a dropped update puts them back with w_i)."""
    c = ctx.clients
    lr = ctx.cfg.train.lr
    adaptive = ctx.params.adaptive
    v_opt = c.optimizer(state=state.v_opt)

    def step(view: StepView, x: torch.Tensor, y: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        w, v, alpha = view.params, view["v"], view["alpha"]
        a = alpha[:, None]
        vbar = a * v + (1 - a) * w
        g_w, _ = view.grads(w, x, y, wt)
        g_bar, loss = view.grads(vbar, x, y, wt)
        if adaptive:
            grad_a = ((v - w) * g_bar).sum(1)
        view.step_(w, g_w)
        view.step_(v, g_bar.mul_(a), opt=v_opt)
        if adaptive:
            alpha.copy_((a[:, 0] - lr * grad_a).clamp_(0.0, 1.0))
        return loss

    return Step(step, {"v": state.v, "v_opt": state.v_opt, "alpha": state.alpha})


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx, mixture(state, state.model))
