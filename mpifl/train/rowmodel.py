"""Logits and gradients of a block of client rows through the template model.

Batched, the rows go through at once: a plain MLP through the stacked kernels
(:mod:`mpifl.train.mlp`), a plain conv net through grouped convolutions
(:mod:`mpifl.train.grouped`), any other model through ``torch.func.vmap`` over
``functional_call`` (:class:`RowModel`), a BatchNorm model with each client's
running statistics riding along as a vmapped buffer row. Unbatched, the same
functional model runs one row at a time. Nothing here updates parameters; only
BatchNorm's running statistics (``Clients.buffers``) advance, as in training.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from mpifl.train import mlp
from mpifl.train.grouped import grouped_forward, grouped_loss
from mpifl.train.layout import Layout
from mpifl.train.loss import cross_entropy
from mpifl.train.rows import rows_selector

if TYPE_CHECKING:
    from mpifl.train.clients import Clients


class RowModel:
    """The template model as a pure function of one client's parameter row (and
    float buffer row): its logits and its training loss, and their vmaps over
    clients."""

    def __init__(self, model: nn.Module, layout: Layout):
        self.model, self.layout = model, layout
        self.vloss = vmap(self.loss, in_dims=(0, 0, 0, 0))
        self.vloss_bias = vmap(self.loss, in_dims=(0, 0, 0, 0, None, 0))
        # BatchNorm: each client's running statistics ride along as a vmapped buffer row
        self.vloss_bufs = vmap(self.loss, in_dims=(0, 0, 0, 0, 0))
        self.vloss_bufs_bias = vmap(self.loss, in_dims=(0, 0, 0, 0, 0, 0))
        self.vlogits = vmap(self.logits, in_dims=(0, 0))
        self.vlogits_bufs = vmap(self.logits, in_dims=(0, 0, 0))

    def _state(self, params: dict[str, torch.Tensor],
               bufs: torch.Tensor | dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """The module state: per-parameter tensors and, for a model with float
        buffers, a flat buffer row's views (or per-buffer tensors as given)."""
        if bufs is None or not self.layout.B:
            return params
        return {**params, **(bufs if isinstance(bufs, dict) else self.layout.unflatten_buffers(bufs))}

    def logits(self, flat: torch.Tensor, x: torch.Tensor, bufs: torch.Tensor | None = None) -> torch.Tensor:
        """Outputs of the model with parameter row ``flat [P]`` (and buffer row ``bufs``) on ``x``."""
        return functional_call(self.model, self._state(self.layout.unflatten(flat), bufs), (x,))

    def loss(self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
             bufs: torch.Tensor | dict[str, torch.Tensor] | None = None,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        """The weighted loss (:func:`~mpifl.train.loss.cross_entropy`) of the model with
        per-parameter tensors ``params`` on one batch; ``bufs``: a flat buffer row or
        per-buffer tensors."""
        return cross_entropy(functional_call(self.model, self._state(params, bufs), (x,)), y, w, bias=bias)


def grads(c: Clients, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
          local: np.ndarray | None = None, bias: torch.Tensor | None = None,
          valid: torch.Tensor | None = None,
          frozen: Collection[str] = ()) -> tuple[torch.Tensor | list[torch.Tensor | None], torch.Tensor]:
    """Gradient and loss ``[m]`` of each row ``params[i]`` on its batch ``(x[i], y[i],
    w[i])``: a flat ``[m, P]`` gradient, or per-parameter blocks ``[m, *shape]`` on the
    batched paths. ``local`` names the clients whose BatchNorm buffers the rows
    use; ``bias [m, C]`` is added to row i's logits in the loss. ``valid``: the
    batch's real samples where ``w`` may be zero on some of them (per-sample
    weights): the row-by-row path still forwards them, so BatchNorm sees the whole
    batch. ``frozen``: parameter names whose gradient is not wanted; the batched
    paths without BatchNorm skip their work and return None for their blocks (the
    others compute every block)."""
    m = params.shape[0]
    if c.batched and c.stacked is not None:  # Linear/ReLU only: no train mode
        with torch.no_grad():
            return mlp.stacked_grads(c.stacked, c.layout.parts(params), x, y, w, grad_blocks(c, m), bias=bias,
                                     frozen=frozen)
    c.model.train()
    # Differentiate with respect to per-parameter views, not the flat row: the
    # backward of slicing a flat row materialises a zero [m, P] tensor per
    # parameter tensor, which cost more than the model's own matmuls. Batched:
    # vmap the forward only and let plain autograd take the gradient of the sum
    # of the per-client losses (client i's loss depends on row i alone), which
    # is cheaper than functorch's grad transform.
    fn = c.functional
    with torch.enable_grad():
        if c.batched and c.layout.B and local is not None:
            return _grads_bn(c, params, x, y, w, local, bias, valid)
        if c.batched:
            leaves = {k: v.detach().requires_grad_(k not in frozen) for k, v in c.layout.parts(params).items()}
            if c.convnet is not None:
                loss = grouped_loss(c.convnet, leaves, x, y, w, bias)
            else:
                loss = fn.vloss(leaves, x, y, w) if bias is None else fn.vloss_bias(leaves, x, y, w, None, bias)
            want = [k for k in leaves if k not in frozen]
            got: dict[str, torch.Tensor | None] = dict.fromkeys(leaves)
            if want:
                got.update(zip(want, torch.autograd.grad(loss.sum(), [leaves[k] for k in want])))
            return list(got.values()), loss.detach()
        g = torch.empty(m, c.P, dtype=params.dtype, device=params.device)
        ls = []
        for i in range(m):
            keep = valid[i] if valid is not None else w[i] > 0
            parts = {k: v[0].detach().requires_grad_(True) for k, v in c.layout.parts(params[i:i + 1]).items()}
            bufs = c.buffers[local[i]] if (local is not None and c.layout.B) else None
            loss = fn.loss(parts, x[i][keep], y[i][keep], w[i][keep], bufs, None if bias is None else bias[i])
            gi = torch.autograd.grad(loss, list(parts.values()))
            c.layout.write(g[i:i + 1], dict(zip(parts, (t[None] for t in gi))))
            ls.append(loss.detach())
        return g, torch.stack(ls)


def _grads_bn(c: Clients, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              local: np.ndarray, bias: torch.Tensor | None,
              valid: torch.Tensor | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Batched gradients of a BatchNorm model: rows grouped by how many real
    samples their batch holds (a prefix of it), so that each client's batch
    statistics, as in the loop, cover its real samples only; each client's
    running statistics (``c.buffers``) are updated in place, as the loop's."""
    keep = valid if valid is not None else w > 0
    n_real = keep.sum(1).cpu().numpy()
    m = params.shape[0]
    blocks = [torch.empty(m, *p.shape, dtype=params.dtype, device=params.device) for p in c.layout.params]
    loss = torch.empty(m, dtype=params.dtype, device=params.device)
    fn = c.functional
    for n in np.unique(n_real):
        at = np.flatnonzero(n_real == n)
        ti = torch.as_tensor(at, device=params.device)
        n = int(n)
        sel = rows_selector(np.asarray(local)[at], c.device)
        # one contiguous tensor per buffer: BatchNorm's in-place running-statistics
        # update under vmap reaches those, not strided column views of the flat rows
        views = {k: v.clone() for k, v in c.layout.buffer_parts(c.buffers[sel]).items()}
        leaves = {k: v[ti].detach().requires_grad_(True) for k, v in c.layout.parts(params).items()}
        args = (leaves, x[ti, :n], y[ti, :n], w[ti, :n], views)
        lo = fn.vloss_bufs(*args) if bias is None else fn.vloss_bufs_bias(*args, bias[ti])
        for blk, gb in zip(blocks, torch.autograd.grad(lo.sum(), list(leaves.values()))):
            blk[ti] = gb
        loss[ti] = lo.detach()
        c.buffers[sel] = torch.cat([v.reshape(len(at), -1) for v in views.values()], 1)
    return blocks, loss


def grad_blocks(c: Clients, m: int) -> list[torch.Tensor]:
    """Per-parameter gradient blocks ``[m, *shape]``, reused across steps: a fresh
    multi-MB result tensor per step costs more in page faults and in MKL's
    handling of it than the matmul that fills it (bench/README.md)."""
    if c.grad_cache is None or c.grad_cache[0].shape[0] < m:
        c.grad_cache = [torch.empty(m, *p.shape, device=c.device) for p in c.layout.params]
    return [b[:m] for b in c.grad_cache]


@torch.no_grad()
def logits(c: Clients, params: torch.Tensor, x: torch.Tensor, local: np.ndarray | None = None) -> torch.Tensor:
    """``[m, b, C]`` outputs of model rows ``params [m, P]`` on inputs ``x [m, b, ...]``
    (evaluation mode; ``local``: the clients whose BatchNorm statistics row i uses)."""
    c.model.eval()
    fn = c.functional
    if c.batched and c.stacked is not None:
        return mlp.stacked_forward(c.stacked, c.layout.parts(params), x)
    if c.batched and c.convnet is not None:
        return grouped_forward(c.convnet, c.layout.parts(params), x)
    if c.batched and c.layout.B and local is not None:
        return fn.vlogits_bufs(params, x, c.buffers[rows_selector(np.asarray(local), c.device)])
    if c.batched:
        return fn.vlogits(params, x)
    out = []
    for i in range(params.shape[0]):
        bufs = c.buffers[local[i]] if (local is not None and c.layout.B) else None
        out.append(fn.logits(params[i], x[i], bufs))
    return torch.stack(out)
