"""The batched training path: a block of clients takes each optimizer step
together (their rows' gradients at once, from the clients' engine,
:mod:`mpifl.train.engine`; one optimizer update of all of them). Custom steps
(:class:`~mpifl.train.objective.Step`) take this path whether or not training is
batched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from mpifl.train.mlp import StackedMLP
from mpifl.train.objective import Objective, Step, StepView
from mpifl.train.plan import BatchPlan, gather
from mpifl.train.rows import read_rows, rows_selector, write_back

if TYPE_CHECKING:
    from mpifl.train.view import ClientsView

# Parameter bytes per chunk of clients trained together on the CPU (chunks):
# 2 to 8 MiB ran alike at 128 digits-MLP clients, 1 MiB 25% slower (bench/README.md).
CHUNK_BYTES = 4 << 20
# A conv net's work and memory are in its activations, and its grouped kernels run
# the better the more clients a call holds: at 64 clients LeNet (2.3 MB a client)
# ran at 39% of the matrix product in chunks of 1, 74% in 2, 81% in 4 and 80% in 8;
# cnn_dpfl (150 kB) at 16-20% in chunks of 8-16, 22% in 32 and 24% in 64
# (bench/README.md, Performance IV).
CONV_CHUNK_BYTES = 16 << 20


def chunks(c: ClientsView, m: int) -> list[tuple[int, int]]:
    """Client ranges trained together. On the CPU about ``CHUNK_BYTES`` of
    parameters: their forward, backward and update, and all of a call's steps,
    then share the cache instead of streaming every row from memory three times
    a step; a GPU takes all rows in one go. A conv net's chunks hold
    ``CONV_CHUNK_BYTES`` and never one client, which the grouped path would run
    beside a zero one (:func:`~mpifl.train.grouped.grouped_forward`), twice the work."""
    if not c.batched or c.device.type != "cpu":
        return [(0, m)]
    if c.convnet is not None:
        k = max(2, CONV_CHUNK_BYTES // (4 * c.P))
    else:
        k = max(1, CHUNK_BYTES // (4 * c.P))
    return [(a, min(m, a + k)) for a in range(0, m, k)]


def train_steps(c: ClientsView, local: np.ndarray, plan: BatchPlan, objective: Objective | None, step: Step | None,
                bad: np.ndarray, losses: np.ndarray, seen: np.ndarray) -> None:
    """Every step of ``plan`` for the listed clients, a chunk of clients at a time
    (``step``: a custom step, default :func:`step`). Fills ``bad``, ``losses`` (sum
    of loss x samples) and ``seen``.

    Chunk-major: a chunk of clients takes all its steps before the next chunk
    starts, so its rows stay in cache from one step to the next instead of being
    streamed from memory once per step (clients do not interact inside a call, so
    the order changes no result)."""
    has = (plan.idx >= 0).any(2)  # [m, steps]: client i has a batch at step s
    for a, b in chunks(c, len(local)):
        for s in range(plan.steps):
            act = a + np.flatnonzero(has[a:b, s])
            if len(act) == 0:
                continue
            # every step is the full batch width, padding included (weight 0), even
            # where no client stepping uses the last columns: trimmed to the widest
            # batch present, a client's short last batch had another width (and MKL
            # other GEMM kernels, with another order of additions) depending on the
            # clients sharing its rank, so its results depended on the placement
            idx = plan.idx[act, s]
            rows = local[act]
            x, y, w = gather(c, idx)
            sel = rows_selector(rows, c.device)
            v = None
            if objective is not None and objective.sample_weight is not None:
                at = torch.as_tensor(np.maximum(idx, 0), device=c.device)
                v = objective.sample_weight.take(at) * w
            loss = _custom(c, sel, rows, x, y, w, step) if step else _step(c, sel, rows, x, y, w, objective, v)
            nw = w.sum(1).cpu().numpy()
            lv = loss.detach().cpu().numpy()
            bad[act] |= ~np.isfinite(lv)
            losses[act] += lv * nw
            seen[act] += nw
        # a row sum is non-finite iff a parameter is (or the row overflows, which
        # is divergence all the same); isfinite over the rows cost as much as a
        # step, and the sum is cheapest while the chunk's rows are in cache
        bad[a:b] |= ~torch.isfinite(c.params[rows_selector(local[a:b], c.device)].sum(1)).cpu().numpy()


def _custom(c: ClientsView, sel: slice | torch.Tensor, rows: np.ndarray, x: torch.Tensor, y: torch.Tensor,
            w: torch.Tensor, step: Step) -> torch.Tensor:
    """A custom step of ``rows`` on their batches, on a view of their rows stored back after it."""
    view = StepView(c, sel, rows, step.state)
    loss = step.fn(view, x, y, w)
    view.store()
    return loss


def _step(c: ClientsView, sel: slice | torch.Tensor, rows: np.ndarray, x: torch.Tensor, y: torch.Tensor,
          w: torch.Tensor, objective: Objective | None = None, v: torch.Tensor | None = None) -> torch.Tensor:
    """One optimizer step of ``rows`` (``sel``: their selector) on their batches
    ``x, y, w``; returns their losses. ``v``: per-sample loss weights (zero on
    padding), see ``Objective.sample_weight``."""
    p = read_rows(c.params, sel)  # a view when the rows are contiguous
    # The fused update runs client by client on one thread; with more threads
    # the batched GEMM + add_ of the unfused one parallelise and win (at two
    # threads, 128 MLP clients: 9.1-9.4 vs 9.6-10.2 ms a call), and on a GPU
    # the unfused path is the one measured.
    fuse = c.device.type == "cpu" and torch.get_num_threads() == 1 and objective is None
    sgd = c.opt.fused_sgd() if fuse else None
    engine = c.engine
    if isinstance(engine, StackedMLP) and sgd is not None:
        g, loss = engine.grads(p, x, y, w, c.buffers, sgd=sgd)
    else:
        scale, valid = None, None
        if v is not None:
            valid = w > 0
            # every path computes the weighted mean sum(w l) / max(sum w, 1): feed it
            # weights summing to n (no clamp) and rescale by sum(v) / n afterwards
            n, tot = w.sum(1), v.sum(1)
            w = torch.where(tot[:, None] > 0, v * (n / tot.clamp_min(1e-30))[:, None], w)
            scale = tot / n.clamp_min(1.0)
        g, loss = engine.grads(p, x, y, w, c.buffers, rows, None if objective is None else objective.bias(rows), valid,
                               frozen=() if objective is None else objective.frozen)
        if scale is not None:
            loss = loss * scale
            for gb in ([g] if torch.is_tensor(g) else [b for b in g if b is not None]):
                gb.mul_(scale.view(-1, *(1,) * (gb.dim() - 1)))
        if objective is not None:
            g = objective.apply(c.layout, p, g, rows)
    c.opt.step_(sel, p, g)
    write_back(c.params, sel, p)
    return loss
