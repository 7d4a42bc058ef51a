"""Pieces of the plain single-process references the baseline tests compare
against: every client on one process, training spelled out in plain torch on
the batches ``Clients.plan`` draws (the same indices the runtime trains on)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from mpifl import config, models
from mpifl.algorithms.base import Context
from mpifl.clients import Clients
from mpifl.comm import Comm, solo
from mpifl.data import build
from mpifl.rng import rng


def make_ctx(cfg, mpi_comm) -> Context:
    comm = Comm(cfg.data.n_clients, mpi_comm)
    data = build(cfg.data, cfg.run.seed, comm.local_ids)
    model = models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)
    clients = Clients(model, data, cfg.train, torch.device("cpu"), cfg.run.seed)
    return Context(cfg, comm, clients, data)


def serial(cfg) -> Context:
    return make_ctx(cfg, solo())


def cfg_of(**over) -> config.Config:
    args = {"data.name": "synthetic", "data.n_samples": 320, "data.n_clients": 4, "data.n_clusters": 2,
            "data.partition": "clusters", "data.synthetic_dim": 6, "model.hidden": "[5]", "train.batch_size": 16,
            "train.lr": 0.1, "run.threads": 1, **over}
    return config.load(None, [f"{k}={v}" for k, v in args.items()])


def perturbed(cfg, ids: np.ndarray, init: torch.Tensor, scale: float = 0.3) -> torch.Tensor:
    """Distinct starting rows per client, the same whatever rank hosts them."""
    return torch.stack([init + torch.from_numpy(rng(cfg.run.seed, -1, int(i), "test-perturb")
                                                .normal(0, scale, init.shape)).float() for i in ids])


def loss_of(c: Clients, theta: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    out = functional_call(c.model, c.layout.unflatten(theta), (c.x[idx],))
    return F.cross_entropy(out, c.y[idx])


def sgd(c: Clients, start: torch.Tensor, k: int, t: int, epochs: int, lr: float, subset: np.ndarray | None = None,
        extra=None, purpose: str = "train", pull=None, mask: torch.Tensor | None = None,
        bias: torch.Tensor | None = None) -> torch.Tensor:
    """Client k's row after plain SGD from ``start`` on its planned batches (of
    ``purpose``'s stream). ``extra(theta)`` is added to each batch's loss (autograd
    takes its gradient); ``pull(w)`` is added to the gradient; ``mask`` multiplies
    it (0 = frozen); ``bias`` is added to the logits."""
    plan = c.plan(np.array([k]), epochs, t, purpose, subsets=None if subset is None else [subset])
    w = start.clone()
    for s in range(plan.steps):
        idx = plan.idx[0, s]
        idx = idx[idx >= 0]
        if len(idx) == 0:
            continue
        leaf = w.clone().requires_grad_(True)
        out = functional_call(c.model, c.layout.unflatten(leaf), (c.x[idx],))
        loss = F.cross_entropy(out if bias is None else out + bias, c.y[idx])
        if extra is not None:
            loss = loss + extra(leaf)
        (g,) = torch.autograd.grad(loss, leaf)
        if pull is not None:
            g = g + pull(w)
        if mask is not None:
            g = g * mask
        w = (w - lr * g).detach()
    return w


def gathered(ctx: Context, rows) -> np.ndarray:
    return ctx.comm.allgather_rows(rows.detach().cpu().numpy() if torch.is_tensor(rows) else np.asarray(rows))
