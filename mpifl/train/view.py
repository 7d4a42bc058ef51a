"""What train/'s parts read of a rank's clients: the batch planner, the training
loops, evaluation and a custom step's view take a :class:`ClientsView`, which
:class:`mpifl.train.clients.Clients` is. Naming this rather than ``Clients``
keeps them below it: ``Clients`` imports them, none of them imports ``Clients``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import nn

from mpifl.schema import TrainConfig

if TYPE_CHECKING:  # type hints only
    from mpifl.train.engine import Engine
    from mpifl.train.layout import Layout
    from mpifl.train.optimizer import RowOptimizer
    from mpifl.train.rowmodel import RowModel


class ClientsView(Protocol):
    cfg: TrainConfig
    seed: int
    device: torch.device
    model: nn.Module  # the template: its architecture, never its weights
    layout: Layout  # where each parameter and buffer sits in a row
    functional: RowModel
    ids: np.ndarray  # [n] the global ids of this rank's clients
    n: int
    P: int
    x: torch.Tensor  # every local sample, clients one after another
    y: torch.Tensor
    sizes: np.ndarray  # [n, 3] train, val, test samples per client
    offsets: np.ndarray  # where each client's samples start in x
    opt: RowOptimizer
    bn: bool  # the model has BatchNorm layers
    stacked: list[tuple[str, ...]] | None  # the MLP's layers for the stacked engine, else None
    convnet: list | None  # the conv net's layers for the grouped engine, else None
    batched: bool

    @property
    def engine(self) -> Engine: ...

    @property
    def params(self) -> torch.Tensor: ...

    @property
    def buffers(self) -> torch.Tensor: ...

    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              local: np.ndarray | None = None, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        ...

    def logits(self, params: torch.Tensor, x: torch.Tensor, local: np.ndarray | None = None) -> torch.Tensor: ...
