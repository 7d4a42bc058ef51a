"""SGD (momentum, weight decay) and Adam applied to stacked parameter rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mpifl.schema import TrainConfig
from mpifl.train.rows import read_rows, write_back


class RowOptimizer:
    """SGD (momentum, weight decay) and Adam applied to stacked parameter rows.

    State is one row per client, so a batched step over many clients and a
    sequential step over one client run the same arithmetic.
    """

    def __init__(self, cfg: TrainConfig, n: int, P: int, device: torch.device,
                 cols: Sequence[slice] | None = None, state: dict[str, torch.Tensor] | None = None):
        """``state``: existing rows of state to step (an algorithm's extra rows'),
        else a fresh one for ``n`` rows."""
        self.cfg = cfg
        self.kind = cfg.optimizer
        self.cols = cols  # columns of each parameter block of a row, in layout order (Layout.cols)
        self.P, self.device = P, device
        self.state: dict[str, torch.Tensor] = self.fresh_state(n) if state is None else state

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
        ``p.add_(buf, alpha=-lr)``; Adam: its fused kernel, :func:`_adam_`) and
        allocate no fresh ``[m, P]`` tensors.
        """
        c = self.cfg
        lr = c.lr if lr is None else lr
        if torch.is_tensor(g):
            # Adam goes block by block whatever the gradient's form (see _adam_)
            blocks = [(cols, g[:, cols]) for cols in self.cols] if self.kind == "adam" and self.cols \
                else [(slice(None), g)]
        else:
            # autograd may return transposed blocks: view the rows in each block's
            # shape rather than copying the block into the rows' layout
            assert self.cols is not None, "per-parameter gradient blocks need the layout's columns"
            blocks = [(cols, gi) for cols, gi in zip(self.cols, g) if gi is not None]
        state = {k: read_rows(v, sel) for k, v in self.state.items()}  # views when sel is a slice
        if self.kind == "adam":
            _adam_(p, state, blocks, lr, c.weight_decay)
        else:
            for cols, gb in blocks:
                pb = p[:, cols].view(gb.shape)
                if c.weight_decay:
                    gb.add_(pb, alpha=c.weight_decay)
                if "buf" in state:
                    bb = state["buf"][:, cols].view(gb.shape)
                    bb.mul_(c.momentum).add_(gb)
                    pb.add_(bb, alpha=-lr)
                else:
                    pb.add_(gb, alpha=-lr)
        for k, v in state.items():
            write_back(self.state[k], sel, v)


def _adam_(p: torch.Tensor, state: dict[str, torch.Tensor], blocks: list[tuple[slice, torch.Tensor]], lr: float,
           weight_decay: float) -> None:
    """Adam (Kingma and Ba, with L2 weight decay added to the gradient) on rows
    ``p`` ``[m, P]`` and their state rows ``m``, ``v``, ``t`` (the step count, one per
    row: clients that joined later have taken fewer steps).

    torch's fused kernel, the update of ``torch.optim.Adam(fused=True)`` (one pass
    over the rows instead of nine elementwise kernels: 0.52 against 2.2 ms a step
    for five 235k-parameter MLP rows on one thread, ``bench/adam_step.py``). It is called
    on one tensor per row and parameter block, so a client's bits depend on its
    own block sizes only, never on how many clients step with it (the kernel's
    vector and scalar tails round differently, and a whole ``[m, P]`` call would
    move where the tails fall)."""
    t = state["t"].add_(1)
    steps = list(t.unbind(0))
    ps: list[torch.Tensor] = []
    gs: list[torch.Tensor] = []
    ms: list[torch.Tensor] = []
    vs: list[torch.Tensor] = []
    for cols, gb in blocks:
        ps += p[:, cols].unbind(0)
        gs += gb.reshape(len(steps), -1).unbind(0)
        ms += state["m"][:, cols].unbind(0)
        vs += state["v"][:, cols].unbind(0)
    torch._fused_adam_(ps, gs, ms, vs, [], steps * len(blocks), lr=lr, beta1=0.9, beta2=0.999,
                       weight_decay=weight_decay, eps=1e-8, amsgrad=False, maximize=False)
