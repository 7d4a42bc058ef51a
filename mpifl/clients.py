"""The clients a rank hosts: one ``[n_local, P]`` parameter matrix, local
training and evaluation through ``torch.func.functional_call`` on its rows.

A model is only a template here: weights live in the rows, so exchanging a
client's model is sending a contiguous row, and many clients train at once with
``torch.func.vmap`` (models without BatchNorm). The per-client loop is the
fallback and the reference; both draw the same batches and apply the same
optimizer arithmetic, so they agree to float tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from .config import TrainConfig
from .data import FederatedData
from .models import has_batchnorm
from .rng import rng

SPLIT_INDEX = {"train": 0, "val": 1, "test": 2}


class NonFiniteError(RuntimeError):
    """A client's loss or parameters became NaN/inf."""

    one_line = True


class Layout:
    """Where each parameter (and float buffer) of a model sits in a flat row."""

    def __init__(self, model: nn.Module):
        self.params = [(n, p.shape, p.numel()) for n, p in model.named_parameters()]
        self.buffers = [(n, b.shape, b.numel()) for n, b in model.named_buffers() if b.is_floating_point()]
        self.P = sum(k for _, _, k in self.params)
        self.B = sum(k for _, _, k in self.buffers)

    @staticmethod
    def _split(flat: torch.Tensor, entries) -> dict[str, torch.Tensor]:
        out, o = {}, 0
        for name, shape, k in entries:
            out[name] = flat[o:o + k].view(shape)
            o += k
        return out

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return self._split(flat, self.params)

    def unflatten_buffers(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return self._split(flat, self.buffers)

    def flatten(self, model: nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).float()

    def flatten_buffers(self, model: nn.Module) -> torch.Tensor:
        bufs = [b.detach().reshape(-1).float() for _, b in model.named_buffers() if b.is_floating_point()]
        return torch.cat(bufs) if bufs else torch.zeros(0)

    def slices(self, names: list[str]) -> list[slice]:
        """Row slices of the named parameters (e.g. a classifier head)."""
        out, o = [], 0
        for name, _, k in self.params:
            if name in names:
                out.append(slice(o, o + k))
            o += k
        return out


class RowOptimizer:
    """SGD (momentum, weight decay) and Adam applied to stacked parameter rows.

    State is one row per client, so a batched step over many clients and a
    sequential step over one client run the same arithmetic.
    """

    def __init__(self, cfg: TrainConfig, n: int, P: int, device: torch.device):
        self.cfg = cfg
        self.kind = cfg.optimizer
        self.state: dict[str, torch.Tensor] = {}
        if self.kind == "adam":
            self.state = {"m": torch.zeros(n, P, device=device), "v": torch.zeros(n, P, device=device),
                          "t": torch.zeros(n, 1, device=device)}
        elif cfg.momentum > 0:
            self.state = {"buf": torch.zeros(n, P, device=device)}

    def reset(self, sel=slice(None)) -> None:
        for t in self.state.values():
            t[sel] = 0

    def step(self, sel, p: torch.Tensor, g: torch.Tensor, lr: float | None = None) -> torch.Tensor:
        """Return the updated rows ``p`` (rows ``sel`` of the state are updated)."""
        c = self.cfg
        lr = c.lr if lr is None else lr
        if c.weight_decay:
            g = g + c.weight_decay * p
        if self.kind == "adam":
            b1, b2, eps = 0.9, 0.999, 1e-8
            m = self.state["m"][sel] * b1 + (1 - b1) * g
            v = self.state["v"][sel] * b2 + (1 - b2) * g * g
            t = self.state["t"][sel] + 1
            self.state["m"][sel], self.state["v"][sel], self.state["t"][sel] = m, v, t
            mhat = m / (1 - b1 ** t)
            vhat = v / (1 - b2 ** t)
            return p - lr * mhat / (vhat.sqrt() + eps)
        if "buf" in self.state:
            buf = self.state["buf"][sel] * c.momentum + g
            self.state["buf"][sel] = buf
            return p - lr * buf
        return p - lr * g


@dataclass
class BatchPlan:
    idx: np.ndarray  # [m, steps, batch] sample indices into the rank's x, -1 = padding

    @property
    def steps(self) -> int:
        return self.idx.shape[1]


class Clients:
    """This rank's clients: parameters, optimizer state, data, train/eval."""

    def __init__(self, model: nn.Module, data: FederatedData, cfg: TrainConfig, device: torch.device, seed: int):
        self.cfg = cfg
        self.seed = seed
        self.device = device
        self.model = model.to(device)
        self.layout = Layout(model)
        self.ids = np.asarray(data.local_ids)
        self.n = len(self.ids)
        self.P = self.layout.P
        self.data = data
        self.x = torch.from_numpy(data.x).to(device)
        self.y = torch.from_numpy(data.y).to(device)
        self.sizes = data.sizes[self.ids] if self.n else np.zeros((0, 3), np.int64)
        self.offsets = data.offsets
        self.n_classes = data.n_classes
        init = self.layout.flatten(model).to(device)
        self.init = init
        self.params = init.repeat(self.n, 1)
        self.buffers = self.layout.flatten_buffers(model).to(device).repeat(self.n, 1)
        self.opt = RowOptimizer(cfg, self.n, self.P, device)
        self.skipped = np.zeros(self.n, np.int64)  # updates dropped as non-finite (reset per round)
        bn = has_batchnorm(model)
        self.bn = bn
        self.batched = (cfg.batched == "on") or (cfg.batched == "auto" and not bn)
        if bn and self.batched:
            from .config import ConfigError
            raise ConfigError("train.batched='on' is not allowed with a BatchNorm model; use auto or off")
        self._vgrad = vmap(grad_and_value(self._loss), in_dims=(0, 0, 0, 0))
        self._vlogits = vmap(self._logits_one, in_dims=(0, 0))

    # ------------------------------------------------------------------ functional model
    def _logits_one(self, flat: torch.Tensor, x: torch.Tensor, bufs: torch.Tensor | None = None) -> torch.Tensor:
        state = self.layout.unflatten(flat)
        if bufs is not None and self.layout.B:
            state = {**state, **self.layout.unflatten_buffers(bufs)}
        return functional_call(self.model, state, (x,))

    def _loss(self, flat, x, y, w, bufs=None):
        out = self._logits_one(flat, x, bufs)
        losses = F.cross_entropy(out, y, reduction="none")
        return (losses * w).sum() / w.sum().clamp_min(1.0)

    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              local: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row gradient and loss of ``params[i]`` on batch ``(x[i], y[i], w[i])``.

        ``local`` names the clients whose BatchNorm buffers the rows use.
        """
        self.model.train()
        if self.batched:
            return self._vgrad(params, x, y, w)
        gs, ls = [], []
        for i in range(params.shape[0]):
            keep = w[i] > 0
            # one leaf per parameter tensor, not one flat leaf: the backward of P-wide
            # slices costs O(P) per tensor, O(P x tensors) per step (seconds on ResNet-18)
            leaves = {n: v.detach().requires_grad_(True) for n, v in self.layout.unflatten(params[i]).items()}
            state = dict(leaves)
            if local is not None and self.layout.B:
                state.update(self.layout.unflatten_buffers(self.buffers[local[i]]))
            out = functional_call(self.model, state, (x[i][keep],))
            wi = w[i][keep]
            loss = (F.cross_entropy(out, y[i][keep], reduction="none") * wi).sum() / wi.sum().clamp_min(1.0)
            g = torch.autograd.grad(loss, list(leaves.values()))
            gs.append(torch.cat([t.reshape(-1) for t in g]))
            ls.append(loss.detach())
        return torch.stack(gs), torch.stack(ls)

    @torch.no_grad()
    def logits(self, params: torch.Tensor, x: torch.Tensor, local: np.ndarray | None = None) -> torch.Tensor:
        """``[m, b, C]`` outputs of model rows ``params [m, P]`` on inputs ``x [m, b, ...]``."""
        self.model.eval()
        if self.batched:
            return self._vlogits(params, x)
        out = []
        for i in range(params.shape[0]):
            bufs = self.buffers[local[i]] if (local is not None and self.layout.B) else None
            out.append(self._logits_one(params[i], x[i], bufs))
        return torch.stack(out)

    # ------------------------------------------------------------------ batches
    def split_range(self, k: int, split: str) -> tuple[int, int]:
        s = SPLIT_INDEX[split]
        o = int(self.offsets[k, s])
        return o, o + int(self.sizes[k, s])

    def plan(self, local: np.ndarray, epochs: int, round: int, purpose: str = "train",
             batch_size: int | None = None, max_batches: int | None = None,
             subsets: list[np.ndarray] | None = None) -> BatchPlan:
        """Each client's shuffled batches for ``epochs`` epochs from its own stream.

        ``subsets``: per listed client, the sample indices (into this rank's ``x``)
        an epoch runs over instead of the client's whole training split."""
        bs = batch_size or self.cfg.batch_size
        rows = []
        for i, k in enumerate(local):
            if subsets is None:
                lo, hi = self.split_range(int(k), "train")
                pool = np.arange(lo, hi)
            else:
                pool = np.asarray(subsets[i], np.int64)
            n = len(pool)
            g = rng(self.seed, round, int(self.ids[k]), purpose)
            nb = math.ceil(n / bs)
            per = []
            for _ in range(epochs):
                perm = np.full(nb * bs, -1, np.int64)
                perm[:n] = pool[g.permutation(n)]
                b = perm.reshape(nb, bs)
                if self.bn and n % bs == 1 and nb > 1:
                    # BatchNorm cannot normalise a batch of one sample in training mode:
                    # that sample sits this epoch out (the next epoch reshuffles)
                    b = b[:-1]
                per.append(b)
            b = np.concatenate(per) if per else np.empty((0, bs), np.int64)
            rows.append(b[:max_batches] if max_batches else b)
        steps = max((len(r) for r in rows), default=0)
        idx = np.full((len(rows), steps, bs), -1, np.int64)
        for i, r in enumerate(rows):
            idx[i, :len(r)] = r
        return BatchPlan(idx)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gather a padded index array -> (x, y, w) with w = 0 on padding."""
        t = torch.as_tensor(idx, device=self.device)
        w = (t >= 0).float()
        t = t.clamp_min(0)
        return self.x[t], self.y[t], w

    # ------------------------------------------------------------------ training
    def train(self, local: np.ndarray, epochs: int, round: int, purpose: str = "train",
              subsets: list[np.ndarray] | None = None) -> np.ndarray:
        """Train the listed local clients (indices into this rank's block) in place
        for ``epochs`` local epochs (over ``subsets`` of their samples if given, see
        :meth:`plan`); returns each one's mean training loss."""
        local = np.asarray(local, dtype=np.int64)
        losses = np.zeros(len(local))
        seen = np.zeros(len(local))
        if len(local) == 0 or epochs == 0:
            return np.full(len(local), np.nan)
        plan = self.plan(local, epochs, round, purpose, subsets=subsets)
        skip = self.cfg.on_nonfinite == "skip"
        if skip:
            sel0 = _rows_selector(local, self.device)
            start = (self.params[sel0].clone(), {k: v[sel0].clone() for k, v in self.opt.state.items()})
        bad = np.zeros(len(local), bool)
        for s in range(plan.steps):
            idx = plan.idx[:, s]
            act = np.flatnonzero((idx >= 0).any(1))
            rows = local[act]
            sel = _rows_selector(rows, self.device)
            x, y, w = self.batch(idx[act])
            p = self.params[sel]
            g, loss = self.grads(p, x, y, w, rows)
            self.params[sel] = self.opt.step(sel, p, g)
            nw = w.sum(1).cpu().numpy()
            lv = loss.detach().cpu().numpy()
            bad[act] |= ~np.isfinite(lv)
            losses[act] += lv * nw
            seen[act] += nw
        bad |= ~torch.isfinite(self.params[_rows_selector(local, self.device)]).all(1).cpu().numpy()
        if bad.any():
            if not skip:
                k = int(np.flatnonzero(bad)[0])
                raise NonFiniteError(f"client {int(self.ids[local[k]])} produced a non-finite loss or parameters "
                                     f"in round {round} ({purpose}); lower train.lr or set train.on_nonfinite=skip")
            # drop the update: the client keeps its rows from before this call
            rows = torch.as_tensor(np.flatnonzero(bad), device=self.device)
            at = torch.as_tensor(local[bad], device=self.device)
            self.params[at] = start[0][rows]
            for k, v in start[1].items():
                self.opt.state[k][at] = v[rows]
            self.skipped[local[bad]] += 1
            losses[bad] = np.nan
        return losses / np.maximum(seen, 1)

    def set_rows(self, local: np.ndarray | slice, value: torch.Tensor) -> None:
        self.params[local] = value

    # ------------------------------------------------------------------ evaluation
    def split_index(self, local: np.ndarray, split: str) -> np.ndarray:
        """``[m, n_max]`` indices of each client's split samples, -1 padded."""
        spans = [self.split_range(int(k), split) for k in local]
        n_max = max((hi - lo for lo, hi in spans), default=0)
        idx = np.full((len(local), n_max), -1, np.int64)
        for i, (lo, hi) in enumerate(spans):
            idx[i, :hi - lo] = np.arange(lo, hi)
        return idx

    def _chunk(self, n_max: int) -> int:
        # bound the gathered inputs to ~32M floats per forward
        feat = int(np.prod(self.x.shape[1:])) if self.x.dim() > 1 else 1
        return max(1, (32 << 20) // max(1, n_max * feat))

    @torch.no_grad()
    def evaluate(self, split: str, params: torch.Tensor | None = None,
                 local: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean loss, accuracy) per client on its own ``split``.

        ``params``: ``[m, P]`` rows (default: the clients' own rows) or one ``[P]``
        model shared by all of them. A BatchNorm model always normalises with the
        evaluated client's own running statistics (``self.buffers``), which are
        local to each client as in FedBN: the template's buffers are never trained.
        """
        local = np.arange(self.n) if local is None else np.asarray(local)
        loss = np.full(len(local), np.nan)
        acc = np.full(len(local), np.nan)
        if len(local) == 0:
            return loss, acc
        if params is None:
            params = self.params[torch.as_tensor(local, device=self.device)]
        elif params.dim() == 1 and self.layout.B:
            params = params.expand(len(local), -1)
        idx_all = self.split_index(local, split)
        if idx_all.shape[1] == 0:
            return loss, acc
        step = self._chunk(idx_all.shape[1])
        for a in range(0, len(local), step):
            sl = slice(a, a + step)
            x, y, w = self.batch(idx_all[sl])
            if params.dim() == 1:
                self.model.eval()
                flat_x = x.reshape(-1, *x.shape[2:])
                out = self._logits_one(params, flat_x).reshape(*x.shape[:2], -1)
            else:
                out = self.logits(params[sl], x, local[sl])
            loss[sl], acc[sl] = _loss_acc(out, y, w)
        return loss, acc


def _loss_acc(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-row mean CE and accuracy of ``[m, b, C]`` logits over weighted samples."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none").view_as(w)
    n = w.sum(1).clamp_min(1.0)
    correct = (logits.argmax(-1) == y).float()
    return ((ce * w).sum(1) / n).cpu().numpy(), ((correct * w).sum(1) / n).cpu().numpy()


def loss_acc_from_probs(probs: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`_loss_acc` for mixtures given as probabilities ``[m, b, C]``."""
    nll = -torch.log(probs.clamp_min(1e-12)).gather(-1, y[..., None]).squeeze(-1)
    n = w.sum(1).clamp_min(1.0)
    correct = (probs.argmax(-1) == y).float()
    return ((nll * w).sum(1) / n).cpu().numpy(), ((correct * w).sum(1) / n).cpu().numpy()


def _rows_selector(rows: np.ndarray, device) -> slice | torch.Tensor:
    """A slice (view, no copy) when the rows are contiguous, else an index tensor."""
    if len(rows) and np.all(np.diff(rows) == 1):
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return torch.as_tensor(rows, device=device)
