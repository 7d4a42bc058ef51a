"""Pieces of the plain single-process references the baseline tests compare
against: every client on one process, training spelled out in plain torch on
the batches ``Clients.plan`` draws (the same indices the runtime trains on)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from helpers import DEVICE
from torch import nn
from torch.func import functional_call

from mpifl import config, models
from mpifl.algorithms.base import Context
from mpifl.algorithms.dpfl import Choice, Reward, _shuffled, take
from mpifl.comm import Comm, solo
from mpifl.data import build
from mpifl.rng import rng
from mpifl.train import Clients


def _pair(reward: Reward, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """Two float64 models' rewards, scored in ``dtype``: the plain expression."""
    r = reward(torch.stack([x, y]).to(dtype))
    return float(r[0]), float(r[1])

def make_ctx(cfg, mpi_comm) -> Context:
    comm = Comm(cfg.data.n_clients, mpi_comm)
    data = build(cfg.data, cfg.run.seed, comm.local_ids)
    model = models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)
    clients = Clients(model, data, cfg.train, DEVICE, cfg.run.seed)
    return Context(cfg, comm, clients, data)


def bn_ctx(cfg, mpi_comm) -> Context:
    """The clients of ``cfg`` on an MLP with one BatchNorm layer (the same initial
    weights on every rank)."""
    comm = Comm(cfg.data.n_clients, mpi_comm)
    data = build(cfg.data, cfg.run.seed, comm.local_ids)
    torch.manual_seed(cfg.run.seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(data.in_shape), 8), nn.BatchNorm1d(8), nn.ReLU(),
                          nn.Linear(8, data.n_classes))
    return Context(cfg, comm, Clients(model, data, cfg.train, DEVICE, cfg.run.seed), data)


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
                                                .normal(0, scale, init.shape)).float().to(init.device) for i in ids])


def loss_of(c: Clients, theta: torch.Tensor, idx: np.ndarray, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of row ``theta`` on samples ``idx``; ``bias`` is added to the logits."""
    out = functional_call(c.model, c.layout.unflatten(theta), (c.x[idx],))
    return F.cross_entropy(out if bias is None else out + bias, c.y[idx])


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
        loss = loss_of(c, leaf, idx, bias)
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


def ggc(k: int, candidates: Sequence[int], models: Mapping[int, torch.Tensor], p: np.ndarray, reward: Reward,
        budget: float, g: np.random.Generator) -> Choice:
    """The reference: Algorithm 2 as printed, over ``candidates`` (never containing
    k); ``models`` holds k's and every candidate's model. Each tried set's mean is
    recomputed from its members, the definition BGGC's running sums must match."""
    order = _shuffled(candidates, g)
    ids = [int(k), *order]
    dtype = models[k].dtype
    M = torch.stack([models[i] for i in ids]).double()
    pw = torch.as_tensor(np.asarray(p, np.float64)[ids], device=M.device)

    def mean(mask: torch.Tensor) -> torch.Tensor:
        w = pw * mask
        return (w @ M) / w.sum()

    in_x = torch.zeros(len(ids), dtype=torch.float64, device=M.device)
    in_x[0] = 1
    in_y = torch.ones_like(in_x)
    r_x, r_y = _pair(reward, mean(in_x), mean(in_y), dtype)
    for pos, _j in enumerate(order, start=1):
        if in_x.sum().item() - 1 >= budget:
            break
        add_x, rem_y = in_x.clone(), in_y.clone()
        add_x[pos], rem_y[pos] = 1, 0
        r_xj, r_yj = _pair(reward, mean(add_x), mean(rem_y), dtype)
        a, b = max(r_xj - r_x, 0.0), max(r_yj - r_y, 0.0)
        if take(a, b, g.random()):
            in_x, r_x = add_x, r_xj
        else:
            in_y, r_y = rem_y, r_yj
    members = sorted(ids[pos] for pos in range(1, len(ids)) if in_x[pos] > 0)
    return Choice(members, r_x, mean(in_x).to(dtype))


def baseline_cfg(mpi, **over) -> config.Config:
    """5 clients (at least one per rank), 3 of them sampled a round, 2 local epochs:
    the setting of the baselines' MPI tests."""
    return cfg_of(**{"data.n_clients": max(5, mpi.Get_size()), "data.partition": "dirichlet",
                     "train.local_epochs": 2, "algorithm.fraction": 0.6, **over})


def run_rounds(cfg, mpi, rounds: int):
    """(ctx, algorithm, state, the rounds' results) of ``rounds`` rounds of the config's algorithm."""
    from mpifl import algorithms

    ctx = make_ctx(cfg, mpi)
    algo = algorithms.get(cfg.algorithm.name)
    state = algo.init(ctx)
    return ctx, algo, state, [algo.round(ctx, state, t) for t in range(rounds)]


def in_one_process(cfg, algo, rounds: int):
    """(ctx, state, the last round's result) of the same config with every client in
    one process: what the MPI tests compare a rank's share of against."""
    one = make_ctx(cfg, solo())
    state = algo.init(one)
    return one, state, [algo.round(one, state, t) for t in range(rounds)][-1]
