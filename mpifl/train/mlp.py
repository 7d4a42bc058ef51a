"""Plain MLPs (Flatten / Linear / ReLU) of many clients at once, by batched
matmuls over their stacked weights: the forward and a hand-written backward.

vmap's linear puts each weight gradient in transposed layout, and applying it to
the row-major rows then costs a strided pass as long as the matmuls; these
kernels keep every weight in the rows' own ``[m, out, in]`` layout instead.
:class:`StackedMLP` is the engine (:class:`~mpifl.train.engine.Engine`) that runs
them.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import torch
from torch import nn

from mpifl.train.layout import Layout
from mpifl.train.loss import cross_entropy

F = torch.nn.functional


def stacked_mlp(model: nn.Module) -> list[tuple[str, ...]] | None:
    """The layers of an ``nn.Sequential`` of Flatten / Linear / ReLU, or None.

    Such models (the MLPs) train through :func:`stacked_forward` instead of vmap."""
    if not isinstance(model, nn.Sequential):
        return None
    ops: list[tuple[str, ...]] = []
    for name, mod in model.named_children():
        if isinstance(mod, nn.Linear):
            ops.append(("linear", f"{name}.weight", f"{name}.bias" if mod.bias is not None else ""))
        elif isinstance(mod, nn.ReLU):
            ops.append(("relu",))
        elif isinstance(mod, nn.Flatten) and mod.start_dim == 1 and mod.end_dim == -1:
            ops.append(("flatten",))
        else:
            return None
    return ops


def stacked_forward(ops: list[tuple[str, ...]], p: dict[str, torch.Tensor], x: torch.Tensor,
                    keep: list[torch.Tensor] | None = None) -> torch.Tensor:
    """``[m, b, C]`` logits of m MLPs (weights ``[m, out, in]``) on ``x [m, b, ...]``;
    ``keep`` collects each layer's input (what the backward needs)."""
    m, b = x.shape[:2]
    h = x.reshape(m, b, -1)
    for op in ops:
        if op[0] == "linear":
            if keep is not None:
                keep.append(h)
            wt = p[op[1]].transpose(1, 2)
            h = torch.baddbmm(p[op[2]].unsqueeze(1), h, wt) if op[2] else torch.bmm(h, wt)
        elif op[0] == "relu":
            h = torch.relu(h)
            if keep is not None:
                keep.append(h)
        # flatten: inputs were flattened above, and Flatten comes first in an MLP
    return h


def shared_forward(ops: list[tuple[str, ...]], p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``[B, C]`` logits of one MLP (per-parameter tensors ``p``) on ``x [B, ...]``.

    The calls ``nn.Linear`` and ``nn.ReLU`` make, so the bits of the module's own
    forward, without ``functional_call``'s swap of the module's parameters (half
    of an evaluation's time for the N = 100 MLP of bench/README.md)."""
    h = x.reshape(x.shape[0], -1)
    for op in ops:
        if op[0] == "linear":
            h = F.linear(h, p[op[1]], p[op[2]] if op[2] else None)
        elif op[0] == "relu":
            h = F.relu(h)
    return h


def stacked_grads(ops: list[tuple[str, ...]], p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                  w: torch.Tensor, out: list[torch.Tensor], sgd: tuple[float, float] | None = None,
                  bias: torch.Tensor | None = None,
                  frozen: Collection[str] = ()) -> tuple[list[torch.Tensor | None], torch.Tensor]:
    """Loss ``[m]`` (weighted mean CE per row, :func:`~mpifl.train.loss.cross_entropy`'s
    closed form) of m MLPs and its gradient, written into ``out`` (per-parameter
    blocks ``[m, *shape]`` in ``p``'s order), by a hand-written backward:
    ``dW = dz^T h`` lands in the rows' own ``[m, out, in]`` layout through
    ``bmm(out=)`` with no autograd graph and no fresh gradient tensors.

    ``sgd = (lr, weight_decay)``: plain SGD is applied here, to the weight blocks as
    ``W <- (1 - lr wd) W - lr dz^T h`` in one ``baddbmm_``, to the biases by
    :meth:`~mpifl.train.optimizer.RowOptimizer.step_`'s own two in-place ops, and
    their entries in the returned list are None. No weight
    gradient is stored and read back: 7% less time per call at 128 clients on one
    thread, although torch runs an in-place baddbmm_ into rows of the [n, P]
    parameters (not contiguous) client by client, which is why the caller fuses on
    one thread only (bench/README.md).

    ``frozen``: parameter names whose gradient is not wanted (None in the list):
    their matmuls are skipped, and the backward stops below the lowest layer that
    still trains (FedRep's head epochs: the last layer's gradient alone). What is
    computed is computed by the same kernels, so the other blocks keep their bits."""
    keep: list[torch.Tensor] = []
    logits = stacked_forward(ops, p, x, keep)
    loss, dz = cross_entropy(logits, y, w, bias=bias, grad=True)
    grad: dict[str, torch.Tensor | None] = {k: None if k in frozen else o for k, o in zip(p, out)}
    # linear layers at or below each position that still train: the backward goes on while one does
    trains = [op[0] == "linear" and any(k and k not in frozen for k in op[1:]) for op in ops]
    below = [any(trains[:i]) for i in range(len(ops))]
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if not trains[i] and not below[i]:
            break
        if op[0] == "linear":
            h, W = keep.pop(), p[op[1]]
            if op[2] and op[2] not in frozen:
                gb = torch.sum(dz, 1, out=grad[op[2]])
                if sgd is not None:  # the bias's SGD step here too (no layer below reads it): step_'s ops
                    lr, wd = sgd
                    b = p[op[2]]
                    if wd:
                        gb.add_(b, alpha=wd)
                    b.add_(gb, alpha=-lr)
                    grad[op[2]] = None
            dz_in = torch.bmm(dz, W) if below[i] else None  # the lowest training layer's input gradient is not needed
            if op[1] in frozen:
                pass  # no weight gradient wanted
            elif sgd is not None:
                lr, wd = sgd
                W.baddbmm_(dz.transpose(1, 2), h, beta=1 - lr * wd, alpha=-lr)
                grad[op[1]] = None
            else:
                torch.bmm(dz.transpose(1, 2), h, out=grad[op[1]])
            dz = dz_in
        elif op[0] == "relu":
            # ReLU's own backward kernel: 7x faster here than dz * (h > 0), whose
            # bool mask and its conversion are unvectorised on CPU
            dz = torch.ops.aten.threshold_backward(dz, keep.pop(), 0)
    return list(grad.values()), loss


class StackedMLP:
    """The batched engine of a plain MLP (:func:`stacked_mlp`'s layers; no
    buffers): :func:`stacked_forward` and :func:`stacked_grads`."""

    batched = True

    def __init__(self, model: nn.Module, layout: Layout, ops: list[tuple[str, ...]], device: torch.device):
        self.model, self.layout, self.ops, self.device = model, layout, ops, device
        self.cache: list[torch.Tensor] | None = None  # the gradient blocks, reused (blocks)

    def blocks(self, m: int) -> list[torch.Tensor]:
        """Per-parameter gradient blocks ``[m, *shape]``, reused across steps: a fresh
        multi-MB result tensor per step costs more in page faults and in MKL's
        handling of it than the matmul that fills it (bench/README.md)."""
        if self.cache is None or self.cache[0].shape[0] < m:
            self.cache = [torch.empty(m, *p.shape, device=self.device) for p in self.layout.params]
        return [b[:m] for b in self.cache]

    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              buffers: torch.Tensor, local: np.ndarray | None = None, bias: torch.Tensor | None = None,
              valid: torch.Tensor | None = None, frozen: Collection[str] = (),
              sgd: tuple[float, float] | None = None) -> tuple[list[torch.Tensor | None], torch.Tensor]:
        """``sgd``: apply plain SGD in the backward (:func:`stacked_grads`)."""
        with torch.no_grad():  # Linear/ReLU only: no train mode
            if _alone(params, sgd):
                pad = (params, x, y, w) if bias is None else (params, x, y, w, bias)
                params, x, y, w, *b = (torch.cat([t, torch.zeros_like(t)]) for t in pad)
                g, loss = stacked_grads(self.ops, self.layout.parts(params), x, y, w, self.blocks(2), None,
                                        bias=b[0] if b else None, frozen=frozen)
                return [None if t is None else t[:1] for t in g], loss[:1]
            return stacked_grads(self.ops, self.layout.parts(params), x, y, w, self.blocks(params.shape[0]), sgd,
                                 bias=bias, frozen=frozen)

    @torch.no_grad()
    def logits(self, params: torch.Tensor, x: torch.Tensor, buffers: torch.Tensor,
               local: np.ndarray | None = None) -> torch.Tensor:
        if self.model.training:  # a walk over the modules per call, where DPFL scores thousands of pairs a round
            self.model.eval()
        if _alone(params):
            return stacked_forward(self.ops, self.layout.parts(torch.cat([params, torch.zeros_like(params)])),
                                   torch.cat([x, torch.zeros_like(x)]))[:1]
        return stacked_forward(self.ops, self.layout.parts(params), x)


def _alone(params: torch.Tensor, sgd: tuple[float, float] | None = None) -> bool:
    """One client's rows on several CPU threads: its matrix products would be single
    GEMMs, which MKL splits across the threads along the summed dimension, where a
    batch of two or more runs each product whole on one thread. Such a client is run
    beside a zero second one, so that its bits do not depend on whether it steps
    alone (alone on its rank, or the only one with a batch left) or with others.
    The fused SGD step runs on one thread only, and one thread needs no padding."""
    return params.shape[0] == 1 and sgd is None and params.device.type == "cpu" and torch.get_num_threads() > 1
