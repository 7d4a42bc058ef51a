"""Evaluation: each client's loss and accuracy on its own split, in chunks of
clients with padded batches (one model shared by all: its real samples only); no
side effect on training state."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from mpifl.train import grouped, mlp
from mpifl.train.loss import cross_entropy, loss_acc
from mpifl.train.plan import SPLIT_INDEX, gather

if TYPE_CHECKING:
    from mpifl.train.view import ClientsView


def split_index(c: ClientsView, local: np.ndarray, split: str) -> np.ndarray:
    """``[m, n_max]`` indices of each listed client's split samples, -1 padded."""
    s = SPLIT_INDEX[split]
    local = np.asarray(local, np.int64)
    lo, n = c.offsets[local, s].astype(np.int64), c.sizes[local, s].astype(np.int64)
    col = np.arange(int(n.max(initial=0)))
    return np.where(col < n[:, None], lo[:, None] + col, -1)


def clients_per_chunk(c: ClientsView, n_max: int) -> int:
    """Clients evaluated together when each holds up to ``n_max`` samples: the
    gathered inputs are bounded to ~32M floats per forward."""
    feat = int(np.prod(c.x.shape[1:])) if c.x.dim() > 1 else 1
    return max(1, (32 << 20) // max(1, n_max * feat))


def split_batches(c: ClientsView, split: str, local: np.ndarray | None = None
                  ) -> Iterator[tuple[slice, np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every listed client's whole ``split`` in chunks of clients, padded:
    ``(positions in local, idx [m, n_max], x, y, w)`` with w = 0 on padding."""
    local = np.arange(c.n) if local is None else np.asarray(local)
    idx_all = split_index(c, local, split)
    if len(local) == 0 or idx_all.shape[1] == 0:
        return
    step = clients_per_chunk(c, idx_all.shape[1])
    for a in range(0, len(local), step):
        sl = slice(a, min(a + step, len(local)))
        yield (sl, idx_all[sl], *gather(c, idx_all[sl]))


@torch.no_grad()
def shared_logits(c: ClientsView, row: torch.Tensor, x: torch.Tensor, local: np.ndarray,
                  w: torch.Tensor | None = None) -> torch.Tensor:
    """``[m, b, C]`` outputs of one model ``row [P]`` on the listed clients' inputs
    ``x [m, b, ...]`` (a BatchNorm model with each client's own statistics). With
    the samples' weights ``w [m, b]``, padding (``w == 0``) is not evaluated and its
    logits are 0 (:func:`_valid_only`)."""
    if c.layout.B:
        return c.logits(row.expand(len(local), -1).contiguous(), x, local)
    if w is not None:
        return _valid_only(lambda flat: _shared_flat(c, row, flat), x, w)
    return _shared_flat(c, row, x.reshape(-1, *x.shape[2:])).reshape(*x.shape[:2], -1)


def _shared_flat(c: ClientsView, row: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``[n, C]`` outputs of one model ``row [P]`` without BatchNorm on ``flat [n, ...]``."""
    if c.stacked is not None:
        return mlp.shared_forward(c.stacked, c.layout.unflatten(row), flat)
    if c.convnet is not None:
        return grouped.shared_forward(c.convnet, c.layout.unflatten(row), flat)
    c.model.eval()
    return c.functional.logits(row, flat)


@torch.no_grad()
def evaluate(c: ClientsView, split: str, params: torch.Tensor | None = None,
             local: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mean loss, accuracy) per listed client on its own ``split``.

    ``params``: ``[m, P]`` rows (default: the clients' own rows) or one ``[P]``
    model shared by all of them. A BatchNorm model always normalises with the
    evaluated client's own running statistics (``c.buffers``), which are local to
    each client as in FedBN: the template's buffers are never trained.
    """
    local = np.arange(c.n) if local is None else np.asarray(local)
    loss = np.full(len(local), np.nan)
    acc = np.full(len(local), np.nan)
    if len(local) == 0:
        return loss, acc
    if params is None:
        params = c.params[torch.as_tensor(local, device=c.device)]
    elif params.dim() == 1 and c.layout.B:
        params = params.expand(len(local), -1)
    idx_all = split_index(c, local, split)
    if idx_all.shape[1] == 0:
        return loss, acc
    step = clients_per_chunk(c, idx_all.shape[1])
    for a in range(0, len(local), step):
        sl = slice(a, a + step)
        x, y, w = gather(c, idx_all[sl])
        out = shared_logits(c, params, x, local[sl], w) if params.dim() == 1 else c.logits(params[sl], x, local[sl])
        loss[sl], acc[sl] = loss_acc(out, y, w)
    return loss, acc


def scorer(c: ClientsView, split: str, local: np.ndarray) -> Callable[[torch.Tensor], np.ndarray]:
    """The mean loss on ``split`` of model rows ``params [m, P]``, row j scored as
    client ``local[j]`` (``m = len(local)``), with the clients' samples gathered once:
    for scoring many candidate models on the same clients (DPFL's GGC scores two a
    decision, thousands a round). The numbers are :func:`evaluate`'s losses bit for
    bit: the same inputs, forward pass and loss, less the repeated indexing."""
    local = np.asarray(local)
    idx = split_index(c, local, split)
    if idx.shape[1] == 0 or clients_per_chunk(c, idx.shape[1]) < len(local):  # evaluate's own chunking
        return lambda params: evaluate(c, split, params, local)[0]
    x, y, w = gather(c, idx)

    @torch.no_grad()
    def score(params: torch.Tensor) -> np.ndarray:
        return cross_entropy(c.logits(params, x, local), y, w).cpu().numpy()

    return score


def _valid_only(forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``forward`` (one model's ``[n, ...] -> [n, C]``) of the samples of ``x [m, b, ...]``
    where ``w > 0``, the padding's logits zero: the clients' splits differ in size
    (a clustered partition's by a sixth and more), and a sample's logits do not
    depend on the samples beside it on the CPUs measured (bit for bit on AVX2 and
    AMD AVX-512, up to rounding on an Intel AVX-512 one, and in a batch of a few
    samples, which takes other GEMM kernels: docs/reliability.md). Padding has weight 0 in the loss and
    accuracy, so they keep their bits."""
    valid = w > 0
    v = forward(x[valid])
    out = v.new_zeros(*valid.shape, v.shape[-1])
    out[valid] = v
    return out
