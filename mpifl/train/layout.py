"""Where each parameter and float buffer of a model sits in a flat row.

Every walk over a row's parameters (per-parameter views of rows, writing
per-parameter gradients back into rows, binding a module to a row, a named
parameter's columns) takes its slices from :class:`Layout`, which computes them
once from the model.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn


class Part(NamedTuple):
    """One parameter (or buffer) of the model inside a flat row."""

    name: str
    shape: torch.Size
    size: int  # number of entries
    cols: slice  # its columns in the row


def _parts(named: list[tuple[str, torch.Tensor]]) -> list[Part]:
    out, o = [], 0
    for name, t in named:
        out.append(Part(name, t.shape, t.numel(), slice(o, o + t.numel())))
        o += t.numel()
    return out


class Layout:
    """The model's parameters (``params``) and float buffers (``buffers``, e.g.
    BatchNorm's running statistics) laid out one after another in a row of
    ``P`` (``B``) entries, in ``named_parameters`` (``named_buffers``) order."""

    def __init__(self, model: nn.Module):
        self.params = _parts(list(model.named_parameters()))
        self.buffers = _parts([(n, b) for n, b in model.named_buffers() if b.is_floating_point()])
        self.P = sum(p.size for p in self.params)
        self.B = sum(b.size for b in self.buffers)
        self.names = [p.name for p in self.params]
        self.cols = [p.cols for p in self.params]

    @staticmethod
    def _views(flat: torch.Tensor, parts: list[Part]) -> dict[str, torch.Tensor]:
        return {p.name: flat[p.cols].view(p.shape) for p in parts}

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-parameter views of one row ``[P]`` (no copy)."""
        return self._views(flat, self.params)

    def unflatten_buffers(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-buffer views of one buffer row ``[B]`` (no copy)."""
        return self._views(flat, self.buffers)

    def parts(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-parameter views ``[m, *shape]`` of rows ``[m, P]`` (no copy)."""
        m = rows.shape[0]
        return {p.name: rows[:, p.cols].view(m, *p.shape) for p in self.params}

    def buffer_parts(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-buffer views ``[m, *shape]`` of buffer rows ``[m, B]`` (no copy)."""
        m = rows.shape[0]
        return {b.name: rows[:, b.cols].view(m, *b.shape) for b in self.buffers}

    def write(self, out: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        """Write per-parameter tensors ``[m, *shape]`` into rows ``out [m, P]``."""
        for p in self.params:
            out[:, p.cols] = parts[p.name].reshape(out.shape[0], p.size)

    def flatten(self, model: nn.Module) -> torch.Tensor:
        """The model's parameters as one float32 row ``[P]``."""
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).float()

    def flatten_buffers(self, model: nn.Module) -> torch.Tensor:
        """The model's float buffers as one float32 row ``[B]``."""
        bufs = [b.detach().reshape(-1).float() for _, b in model.named_buffers() if b.is_floating_point()]
        return torch.cat(bufs) if bufs else torch.zeros(0)

    def slices(self, names: list[str]) -> list[slice]:
        """Row slices of the named parameters (e.g. a classifier head), in layout order."""
        return [p.cols for p in self.params if p.name in names]
