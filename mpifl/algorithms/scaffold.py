"""SCAFFOLD: Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD:
Stochastic Controlled Averaging for Federated Learning", ICML 2020.

FedAvg whose local steps are corrected for client drift by control variates: a
server variate c and one c_i per client (all zero at the start). In round t each
sampled client i (Algorithm 1, option II):

    y_i <- x                                          (the global model)
    K times:  y_i <- y_i - eta_l (g_i(y_i) - c_i + c)  (the corrected step)
    c_i^+ = c_i - c + (x - y_i) / (K eta_l)
    Delta y_i = y_i - x,   Delta c_i = c_i^+ - c_i,   c_i <- c_i^+

and the server sets

    x <- x + eta_g sum_{i in S} p_i Delta y_i / sum_{i in S} p_i
    c <- c + sum_{i in S} p_i Delta c_i

with K the client's number of local steps (``train.local_epochs`` epochs of its
batches), eta_l = ``train.lr`` and eta_g = ``scaffold.lr``. With c = c_i = 0
throughout, SCAFFOLD is FedAvg (eta_g = 1).

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=scaffold algorithm.fraction=0.5

Choices where the paper leaves room:

- Weights (``scaffold.weights``): the paper averages Delta y over S uniformly and
  adds Delta c with weight 1/N (``uniform``, the default, as PFLlib); ``p`` puts
  p_i (training-set size) in the place of both, FedAvg's weights, so that zero
  control variates give mpifl's FedAvg bit for bit and c = sum_i p_i c_i at every
  round. Equal sizes make the two the same; on unequal ones they differ by much
  (bench/README.md, the PFLlib peer check: 35 points on digits Dir(0.1)).
- Option II (the paper's experiments) for c_i^+: no extra pass over the data.
  K counts the client's steps that had samples. Under plain SGD, (x - y_i) / (K eta_l)
  is exactly c_i - c plus the mean of the K minibatch gradients g_i(y_i), so c_i^+ is
  that mean: an estimate of client i's gradient. Under Adam it is not: Adam's step is
  about eta_l a coordinate whatever the gradient's size, so the formula gives vectors
  of size about 1 a coordinate (||c_i|| 83-164 over 50,890 parameters in a room run,
  docs/baselines.md), and adding c - c_i to the gradient swamps it.
  ``scaffold.variate`` says which: ``steps``, the formula (eta_l = ``train.lr``);
  ``grads``, the mean of the raw minibatch gradients gathered along the K steps, the
  quantity option II stands for under any optimizer; ``auto`` (default) takes
  ``steps`` under ``train.optimizer=sgd`` (the paper's optimizer, mpifl's default, and
  what PFLlib and FL-bench compute; with momentum the formula overstates c_i by up to
  1 / (1 - momentum)) and ``grads`` under ``adam``. Under plain SGD the two agree to
  rounding (tested).
- eta_g = ``scaffold.lr`` defaults to 1, the paper's experiments; eta_g = 1 takes
  the average itself as the new x (bit for bit FedAvg's).
- A round in which the correction c - c_i is zero for every training client (the
  first one) trains on FedAvg's path; the others add the correction to the
  gradient in an algorithm step (``mpifl.train.Step``), on every training path.
- The client's optimizer restarts every round, as in FedAvg; c_i is updated only
  by sampled clients.

State: x and c [P] (identical on every rank), c_i [n_local, P] per client
(checkpointed). Logged: the mixing row (p over the sampled clients, as FedAvg),
``/scaffold/ci_norm`` ||c_i|| and ``/scaffold/correction_norm`` ||c - c_i|| of
every client after the round, and ``/scaffold/c_norm`` ||c|| (the same in every
row: the server's variate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import evaluate_global, local_update, sampled_weights
from mpifl.algorithms.scaffold_params import (
    Params,  # noqa: F401 - re-exported
    variate,
)
from mpifl.algorithms.state import per_client, transient
from mpifl.logging.mixing import Shared
from mpifl.train import Step, StepView

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = ("SCAFFOLD: FedAvg whose local steps add the control-variate correction c - c_i (option II, "
           "`scaffold.lr`, `scaffold.weights`, `scaffold.variate`)")
MIXING_ROW = "p over sampled clients (`scaffold.weights=uniform`: 1/|S|)"


@dataclass
class State:
    model: torch.Tensor  # [P] global model x, identical on every rank
    c: torch.Tensor  # [P] server control variate, identical on every rank
    ci: torch.Tensor = per_client()  # [n_local, P] client control variates c_i
    # [n_local, P] under scaffold.variate grads: each client's gradients summed over the round's steps
    gsum: torch.Tensor | None = transient(default=None)


def init(ctx: Context) -> State:
    c = ctx.clients
    gsum = torch.zeros(c.n, c.P, device=c.device) if variate(ctx.cfg) == "grads" else None
    return State(model=c.init.clone(), c=torch.zeros_like(c.init), ci=torch.zeros(c.n, c.P, device=c.device),
                 gsum=gsum)


def corrected(correction: torch.Tensor, steps: np.ndarray, gsum: torch.Tensor | None = None) -> Step:
    """The step y <- y - lr (g + correction_i) (``correction``: [n_local, P] c - c_i),
    counting each client's steps in ``steps`` [n_local] and, where ``gsum`` [n_local, P]
    is given, adding each client's raw gradient g to its row."""

    def fn(view: StepView, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        p = view.params
        g, loss = view.grads(p, x, y, w)
        rows = torch.as_tensor(view.rows, device=g.device)
        if gsum is not None:
            gsum.index_add_(0, rows, g)
        g.add_(correction[rows])
        view.step_(p, g)
        steps[view.rows] += 1
        return loss

    return Step(fn)


def round(ctx: Context, state: State, t: int) -> Round:
    c, comm = ctx.clients, ctx.comm
    x = state.model
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    mine = ctx.local_of(sampled)
    correction = state.c - state.ci  # [n_local, P]
    steps = np.zeros(comm.n_local, np.int64)
    idx = torch.as_tensor(mine, device=c.device)
    # under grads every step is watched, the first round's too: c_i^+ needs its gradients
    gsum = state.gsum.zero_() if state.gsum is not None else None
    watch = len(mine) and (gsum is not None or bool(correction[idx].any()))
    step = corrected(correction, steps, gsum) if watch else None
    _, loss = local_update(ctx, x, sampled, t, step=step)
    comm.count(mine, recv=c.P * comm.itemsize)  # c travels with x
    if step is None:  # FedAvg's path: its steps are the batches that had samples
        steps[mine] = (c.plan(mine, ctx.cfg.train.local_epochs, t).idx >= 0).any(2).sum(1)
    delta_c = torch.zeros_like(state.ci)
    trained = mine[np.isfinite(loss[mine]) & (steps[mine] > 0)]  # a dropped update keeps its c_i
    if len(trained):
        k = torch.as_tensor(trained, device=c.device)
        K = torch.as_tensor(steps[trained], dtype=x.dtype, device=c.device)[:, None]
        if gsum is None:
            new = state.ci[k] - state.c + (x - c.params[k]) / (K * ctx.cfg.train.lr)
        else:
            new = gsum[k] / K
        delta_c[k] = new - state.ci[k]
        state.ci[k] = new
    row, w, cw = weights(ctx, sampled)
    average = comm.weighted_sum(c.params, w)
    lr = ctx.params.lr
    state.model = average if lr == 1 else x + lr * (average - x)
    state.c = state.c + comm.weighted_sum(delta_c, cw)
    extras = {"ci_norm": _norms(state.ci), "correction_norm": _norms(state.c - state.ci),
              "c_norm": np.full(comm.n_local, float(torch.linalg.vector_norm(state.c)))}
    return Round(train_loss=loss, mixing=Shared(row), extras=extras)


def weights(ctx: Context, sampled: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the mixing row [N], this rank's weights of Delta y, of Delta c): p_i over the
    sampled clients and p_i, or the paper's 1/|S| and 1/N (``scaffold.weights``)."""
    if ctx.params.weights == "p":
        row, w = sampled_weights(ctx, sampled)
        return row, w, ctx.p[ctx.comm.local_ids] * np.isin(ctx.comm.local_ids, sampled)
    row = np.zeros(ctx.N)
    row[sampled] = 1 / len(sampled)
    return row, row[ctx.comm.local_ids], np.isin(ctx.comm.local_ids, sampled) / ctx.N


def _norms(rows: torch.Tensor) -> np.ndarray:
    return torch.linalg.vector_norm(rows, dim=1).double().cpu().numpy()


evaluate = evaluate_global
