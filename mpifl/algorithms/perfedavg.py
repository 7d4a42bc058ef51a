"""Per-FedAvg: A. Fallah, A. Mokhtari, A. Ozdaglar, "Personalized Federated
Learning with Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach",
NeurIPS 2020.

FedAvg on the MAML objective F_i(w) = f_i(w - alpha grad f_i(w)): the global
model is a starting point that one gradient step on a client's own data
personalises. Each local step of a sampled client, on independent batches D, D'
(and D'' for the Hessian-free variant) of its training data:

    w~ = w - alpha grad f_i(w; D)                                  (inner step)
    fo: w <- w - beta grad f_i(w~; D')                             (first-order, Per-FedAvg (FO))
    hf: w <- w - beta (grad f_i(w~; D') - alpha d)                  (Hessian-free, Per-FedAvg (HF))
        d = [grad f_i(w + delta u; D'') - grad f_i(w - delta u; D'')] / (2 delta),  u = grad f_i(w~; D')

(d approximates the Hessian-vector product grad^2 f_i(w; D'') u by a central
difference, as the paper does). After ``train.local_epochs`` epochs the server
averages the sampled clients' models by p_i (training-set size), as FedAvg.

Evaluation follows the paper: every client adapts the global model by one step
of size alpha on one training batch (``train.batch_size`` samples) and is
evaluated with the adapted model; the adaptation works on a copy, so training
state is unchanged.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=perfedavg perfedavg.alpha=0.01

Choices where the paper left room:
- Batches: a step takes one batch of k x ``train.batch_size`` samples (k = 2 for
  fo, 3 for hf) from the client's plan and splits it into D, D' (, D''), as
  PFLlib does: an epoch is one pass over the client's data with every sample
  used once, in 1/k as many steps as FedAvg takes. An epoch's last, short batch
  is split the same way, so its D' (or D'') may hold fewer samples or none; an
  empty D' gives a zero outer gradient (the step only moves momentum), an empty
  D'' makes that step first-order.
- alpha defaults to 0.01 (DPFL appendix F.6); beta to ``train.lr`` (PFLlib's
  choice) when ``perfedavg.beta=0``; delta to 0.001. The inner step is plain
  gradient descent on a copy; the outer step goes through ``train.optimizer``
  with step beta (its momentum and weight decay apply to the meta-gradient).
- The reported training loss is the outer loss f_i(w~; D').

Logs: the mixing row (p over the sampled clients); ``/perfedavg/global_test_acc``,
the test accuracy of the global model before adaptation (evaluation rounds), next
to the adapted one in ``test_acc``.
"""

from __future__ import annotations

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round, evaluates
from mpifl.algorithms.blocks import GlobalModel, init_global, local_update, own_rows_metrics, sampled_weights
from mpifl.algorithms.perfedavg_params import Params  # noqa: F401 - re-exported
from mpifl.logging.mixing import Shared
from mpifl.train import Step, StepView

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "Per-FedAvg: FedAvg on the MAML objective, `perfedavg.variant` fo or hf (finite-difference Hessian), "
    "evaluated after one step of size `perfedavg.alpha`"
)
MIXING_ROW = "p over sampled clients"


State = GlobalModel  # the global model
init = init_global


def batches_per_step(ctx: Context) -> int:
    return 3 if ctx.params.variant == "hf" else 2


def outer_lr(ctx: Context) -> float:
    return ctx.params.beta or ctx.cfg.train.lr


def round(ctx: Context, state: State, t: int) -> Round:
    c = ctx.clients
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    _, loss = local_update(ctx, state.model, sampled, t, step=_step(ctx),
                                  batch_size=batches_per_step(ctx) * ctx.cfg.train.batch_size)
    row, w = sampled_weights(ctx, sampled)
    state.model = ctx.comm.weighted_sum(c.params, w)
    extras = {}
    if evaluates(ctx.cfg, t):
        extras["global_test_acc"] = c.evaluate("test", state.model)[1]
    return Round(train_loss=loss, mixing=Shared(row), extras=extras)


def _step(ctx: Context) -> Step:
    """The Per-FedAvg step of the equations above, for ``Clients.train``, on a
    batch of k x ``train.batch_size`` samples split into D, D' (, D'')."""
    p_cfg = ctx.params
    B, alpha, beta, delta, hf = ctx.cfg.train.batch_size, p_cfg.alpha, outer_lr(ctx), p_cfg.delta, p_cfg.variant == "hf"

    def step(view: StepView, x: torch.Tensor, y: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        part = [(x[:, j * B:(j + 1) * B], y[:, j * B:(j + 1) * B], wt[:, j * B:(j + 1) * B]) for j in range(3)]

        def grads(params: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor]:
            if part[j][0].shape[1] == 0:  # the epoch's last batch left no samples for it
                return torch.zeros_like(params), torch.zeros(len(view.rows), device=params.device)
            return view.grads(params, *part[j])

        w = view.params
        g, loss = grads(w - alpha * grads(w, 0)[0], 1)
        if hf:
            g = g - alpha * (grads(w + delta * g, 2)[0] - grads(w - delta * g, 2)[0]) / (2 * delta)
        view.step_(w, g, lr=beta)
        return loss

    return Step(step)


def adapted(ctx: Context, model: torch.Tensor, t: int) -> torch.Tensor:
    """[n_local, P]: the global ``model`` after one step of size alpha on one
    training batch of each local client (a copy; nothing else changes but the
    clients' step count, ``Clients.count``)."""
    c = ctx.clients
    local = np.arange(c.n)
    rows = model.repeat(c.n, 1)
    if c.n == 0:
        return rows
    plan = c.plan(local, 1, t, purpose="adapt", max_batches=1)
    x, y, w = c.batch(plan.idx[:, 0])
    g, _ = c.grads(rows, x, y, w, local)
    c.count(local, 1, (plan.idx[:, 0] >= 0).sum(1))
    return rows.sub_(g, alpha=ctx.params.alpha)


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx, adapted(ctx, state.model, t))
