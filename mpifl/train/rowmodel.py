"""Logits and gradients of a block of client rows through the template model as
a function of a row (:class:`RowModel`), and the two engines
(:class:`~mpifl.train.engine.Engine`) that run it: :class:`Vmap`, all rows at once
through ``torch.func.vmap`` over ``functional_call`` (a BatchNorm model with each
client's running statistics riding along as a vmapped buffer row), and
:class:`RowByRow`, one row at a time. Nothing here updates parameters; only
BatchNorm's running statistics (``Clients.buffers``) advance, as in training.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from mpifl.train.layout import Layout
from mpifl.train.loss import cross_entropy
from mpifl.train.rows import rows_selector


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


def autograd_blocks(layout: Layout, params: torch.Tensor, frozen: Collection[str],
                    loss_of: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> tuple[list[torch.Tensor | None],
                                                                                       torch.Tensor]:
    """Per-parameter gradient blocks (None where ``frozen``) and the losses ``[m]``
    of ``loss_of`` on per-parameter leaves of rows ``params``.

    Differentiate with respect to per-parameter views, not the flat row: the
    backward of slicing a flat row materialises a zero ``[m, P]`` tensor per
    parameter tensor, which cost more than the model's own matmuls. The forward
    is batched and plain autograd takes the gradient of the sum of the per-client
    losses (client i's loss depends on row i alone), cheaper than functorch's
    grad transform."""
    leaves = {k: v.detach().requires_grad_(k not in frozen) for k, v in layout.parts(params).items()}
    loss = loss_of(leaves)
    want = [k for k in leaves if k not in frozen]
    got: dict[str, torch.Tensor | None] = dict.fromkeys(leaves)
    if want:
        got.update(zip(want, torch.autograd.grad(loss.sum(), [leaves[k] for k in want])))
    return list(got.values()), loss.detach()


class Vmap:
    """The batched engine of any model: ``torch.func.vmap`` over :class:`RowModel`;
    a BatchNorm model with each client's running statistics."""

    batched = True

    def __init__(self, fn: RowModel):
        self.fn = fn

    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              buffers: torch.Tensor, local: np.ndarray | None = None, bias: torch.Tensor | None = None,
              valid: torch.Tensor | None = None,
              frozen: Collection[str] = ()) -> tuple[list[torch.Tensor | None], torch.Tensor]:
        """Per-parameter blocks; a BatchNorm model computes every block."""
        fn = self.fn
        fn.model.train()
        with torch.enable_grad():
            if fn.layout.B and local is not None:
                return _grads_bn(fn, params, x, y, w, buffers, local, bias, valid)
            return autograd_blocks(fn.layout, params, frozen, lambda leaves: fn.vloss(leaves, x, y, w) if bias is None
                                   else fn.vloss_bias(leaves, x, y, w, None, bias))

    @torch.no_grad()
    def logits(self, params: torch.Tensor, x: torch.Tensor, buffers: torch.Tensor,
               local: np.ndarray | None = None) -> torch.Tensor:
        fn = self.fn
        fn.model.eval()
        if fn.layout.B and local is not None:
            return fn.vlogits_bufs(params, x, buffers[rows_selector(np.asarray(local), buffers.device)])
        return fn.vlogits(params, x)


class RowByRow:
    """The unbatched engine: :class:`RowModel` on one row at a time (the batches'
    real samples only); a flat gradient."""

    batched = False

    def __init__(self, fn: RowModel):
        self.fn = fn

    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              buffers: torch.Tensor, local: np.ndarray | None = None, bias: torch.Tensor | None = None,
              valid: torch.Tensor | None = None,
              frozen: Collection[str] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Every block is computed, ``frozen`` or not."""
        fn, layout = self.fn, self.fn.layout
        fn.model.train()
        g = torch.empty(params.shape[0], layout.P, dtype=params.dtype, device=params.device)
        ls = []
        with torch.enable_grad():
            for i in range(params.shape[0]):
                keep = valid[i] if valid is not None else w[i] > 0
                parts = {k: v[0].detach().requires_grad_(True) for k, v in layout.parts(params[i:i + 1]).items()}
                bufs = buffers[local[i]] if (local is not None and layout.B) else None
                loss = fn.loss(parts, x[i][keep], y[i][keep], w[i][keep], bufs, None if bias is None else bias[i])
                gi = torch.autograd.grad(loss, list(parts.values()))
                layout.write(g[i:i + 1], dict(zip(parts, (t[None] for t in gi))))
                ls.append(loss.detach())
        return g, torch.stack(ls)

    @torch.no_grad()
    def logits(self, params: torch.Tensor, x: torch.Tensor, buffers: torch.Tensor,
               local: np.ndarray | None = None) -> torch.Tensor:
        fn = self.fn
        fn.model.eval()
        out = []
        for i in range(params.shape[0]):
            bufs = buffers[local[i]] if (local is not None and fn.layout.B) else None
            out.append(fn.logits(params[i], x[i], bufs))
        return torch.stack(out)


def _grads_bn(fn: RowModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              buffers: torch.Tensor, local: np.ndarray, bias: torch.Tensor | None,
              valid: torch.Tensor | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Batched gradients of a BatchNorm model: rows grouped by how many real
    samples their batch holds (a prefix of it), so that each client's batch
    statistics, as in the loop, cover its real samples only; each client's
    running statistics (rows ``local`` of ``buffers``) are updated in place, as the loop's."""
    keep = valid if valid is not None else w > 0
    n_real = keep.sum(1).cpu().numpy()
    m = params.shape[0]
    layout = fn.layout
    blocks = [torch.empty(m, *p.shape, dtype=params.dtype, device=params.device) for p in layout.params]
    loss = torch.empty(m, dtype=params.dtype, device=params.device)
    for n in np.unique(n_real):
        at = np.flatnonzero(n_real == n)
        ti = torch.as_tensor(at, device=params.device)
        n = int(n)
        sel = rows_selector(np.asarray(local)[at], buffers.device)
        # one contiguous tensor per buffer: BatchNorm's in-place running-statistics
        # update under vmap reaches those, not strided column views of the flat rows
        views = {k: v.clone() for k, v in layout.buffer_parts(buffers[sel]).items()}
        leaves = {k: v[ti].detach().requires_grad_(True) for k, v in layout.parts(params).items()}
        args = (leaves, x[ti, :n], y[ti, :n], w[ti, :n], views)
        lo = fn.vloss_bufs(*args) if bias is None else fn.vloss_bufs_bias(*args, bias[ti])
        for blk, gb in zip(blocks, torch.autograd.grad(lo.sum(), list(leaves.values()))):
            blk[ti] = gb
        loss[ti] = lo.detach()
        buffers[sel] = torch.cat([v.reshape(len(at), -1) for v in views.values()], 1)
    return blocks, loss
