"""Batches: which samples each client's every step takes (:class:`BatchPlan`),
drawn from the client's own random stream, and gathering them into padded
tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from mpifl.data import SPLITS
from mpifl.rng import streams

if TYPE_CHECKING:
    from mpifl.train.view import ClientsView

SPLIT_INDEX = {s: i for i, s in enumerate(SPLITS)}  # column of a split in FederatedData's offsets and sizes


@dataclass
class BatchPlan:
    idx: np.ndarray  # [m, steps, batch] sample indices into the rank's x, -1 = padding

    @property
    def steps(self) -> int:
        return self.idx.shape[1]


def make_plan(c: ClientsView, local: np.ndarray, epochs: int, round: int, purpose: str = "train",
         batch_size: int | None = None, max_batches: int | None = None,
         subsets: list[np.ndarray] | None = None) -> BatchPlan:
    """Each listed client's shuffled batches for ``epochs`` epochs from its own stream.

    ``subsets``: per listed client, the sample indices (into the rank's ``x``)
    an epoch runs over instead of the client's whole training split."""
    bs = batch_size or c.cfg.batch_size
    local = np.asarray(local, np.int64)
    if subsets is None:
        lo, n = c.offsets[local, SPLIT_INDEX["train"]], c.sizes[local, SPLIT_INDEX["train"]]
    else:
        pools = [np.asarray(p, np.int64) for p in subsets]
        n = np.array([len(p) for p in pools], np.int64)
    # BatchNorm cannot normalise a batch of one sample in training mode: such a
    # sample sits each epoch out (the next epoch reshuffles)
    drop = (n % bs == 1) & (n > bs) if c.bn else np.zeros(len(n), bool)
    per_epoch = -(-n // bs) - drop  # batches an epoch keeps
    steps = np.minimum(epochs * per_epoch, max_batches) if max_batches else epochs * per_epoch
    m, S = len(local), int(steps.max(initial=0))
    # epoch e of client i fills batches [e * per_epoch, (e + 1) * per_epoch) of its
    # row with the first cnt[i, e] entries of one permutation (the last batch short)
    start = np.arange(epochs)[None, :] * per_epoch[:, None] * bs + np.arange(m)[:, None] * S * bs
    cnt = np.clip(np.minimum((n - drop)[:, None], (steps + np.arange(m) * S)[:, None] * bs - start), 0, None)
    perms = []
    for i, g in enumerate(streams(c.seed, round, c.ids[local], purpose)):
        ni = int(n[i])
        for k in cnt[i].tolist():  # one permutation per epoch, in order, from the client's stream
            if k == 0:
                break
            perms.append(g.permutation(ni)[:k])
    idx = np.full((m, S, bs), -1, np.int64)
    if perms:
        k = cnt.reshape(-1)
        pos = np.repeat(start.reshape(-1) - (np.cumsum(k) - k), k) + np.arange(k.sum())
        vals = np.concatenate(perms)
        if subsets is None:
            vals += np.repeat(lo, cnt.sum(1))
        else:
            vals = np.concatenate(pools)[vals + np.repeat(np.cumsum(n) - n, cnt.sum(1))]
        idx.reshape(-1)[pos] = vals
    return BatchPlan(idx)


def gather(c: ClientsView, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A padded index array -> the clients' samples (x, y, w) with w = 0 on padding."""
    valid = idx >= 0
    # masks made by numpy, and index_select/take rather than advanced indexing:
    # these small ops cost 2-5x less so on the CPU
    t = torch.as_tensor(np.where(valid, idx, 0), device=c.device)
    w = torch.from_numpy(valid.astype(np.float32)).to(c.device)
    x = c.x.index_select(0, t.view(-1)).view(*t.shape, *c.x.shape[1:])
    return x, c.y.take(t), w
