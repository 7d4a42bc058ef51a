"""Shared set-up of the plain single-process references of tests/mpi/test_{apfl,
perfedavg,fedrod}.py: 3 clients, a small MLP, 2 rounds; the algorithm runs on the
MPI ranks, the reference in one process with plain torch on the same batches."""

import numpy as np
import pytest
import serial_ref
import torch
import torch.nn.functional as F
from torch.func import functional_call

from mpifl import config
from mpifl.algorithms.base import Context
from mpifl.comm import solo
from mpifl.train import Clients

N = 3
ROUNDS = 2


def small_cfg(algo: str, **over) -> config.Config:
    args = {"data.name": "synthetic", "data.n_samples": 300, "data.n_clients": N, "data.partition": "dirichlet",
            "data.dirichlet_alpha": 0.5, "model.hidden": "[8]", "train.local_epochs": 2, "train.batch_size": 16,
            "algorithm.fraction": 0.7, "algorithm.name": algo, "run.rounds": ROUNDS, **over}
    return config.load(None, [f"{k}={v}" for k, v in args.items()])


def make_ctx(cfg, mpi_comm) -> Context:
    if mpi_comm.Get_size() > cfg.data.n_clients:
        pytest.skip(f"{N} clients: at most {N} ranks")
    return serial_ref.make_ctx(cfg, mpi_comm)


def reference(cfg) -> Context:
    """The same clients, all in this process (for batches, data and the template)."""
    return make_ctx(cfg, solo())


def batch_indices(c: Clients, k: int, t: int, epochs: int, **plan_args) -> list[np.ndarray]:
    """Client k's batches (valid sample indices) in training order."""
    plan = c.plan(np.array([k]), epochs, t, **plan_args)
    out = []
    for s in range(plan.steps):
        idx = plan.idx[0, s]
        if (idx >= 0).any():
            out.append(idx)
    return out


def valid(idx: np.ndarray) -> np.ndarray:
    return idx[idx >= 0]


def logits(c: Clients, flat: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    return functional_call(c.model, c.layout.unflatten(flat), (c.x[idx],))


def grad(c: Clients, flat: torch.Tensor, idx: np.ndarray, bias: torch.Tensor | None = None) -> torch.Tensor:
    """grad of the mean cross-entropy of model ``flat`` on samples ``idx`` (zero
    on no samples)."""
    idx = valid(idx)
    if len(idx) == 0:
        return torch.zeros_like(flat)
    leaf = flat.detach().clone().requires_grad_(True)
    out = logits(c, leaf, idx)
    if bias is not None:
        out = out + bias
    (g,) = torch.autograd.grad(F.cross_entropy(out, c.y[idx]), leaf)
    return g


def fedavg(ref: Context, rows: dict[int, torch.Tensor]) -> torch.Tensor:
    """sum_k p_k rows[k] over the clients given, p normalised over them."""
    ks = sorted(rows)
    p = ref.p[ks] / ref.p[ks].sum()
    return sum(float(pk) * rows[k].double() for pk, k in zip(p, ks)).float()


def split_metrics(c: Clients, k: int, split: str, out_fn) -> tuple[float, float]:
    """(mean CE, accuracy) of client k's ``split`` under ``out_fn(idx) -> logits``."""
    lo, hi = c.split_range(k, split)
    idx = np.arange(lo, hi)
    with torch.no_grad():
        out = out_fn(idx)
    y = c.y[idx]
    return float(F.cross_entropy(out, y)), float((out.argmax(1) == y).float().mean())
