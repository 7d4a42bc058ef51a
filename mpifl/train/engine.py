"""The interface of the four ways a block of client rows computes its logits and
gradients: stacked MLP kernels (:class:`~mpifl.train.mlp.StackedMLP`), grouped
convolutions (:class:`~mpifl.train.grouped.GroupedConv`), ``torch.func.vmap``
(:class:`~mpifl.train.rowmodel.Vmap`, BatchNorm models too) and one row at a time
(:class:`~mpifl.train.rowmodel.RowByRow`). ``Clients.engine`` picks one from
``train.batched`` and the model; the training paths, evaluation and custom steps
call it alike."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import numpy as np
import torch


class Engine(Protocol):
    """Logits and gradients of rows ``params [m, P]``, row i on its batch ``x[i]``.

    ``buffers``: the rank's float buffer rows ``[n_local, B]`` (BatchNorm's running
    statistics); ``local``: the clients whose rows of them row i uses, and in
    training updates in place (none: the template's). Nothing else changes."""

    batched: bool  # all rows at once (False: row by row)

    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              buffers: torch.Tensor, local: np.ndarray | None = None, bias: torch.Tensor | None = None,
              valid: torch.Tensor | None = None,
              frozen: Collection[str] = ()) -> tuple[torch.Tensor | list[torch.Tensor | None], torch.Tensor]:
        """Gradient and loss ``[m]`` (:func:`~mpifl.train.loss.cross_entropy`) of each
        row on its batch ``(x[i], y[i], w[i])``: a flat ``[m, P]`` gradient, or
        per-parameter blocks ``[m, *shape]``. ``bias [m, C]`` is added to row i's
        logits in the loss. ``valid``: the batch's real samples where ``w`` may be
        zero on some of them (per-sample weights), so that BatchNorm sees the whole
        batch. ``frozen``: parameter names whose gradient is not wanted; an engine
        may skip their work and return None for their blocks."""
        ...

    def logits(self, params: torch.Tensor, x: torch.Tensor, buffers: torch.Tensor,
               local: np.ndarray | None = None) -> torch.Tensor:
        """``[m, b, C]`` outputs of the rows on inputs ``x [m, b, ...]``, in evaluation mode."""
        ...
