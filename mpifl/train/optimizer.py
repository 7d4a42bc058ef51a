"""SGD (momentum, weight decay) and Adam applied to stacked parameter rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .rows import write_back

if TYPE_CHECKING:  # a type hint only: the config package sits above this package
    from ..config import TrainConfig


class RowOptimizer:
    """SGD (momentum, weight decay) and Adam applied to stacked parameter rows.

    State is one row per client, so a batched step over many clients and a
    sequential step over one client run the same arithmetic.
    """

    def __init__(self, cfg: TrainConfig, n: int, P: int, device: torch.device,
                 cols: Sequence[slice] | None = None):
        self.cfg = cfg
        self.kind = cfg.optimizer
        self.cols = cols  # columns of each parameter block of a row, in layout order (Layout.cols)
        self.P, self.device = P, device
        self.state: dict[str, torch.Tensor] = self.fresh_state(n)

    def fresh_state(self, n: int) -> dict[str, torch.Tensor]:
        """Zero optimizer state for ``n`` rows (e.g. an algorithm's extra rows)."""
        if self.kind == "adam":
            return {"m": torch.zeros(n, self.P, device=self.device), "v": torch.zeros(n, self.P, device=self.device),
                    "t": torch.zeros(n, 1, device=self.device)}
        if self.cfg.momentum > 0:
            return {"buf": torch.zeros(n, self.P, device=self.device)}
        return {}

    def reset(self, sel=slice(None)) -> None:
        for t in self.state.values():
            t[sel] = 0

    def fused_sgd(self) -> tuple[float, float] | None:
        """(lr, weight_decay) when the update is plain SGD, which a gradient kernel
        can apply itself (W <- (1 - lr wd) W - lr g) with no gradient stored."""
        return (self.cfg.lr, self.cfg.weight_decay) if self.kind == "sgd" and not self.state else None

    def step(self, sel, p: torch.Tensor, g: torch.Tensor, lr: float | None = None) -> torch.Tensor:
        """Return the updated rows ``p`` (rows ``sel`` of the state are updated)."""
        q = p.clone()
        self.step_(sel, q, g.clone(), lr)
        return q

    def step_(self, sel, p: torch.Tensor, g: torch.Tensor | list[torch.Tensor | None], lr: float | None = None) -> None:
        """Update rows ``p`` ``[m, P]`` in place (a view of the parameters or a copy)
        and rows ``sel`` of the state.

        ``g``: the gradient ``[m, P]``, or per-parameter blocks ``[m, ...]`` in layout
        order (what batched training produces: no flat copy needed; needs ``cols``),
        None for a block already updated (:meth:`fused_sgd`); overwritten. The
        in-place kernels are those of ``torch.optim`` (SGD: ``buf.mul_(m).add_(g)``,
        ``p.add_(buf, alpha=-lr)``) and allocate no fresh ``[m, P]`` tensors.
        """
        c = self.cfg
        lr = c.lr if lr is None else lr
        m = p.shape[0]
        if torch.is_tensor(g):
            blocks = [(slice(None), g)]
        else:
            # autograd may return transposed blocks: view the rows in each block's
            # shape rather than copying the block into the rows' layout
            assert self.cols is not None, "per-parameter gradient blocks need the layout's columns"
            blocks = [(cols, gi) for cols, gi in zip(self.cols, g) if gi is not None]
        state = {k: v[sel] for k, v in self.state.items()}  # views when sel is a slice
        if self.kind == "adam":
            b1, b2, eps = 0.9, 0.999, 1e-8
            t = state["t"].add_(1)
            c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        for cols, gb in blocks:
            pb = p[:, cols].view(gb.shape)
            if c.weight_decay:
                gb.add_(pb, alpha=c.weight_decay)
            if self.kind == "adam":
                mb, vb = state["m"][:, cols].view(gb.shape), state["v"][:, cols].view(gb.shape)
                mb.mul_(b1).add_(gb, alpha=1 - b1)
                vb.mul_(b2).addcmul_(gb, gb, value=1 - b2)
                ones = (1,) * (gb.dim() - 1)  # per-row bias corrections against this block
                pb.addcdiv_(mb / c1.view(m, *ones), (vb / c2.view(m, *ones)).sqrt_().add_(eps), value=-lr)
            elif "buf" in state:
                bb = state["buf"][:, cols].view(gb.shape)
                bb.mul_(c.momentum).add_(gb)
                pb.add_(bb, alpha=-lr)
            else:
                pb.add_(gb, alpha=-lr)
        for k, v in state.items():
            write_back(self.state[k], sel, v)
