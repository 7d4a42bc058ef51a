"""The per-client training path: client by client, all of a client's steps, as
a plain torch loop on the template module bound to the client's rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch

from mpifl.train.loss import cross_entropy
from mpifl.train.objective import Objective
from mpifl.train.plan import BatchPlan

if TYPE_CHECKING:
    from mpifl.train.view import ClientsView


@contextmanager
def bound(c: ClientsView) -> Iterator[Callable[[int, torch.Tensor], None]]:
    """The template module made to compute with client rows in place: ``bind(k,
    g)`` points its parameters at row ``k`` of ``c.params`` (and its float
    buffers at row ``k`` of ``c.buffers``) and their ``.grad`` at ``g [P]``, so a
    plain ``model(x)`` / ``backward()`` reads and writes the rows themselves. The
    template's own tensors are back after the block."""
    params = [p for _, p in c.model.named_parameters()]
    bufs = [(mod, name) for mod in c.model.modules() for name, b in mod.named_buffers(recurse=False)
            if b is not None and b.is_floating_point()]
    saved = [(p.data, p.grad) for p in params], [getattr(mod, name) for mod, name in bufs]

    def bind(k: int, g: torch.Tensor) -> None:
        for p, data, grad in zip(params, c.layout.unflatten(c.params[k]).values(), c.layout.unflatten(g).values()):
            p.data, p.grad = data, grad
        for (mod, name), b in zip(bufs, c.layout.unflatten_buffers(c.buffers[k]).values()):
            setattr(mod, name, b)

    try:
        yield bind
    finally:
        for p, (data, grad) in zip(params, saved[0]):
            p.data, p.grad = data, grad
        for (mod, name), b in zip(bufs, saved[1]):
            setattr(mod, name, b)


def train_loop(c: ClientsView, local: np.ndarray, plan: BatchPlan, objective: Objective | None,
               bad: np.ndarray, losses: np.ndarray, seen: np.ndarray) -> None:
    """Every step of ``plan`` for the listed clients, client by client (no
    functional_call, no per-step host sync, one gather of the client's inputs per
    call, one flat optimizer step); same batches and arithmetic as the batched
    path. Fills ``bad``, ``losses`` (sum of loss x samples) and ``seen``."""
    c.model.train()
    g = torch.empty(c.P, device=c.device)
    counts = (plan.idx >= 0).sum(2)  # [m, steps] real samples (a prefix of each batch)
    sw = objective.sample_weight if objective is not None else None
    with bound(c) as bind, torch.enable_grad():
        for i, k in enumerate(local.tolist()):
            bind(k, g)
            steps = np.flatnonzero(counts[i])
            if len(steps) == 0:
                continue
            t = torch.as_tensor(np.maximum(plan.idx[i, steps], 0), device=c.device)
            xs = c.x.index_select(0, t.view(-1)).view(*t.shape, *c.x.shape[1:])
            ys = c.y.take(t)
            vs = sw.take(t) if sw is not None else None
            row, sel = c.params[k:k + 1], slice(k, k + 1)
            bias = objective.bias(local[i:i + 1]) if objective is not None else None
            total = torch.zeros((), device=c.device)
            rows = np.array([k])
            for j, n in enumerate(counts[i, steps].tolist()):
                # per-sample weights: the batched path's sum(v l) / n; else the plain mean
                loss = cross_entropy(c.model(xs[j, :n]), ys[j, :n], None if vs is None else vs[j, :n], n=n,
                                     bias=None if bias is None else bias[0])
                g.zero_()
                loss.backward()
                gr = g[None]
                if objective is not None:
                    gr = objective.apply(c.layout, row, gr, rows)
                c.opt.step_(sel, row, gr)
                total += loss.detach() * n
            n = float(counts[i].sum())
            lv = float(total) / n
            bad[i] |= not np.isfinite(lv)
            losses[i] += lv * n
            seen[i] += n
            bad[i] |= not bool(torch.isfinite(row.sum()))
