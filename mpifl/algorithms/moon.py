"""MOON: Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021.

FedAvg whose clients add a model-contrastive term: the representation r = R_w(x)
of the model being trained is pulled toward the global model's r_glob = R_{w^t}(x)
and pushed from the client's own previous local model's r_prev = R_{w_k^{t-1}}(x).
In round t each sampled client k starts from w^t and runs E epochs
(``train.local_epochs``) on

    l(x, y) = CE(w; x, y) + mu l_con,
    l_con   = -log( exp(sim(r, r_glob) / tau) / (exp(sim(r, r_glob) / tau) + exp(sim(r, r_prev) / tau)) )

with sim the cosine similarity, mu = ``moon.mu`` and tau = ``moon.tau``; its
trained model becomes its w_k^t, and w^{t+1} is FedAvg's p-weighted average.
mu = 0 is FedAvg bit for bit.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=moon moon.mu=1

Choices where the paper leaves room:

- The representation is the model's body output, the input of its last
  ``nn.Linear`` (``mpifl.train.head``), as PFLlib's ``model.base``: mpifl's
  models have no projection head, the paper's has one (two linear layers on the
  base encoder's output).
- ``moon.mu`` defaults to 1 (the paper's for CIFAR-100 and Tiny-ImageNet; 5 for
  CIFAR-10) and ``moon.tau`` to 0.5 (the paper's).
- r_prev of a client that has not trained yet is the initial model's (every
  client's previous model starts as w^0). Only sampled clients update theirs.
- The optimizer restarts every round, as in FedAvg; clients are evaluated with the
  global model, as in the paper.
- The term's gradient runs through the body by ``torch.func`` (vmap over the
  clients of a step on the batched path, one client after another on the loop and
  for a BatchNorm model), the same arithmetic as FedProto's prototype loss.

State: the global model [P] (identical on every rank) and each client's previous
local model [n_local, P] (checkpointed). Logged: the mixing row (p over the
sampled clients, as FedAvg), ``/moon/contrastive``, the mean of l_con over each
training client's batches (nan for the others), and ``train_loss``, the whole
local loss CE + mu l_con.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import vmap

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import evaluate_global, local_update, sampled_weights
from mpifl.algorithms.moon_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.state import per_client, transient
from mpifl.logging.mixing import Shared
from mpifl.train import Step, StepView, per_sample_loss
from mpifl.train.head import Head, find_head

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = ("MOON: FedAvg whose local loss adds `moon.mu` x a contrastive term pulling the representation toward "
           "the global model's and away from the client's previous model's (`moon.tau`)")
MIXING_ROW = "as fedavg"


@dataclass
class State:
    model: torch.Tensor  # [P] global model, identical on every rank
    prev: torch.Tensor = per_client()  # [n_local, P] each client's previous local model
    head: Head | None = transient(default=None)  # the model's body/head split (derived by init)


def init(ctx: Context) -> State:
    c = ctx.clients
    return State(model=c.init.clone(), prev=c.init.repeat(c.n, 1), head=find_head(c, ctx.cfg.model.name, "moon"))


def contrastive(h: torch.Tensor, glob: torch.Tensor, prev: torch.Tensor, tau: float) -> torch.Tensor:
    """l_con of every sample: -log softmax over (sim(h, glob), sim(h, prev)) / tau, the first."""
    pos = F.cosine_similarity(h, glob, dim=-1) / tau
    neg = F.cosine_similarity(h, prev, dim=-1) / tau
    return torch.logsumexp(torch.stack([pos, neg]), 0) - pos


def make_step(ctx: Context, state: State, con_sum: np.ndarray, steps: np.ndarray) -> Step:
    """The step on CE + mu l_con; adds each client's batch mean of l_con to ``con_sum``
    and counts its steps in ``steps``."""
    c, head, p = ctx.clients, state.head, ctx.params
    mu, tau = p.mu, p.tau

    def one(params: dict[str, torch.Tensor], x, y, w, rg, rp, bufs=None):
        h, z = head.forward_parts(params, x, bufs)
        n = w.sum().clamp_min(1.0)
        con = (contrastive(h, rg, rp, tau) * w).sum() / n
        return (per_sample_loss(z, y) * w).sum() / n + mu * con, con

    batched = vmap(one, in_dims=(0, 0, 0, 0, 0, 0))

    def step(view: StepView, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rows, q = view.rows, view.params
        rg = head.features_of(c, state.model.expand(len(rows), -1), x, rows)
        rp = head.features_of(c, state.prev[torch.as_tensor(rows, device=q.device)], x, rows)
        head.module.train()
        with torch.enable_grad():
            if c.rows_at_once:
                leaves = {k: v.detach().requires_grad_(True) for k, v in c.parts(q).items()}
                loss, con = batched(leaves, x, y, w, rg, rp)
                g = list(torch.autograd.grad(loss.sum(), list(leaves.values())))
            else:  # one client at a time (a BatchNorm model: each its own statistics)
                g, out = torch.empty_like(q), []
                for i in range(len(rows)):
                    leaves = {k: v[0].detach().requires_grad_(True) for k, v in c.parts(q[i:i + 1]).items()}
                    bufs = c.buffers_of(rows[i])
                    li, ci = one(leaves, x[i], y[i], w[i], rg[i], rp[i], bufs)
                    gi = torch.autograd.grad(li, list(leaves.values()))
                    c.write_parts(g[i:i + 1], dict(zip(leaves, (t[None] for t in gi))))
                    out.append((li.detach(), ci.detach()))
                loss, con = (torch.stack(v) for v in zip(*out))
        head.module.eval()
        view.step_(q, g)
        con_sum[rows] += con.detach().cpu().numpy()
        steps[rows] += 1
        return loss.detach()

    return Step(step)


def round(ctx: Context, state: State, t: int) -> Round:
    c, comm = ctx.clients, ctx.comm
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    con_sum, steps = np.zeros(comm.n_local), np.zeros(comm.n_local)
    step = make_step(ctx, state, con_sum, steps) if ctx.params.mu else None
    mine, loss = local_update(ctx, state.model, sampled, t, step=step)
    trained = mine[np.isfinite(loss[mine])]  # a dropped update keeps its previous model
    k = torch.as_tensor(trained, device=c.device)
    state.prev[k] = c.params[k]
    row, w = sampled_weights(ctx, sampled)
    state.model = comm.weighted_sum(c.params, w)
    con = np.full(comm.n_local, np.nan)
    con[trained] = con_sum[trained] / np.maximum(steps[trained], 1)
    return Round(train_loss=loss, mixing=Shared(row), extras={"contrastive": con})


evaluate = evaluate_global
