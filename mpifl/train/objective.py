"""How an algorithm changes local training: extra closed-form terms of the loss
(:class:`Objective`) or a whole optimisation step of its own (:data:`StepFn`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from mpifl.train.layout import Layout

if TYPE_CHECKING:
    from mpifl.train.clients import Clients


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


# A custom optimisation step for :meth:`Clients.train`: (clients, selector of the
# rows, their local positions, x, y, w) -> their losses [m]; it updates the rows
# (storing them back with :func:`mpifl.train.rows.write_back`)
StepFn = Callable[["Clients", "slice | torch.Tensor", np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor],
                  torch.Tensor]
