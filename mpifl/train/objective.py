"""How an algorithm changes local training: extra closed-form terms of the loss
(:class:`Objective`) or a whole optimisation step of its own (:class:`Step`, which
works on a :class:`StepView` of the rows it updates)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from mpifl.train.layout import Layout
from mpifl.train.rows import ClientRows, flat, read_rows, write_back

if TYPE_CHECKING:
    from mpifl.train.optimizer import RowOptimizer
    from mpifl.train.view import ClientsView


@dataclass
class Objective:
    """What a training call optimises besides each client's weighted cross-entropy:
    terms whose gradient is known in closed form, so every training path (stacked
    MLP, vmap, per-client loop) keeps its own forward and backward.

    - ``prox_center``/``prox_mu``: the proximal term (mu/2) ||w_i - c_i||^2 of
      FedProx and Ditto (gradient mu (w_i - c_i)); ``c`` is one ``[P]`` row for every
      client or ``[n_local, P]`` rows indexed like the rank's clients.
    - ``frozen``: parameter names whose values the optimizer leaves alone (FedRep's
      body while its head trains, and the reverse).
    - ``logit_bias``: ``[n_local, C]`` added to client i's logits inside the loss
      (FedRoD's balanced softmax: the log of its label prior).
    - ``sample_weight``: ``[n_samples]`` loss weights v indexed like the rank's
      samples (``Clients.x``): a batch's loss becomes ``sum_b v_b l_b / n`` with n its
      number of samples (FedEM's responsibility-weighted M-step), not a weighted
      mean, so the weights scale the step; all ones is plain training.
    """

    prox_center: torch.Tensor | None = None
    prox_mu: float = 0.0
    frozen: Sequence[str] = ()
    logit_bias: torch.Tensor | None = None
    sample_weight: torch.Tensor | None = None

    @property
    def active(self) -> bool:
        """Whether it changes anything: an inactive one (mu = 0, nothing frozen, no
        bias, no sample weights) trains exactly as no objective, on the same
        (possibly fused) path."""
        return bool((self.prox_mu and self.prox_center is not None) or self.frozen or self.logit_bias is not None
                    or self.sample_weight is not None)

    def bias(self, rows: np.ndarray) -> torch.Tensor | None:
        return None if self.logit_bias is None else self.logit_bias[torch.as_tensor(rows)]

    def apply(self, layout: Layout, p: torch.Tensor, g: torch.Tensor | list[torch.Tensor | None],
              rows: np.ndarray) -> list[torch.Tensor | None]:
        """The gradient of rows ``p`` ([m, P], the clients ``rows``) with the extra
        terms added, as per-parameter blocks (None: left alone)."""
        if torch.is_tensor(g):
            g = list(layout.parts(g).values())
        out: list[torch.Tensor | None] = []
        center = None
        if self.prox_mu and self.prox_center is not None:
            pc = self.prox_center
            center = layout.parts(pc.expand(len(rows), -1) if pc.dim() == 1
                                  else pc[torch.as_tensor(rows, device=pc.device)])
        for part, gb, pb in zip(layout.params, g, layout.parts(p).values()):
            if part.name in self.frozen or gb is None:
                out.append(None)
                continue
            if center is not None:
                gb.add_(pb.view(gb.shape) - center[part.name].view(gb.shape), alpha=self.prox_mu)
            out.append(gb)
        return out


class StepView:
    """The rows one custom step updates, for one batch of a block of clients
    (``rows``: their local positions, ``sel``: their selector): the clients'
    parameters (:attr:`params`) and the rows of the step's own per-client state
    (``view[name]``; a dict's tensors as ``view["name/key"]``). Each is read once, a
    view when the rows are contiguous, else a copy, which is why the step updates
    them in place; :meth:`store` writes the copies back after the step."""

    def __init__(self, clients: ClientsView, sel: slice | torch.Tensor, rows: np.ndarray,
                 state: dict[str, ClientRows]):
        self.clients, self.sel, self.rows = clients, sel, rows
        self._of = {"params": clients.params, **flat(state)}
        self._read: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._read:
            self._read[name] = read_rows(self._of[name], self.sel)
        return self._read[name]

    @property
    def params(self) -> torch.Tensor:
        """``[m, P]`` the stepping clients' parameter rows."""
        return self["params"]

    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradient ``[m, P]`` and loss ``[m]`` of rows ``params`` of these clients
        (their BatchNorm statistics) on a batch (:meth:`Clients.grads`)."""
        return self.clients.grads(params, x, y, w, self.rows, bias)

    def step_(self, p: torch.Tensor, g: torch.Tensor, lr: float | None = None,
              opt: RowOptimizer | None = None) -> None:
        """An optimizer step of rows ``p`` read from this view, by ``opt`` (default:
        the clients' own, on their optimizer state) on its state's rows ``sel``."""
        (opt or self.clients.opt).step_(self.sel, p, g, lr)

    def store(self) -> None:
        for name, v in self._read.items():
            write_back(self._of[name], self.sel, v)


@dataclass
class Step:
    """A whole optimisation step of the algorithm's own, replacing the gradient
    step of :meth:`Clients.train` on the same batches, chunks and non-finite
    handling (methods whose update is not a gradient step on one loss: APFL,
    Per-FedAvg, FedRoD...).

    ``fn(view, x, y, w)`` updates the rows of its :class:`StepView` in place and
    returns their losses ``[m]``. ``state``: the per-client tensors it updates
    besides the clients' parameters and optimizer state (``[n_local, ...]`` rows
    indexed like the clients, or a dict of such: another optimizer's state); the
    view reads and stores their rows, and an update dropped as non-finite
    (``train.on_nonfinite=skip``) puts their rows back with the parameters'."""

    fn: Callable[[StepView, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    state: dict[str, ClientRows] = field(default_factory=dict)
