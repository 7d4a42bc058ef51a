"""The clients a rank hosts: one ``[n_local, P]`` parameter matrix, local
training and evaluation on its rows.

A model is only a template here: weights live in the rows, so exchanging a
client's model is sending a contiguous row, and many clients train at once with
``torch.func.vmap`` (a BatchNorm model with each client's running statistics).
The per-client path is a plain torch loop on the template bound to one client's
rows at a time; both paths draw the same batches and apply the same optimizer
arithmetic, so they agree to float tolerance. Plain MLPs train through stacked
``bmm`` instead of vmap (same arithmetic, better memory layout); under
``train.batched=auto`` other models take whichever path a timing at the start of
the run finds faster (:meth:`Clients.measure_paths`, bench/README.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from .data import FederatedData
from .models import has_batchnorm
from .rng import streams

if TYPE_CHECKING:  # a type hint only: the config package sits above this module
    from .config import TrainConfig

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

    def __init__(self, cfg: TrainConfig, n: int, P: int, device: torch.device, sizes: list[int] | None = None):
        self.cfg = cfg
        self.kind = cfg.optimizer
        self.sizes = sizes  # entries of each parameter block of a row, in layout order
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
        order (what batched training produces: no flat copy needed), None for a block
        already updated (:meth:`fused_sgd`); overwritten. The in-place kernels are
        those of ``torch.optim`` (SGD: ``buf.mul_(m).add_(g)``, ``p.add_(buf,
        alpha=-lr)``) and allocate no fresh ``[m, P]`` tensors.
        """
        c = self.cfg
        lr = c.lr if lr is None else lr
        m = p.shape[0]
        if torch.is_tensor(g):
            blocks = [(slice(None), g)]
        else:
            # autograd may return transposed blocks: view the rows in each block's
            # shape rather than copying the block into the rows' layout
            blocks, o = [], 0
            for i, gi in enumerate(g):
                k = self.sizes[i] if self.sizes is not None else gi[0].numel() if m else 0
                if gi is not None:
                    blocks.append((slice(o, o + k), gi))
                o += k
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
        if not isinstance(sel, slice):
            for k, v in state.items():
                self.state[k][sel] = v


@dataclass
class BatchPlan:
    idx: np.ndarray  # [m, steps, batch] sample indices into the rank's x, -1 = padding

    @property
    def steps(self) -> int:
        return self.idx.shape[1]


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

    def apply(self, c: Clients, p: torch.Tensor, g: torch.Tensor | list[torch.Tensor | None],
              rows: np.ndarray) -> list[torch.Tensor | None]:
        """The gradient of rows ``p`` ([m, P], the clients ``rows``) with the extra
        terms added, as per-parameter blocks (None: left alone)."""
        if torch.is_tensor(g):
            g = list(c.parts(g).values())
        out: list[torch.Tensor | None] = []
        center = None
        if self.prox_mu and self.prox_center is not None:
            pc = self.prox_center
            center = c.parts(pc.expand(len(rows), -1) if pc.dim() == 1 else pc[torch.as_tensor(rows, device=pc.device)])
        for (name, _, _), gb, pb in zip(c.layout.params, g, c.parts(p).values()):
            if name in self.frozen or gb is None:
                out.append(None)
                continue
            if center is not None:
                gb.add_(pb.view(gb.shape) - center[name].view(gb.shape), alpha=self.prox_mu)
            out.append(gb)
        return out


# A custom optimisation step for :meth:`Clients.train`: (clients, selector of the
# rows, their local positions, x, y, w) -> their losses [m]; it updates the rows
StepFn = Callable[["Clients", "slice | torch.Tensor", np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor],
                  torch.Tensor]


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
        self.opt = RowOptimizer(cfg, self.n, self.P, device, [k for _, _, k in self.layout.params])
        self.skipped = np.zeros(self.n, np.int64)  # updates dropped as non-finite (reset per round)
        bn = has_batchnorm(model)
        self.bn = bn
        self.stacked = stacked_mlp(model) if self.layout.B == 0 else None
        # Which path trains: "on" / "off" as asked. Under "auto" a plain MLP is batched
        # (stacked bmm: 6-10x the loop in bench/README.md, at every size measured);
        # any other model is timed on both paths at the start of a run
        # (measure_paths, which runtime.setup calls on every rank), because vmap
        # makes a conv net's convolutions grouped ones, whose speed against the loop
        # depends on the layer sizes and the machine (bench/README.md).
        self.batched = cfg.batched == "on" or (cfg.batched == "auto" and self.stacked is not None)
        self.needs_measuring = cfg.batched == "auto" and self.stacked is None
        self.path_times: tuple[float, float] | None = None  # (batched, loop) s, when measured
        self._vloss = vmap(self._loss_parts, in_dims=(0, 0, 0, 0))
        self._vloss_bias = vmap(self._loss_parts, in_dims=(0, 0, 0, 0, None, 0))
        # BatchNorm: each client's running statistics ride along as a vmapped buffer row
        self._vloss_bufs = vmap(self._loss_parts, in_dims=(0, 0, 0, 0, 0))
        self._vloss_bufs_bias = vmap(self._loss_parts, in_dims=(0, 0, 0, 0, 0, 0))
        self._names = [n for n, _, _ in self.layout.params]
        self._gcache: list[torch.Tensor] | None = None
        self._vlogits = vmap(self._logits_one, in_dims=(0, 0))
        self._vlogits_bufs = vmap(self._logits_one, in_dims=(0, 0, 0))

    @contextmanager
    def using(self, params: torch.Tensor, opt_state: dict[str, torch.Tensor] | None = None) -> Iterator[None]:
        """Train and evaluate other rows (``[n_local, P]``: personal models, a copy
        for fine-tuning) through these clients: ``params`` and ``opt_state`` (default:
        a fresh one) stand in for the clients' own for the block, in place (no copy),
        and the clients' own are back after it, whatever happened."""
        saved = self.params, self.opt.state
        self.params = params
        self.opt.state = self.opt.fresh_state(len(params)) if opt_state is None else opt_state
        try:
            yield
        finally:
            self.params, self.opt.state = saved

    # ------------------------------------------------------------------ functional model
    def _logits_one(self, flat: torch.Tensor, x: torch.Tensor, bufs: torch.Tensor | None = None) -> torch.Tensor:
        state = self.layout.unflatten(flat)
        if bufs is not None and self.layout.B:
            state = {**state, **self.layout.unflatten_buffers(bufs)}
        return functional_call(self.model, state, (x,))

    def _loss(self, flat, x, y, w, bufs=None):
        return self._loss_parts(self.layout.unflatten(flat), x, y, w, bufs)

    def _loss_parts(self, state: dict[str, torch.Tensor], x, y, w, bufs=None, bias=None):
        if bufs is not None and self.layout.B:  # a flat buffer row, or its per-buffer views
            state = {**state, **(bufs if isinstance(bufs, dict) else self.layout.unflatten_buffers(bufs))}
        out = functional_call(self.model, state, (x,))
        if bias is not None:
            out = out + bias
        losses = F.cross_entropy(out, y, reduction="none")
        return padded_sum(losses * w, 0) / w.sum().clamp_min(1.0)

    def parts(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-parameter views ``[m, *shape]`` of rows ``[m, P]`` (no copy)."""
        m, out, o = params.shape[0], {}, 0
        for name, shape, k in self.layout.params:
            out[name] = params[:, o:o + k].view(m, *shape)
            o += k
        return out

    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              local: np.ndarray | None = None, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row gradient ``[m, P]`` and loss ``[m]`` of ``params[i]`` on batch
        ``(x[i], y[i], w[i])``. ``local`` names the clients whose BatchNorm buffers
        the rows use; ``bias`` ``[m, C]`` is added to row i's logits in the loss."""
        g, loss = self._grads(params, x, y, w, local, bias)
        if torch.is_tensor(g):
            return g, loss
        flat = torch.empty(params.shape[0], self.P, dtype=params.dtype, device=params.device)
        self._write_flat(flat, dict(zip(self._names, g)))
        return flat, loss

    def _grads(self, params, x, y, w, local, bias=None,
               valid: torch.Tensor | None = None) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor]:
        """As :meth:`grads`; the batched path returns per-parameter blocks. ``valid``:
        the batch's real samples where ``w`` may be zero on some of them (per-sample
        weights): the loop still forwards them, so BatchNorm sees the whole batch."""
        m = params.shape[0]
        if self.batched and self.stacked is not None:  # Linear/ReLU only: no train mode
            with torch.no_grad():
                return _stacked_grads(self.stacked, self.parts(params), x, y, w, self._grad_blocks(m), bias=bias)
        self.model.train()
        # Differentiate with respect to per-parameter views, not the flat row: the
        # backward of slicing a flat row materialises a zero [m, P] tensor per
        # parameter tensor, which cost more than the model's own matmuls. Batched:
        # vmap the forward only and let plain autograd take the gradient of the sum
        # of the per-client losses (client i's loss depends on row i alone), which
        # is cheaper than functorch's grad transform.
        with torch.enable_grad():
            if self.batched and self.layout.B and local is not None:
                return self._grads_bn(params, x, y, w, local, bias, valid)
            if self.batched:
                leaves = {k: v.detach().requires_grad_(True) for k, v in self.parts(params).items()}
                loss = self._vloss(leaves, x, y, w) if bias is None else self._vloss_bias(leaves, x, y, w, None, bias)
                return list(torch.autograd.grad(loss.sum(), list(leaves.values()))), loss.detach()
            g = torch.empty(m, self.P, dtype=params.dtype, device=params.device)
            ls = []
            for i in range(m):
                keep = valid[i] if valid is not None else w[i] > 0
                parts = {k: v[0].detach().requires_grad_(True) for k, v in self.parts(params[i:i + 1]).items()}
                bufs = self.buffers[local[i]] if (local is not None and self.layout.B) else None
                loss = self._loss_parts(parts, x[i][keep], y[i][keep], w[i][keep], bufs,
                                        None if bias is None else bias[i])
                gi = torch.autograd.grad(loss, list(parts.values()))
                self._write_flat(g[i:i + 1], dict(zip(parts, (t[None] for t in gi))))
                ls.append(loss.detach())
            return g, torch.stack(ls)

    def _grads_bn(self, params, x, y, w, local, bias, valid) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Batched gradients of a BatchNorm model: rows grouped by how many real
        samples their batch holds (a prefix of it), so that each client's batch
        statistics, as in the loop, cover its real samples only; each client's
        running statistics (``self.buffers``) are updated in place, as the loop's."""
        keep = valid if valid is not None else w > 0
        n_real = keep.sum(1).cpu().numpy()
        m = params.shape[0]
        blocks = [torch.empty(m, *shape, dtype=params.dtype, device=params.device)
                  for _, shape, _ in self.layout.params]
        loss = torch.empty(m, dtype=params.dtype, device=params.device)
        for n in np.unique(n_real):
            at = np.flatnonzero(n_real == n)
            ti = torch.as_tensor(at, device=params.device)
            n = int(n)
            sel = _rows_selector(np.asarray(local)[at], self.device)
            # one contiguous tensor per buffer: BatchNorm's in-place running-statistics
            # update under vmap reaches those, not strided column views of the flat rows
            views, o = {}, 0
            for name, shape, k in self.layout.buffers:
                views[name] = self.buffers[sel, o:o + k].reshape(len(at), *shape).clone()
                o += k
            leaves = {k: v[ti].detach().requires_grad_(True) for k, v in self.parts(params).items()}
            args = (leaves, x[ti, :n], y[ti, :n], w[ti, :n], views)
            lo = self._vloss_bufs(*args) if bias is None else self._vloss_bufs_bias(*args, bias[ti])
            for blk, gb in zip(blocks, torch.autograd.grad(lo.sum(), list(leaves.values()))):
                blk[ti] = gb
            loss[ti] = lo.detach()
            self.buffers[sel] = torch.cat([v.reshape(len(at), -1) for v in views.values()], 1)
        return blocks, loss

    def measure_paths(self, steps: int = 3, reps: int = 3) -> tuple[float, float]:
        """Seconds (best of ``reps``) that ``steps`` training steps of up to 8 of this
        rank's clients take batched and client by client, on copies of their rows
        and state: no side effect on training (own random streams, buffers put back)."""
        m = min(self.n, 8)
        if m == 0:
            return 0.0, 0.0
        local = np.arange(m)
        saved = self.batched, self.buffers.clone(), self.skipped.copy()
        best = {True: float("inf"), False: float("inf")}
        try:
            for r in range(reps + 1):  # the first round warms both paths up
                for path in ((True, False) if r % 2 else (False, True)):
                    self.batched = path
                    with self.using(self.params[:m].clone()):
                        t0 = time.perf_counter()
                        self.train(local, 1, r, purpose="measure", max_batches=steps)
                        if r:
                            best[path] = min(best[path], time.perf_counter() - t0)
        finally:
            self.batched = saved[0]
            self.buffers.copy_(saved[1])
            self.skipped[:] = saved[2]
        return best[True], best[False]

    def _grad_blocks(self, m: int) -> list[torch.Tensor]:
        """Per-parameter gradient blocks ``[m, *shape]``, reused across steps: a fresh
        multi-MB result tensor per step costs more in page faults and in MKL's
        handling of it than the matmul that fills it (bench/README.md)."""
        if self._gcache is None or self._gcache[0].shape[0] < m:
            self._gcache = [torch.empty(m, *shape, device=self.device) for _, shape, _ in self.layout.params]
        return [b[:m] for b in self._gcache]

    def _write_flat(self, out: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        o = 0
        for name, _, k in self.layout.params:
            out[:, o:o + k] = parts[name].reshape(out.shape[0], k)
            o += k

    @torch.no_grad()
    def logits(self, params: torch.Tensor, x: torch.Tensor, local: np.ndarray | None = None) -> torch.Tensor:
        """``[m, b, C]`` outputs of model rows ``params [m, P]`` on inputs ``x [m, b, ...]``."""
        self.model.eval()
        if self.batched and self.stacked is not None:
            return stacked_forward(self.stacked, self.parts(params), x)
        if self.batched and self.layout.B and local is not None:
            return self._vlogits_bufs(params, x, self.buffers[_rows_selector(np.asarray(local), self.device)])
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
        local = np.asarray(local, np.int64)
        if subsets is None:
            lo, n = self.offsets[local, SPLIT_INDEX["train"]], self.sizes[local, SPLIT_INDEX["train"]]
        else:
            pools = [np.asarray(p, np.int64) for p in subsets]
            n = np.array([len(p) for p in pools], np.int64)
        # BatchNorm cannot normalise a batch of one sample in training mode: such a
        # sample sits each epoch out (the next epoch reshuffles)
        drop = (n % bs == 1) & (n > bs) if self.bn else np.zeros(len(n), bool)
        per_epoch = -(-n // bs) - drop  # batches an epoch keeps
        steps = np.minimum(epochs * per_epoch, max_batches) if max_batches else epochs * per_epoch
        m, S = len(local), int(steps.max(initial=0))
        # epoch e of client i fills batches [e * per_epoch, (e + 1) * per_epoch) of its
        # row with the first cnt[i, e] entries of one permutation (the last batch short)
        start = np.arange(epochs)[None, :] * per_epoch[:, None] * bs + np.arange(m)[:, None] * S * bs
        cnt = np.clip(np.minimum((n - drop)[:, None], (steps + np.arange(m) * S)[:, None] * bs - start), 0, None)
        perms = []
        for i, g in enumerate(streams(self.seed, round, self.ids[local], purpose)):
            ni = int(n[i])
            for c in cnt[i].tolist():  # one permutation per epoch, in order, from the client's stream
                if c == 0:
                    break
                perms.append(g.permutation(ni)[:c])
        idx = np.full((m, S, bs), -1, np.int64)
        if perms:
            c = cnt.reshape(-1)
            pos = np.repeat(start.reshape(-1) - (np.cumsum(c) - c), c) + np.arange(c.sum())
            vals = np.concatenate(perms)
            if subsets is None:
                vals += np.repeat(lo, cnt.sum(1))
            else:
                vals = np.concatenate(pools)[vals + np.repeat(np.cumsum(n) - n, cnt.sum(1))]
            idx.reshape(-1)[pos] = vals
        return BatchPlan(idx)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gather a padded index array -> (x, y, w) with w = 0 on padding."""
        valid = idx >= 0
        # masks made by numpy, and index_select/take rather than advanced indexing:
        # these small ops cost 2-5x less so on the CPU
        t = torch.as_tensor(np.where(valid, idx, 0), device=self.device)
        w = torch.from_numpy(valid.astype(np.float32)).to(self.device)
        x = self.x.index_select(0, t.view(-1)).view(*t.shape, *self.x.shape[1:])
        return x, self.y.take(t), w

    # ------------------------------------------------------------------ training
    def train(self, local: np.ndarray, epochs: int, round: int, purpose: str = "train",
              subsets: list[np.ndarray] | None = None, objective: Objective | None = None,
              step: StepFn | None = None, batch_size: int | None = None,
              max_batches: int | None = None) -> np.ndarray:
        """Train the listed local clients (indices into this rank's block) in place
        for ``epochs`` local epochs (over ``subsets`` of their samples if given, see
        :meth:`plan`); returns each one's mean training loss.

        ``objective`` adds closed-form terms to every path's gradient; ``step``
        replaces the optimisation step itself (methods whose update is not a
        gradient step on one loss: APFL, Per-FedAvg, FedRoD...), with the same
        batches, chunks and non-finite handling. ``batch_size`` (default
        ``train.batch_size``) sizes the batches a step gets: a step that splits its
        batch into several (Per-FedAvg's inner and outer batches) asks for a multiple.
        ``max_batches``: at most this many steps per client."""
        local = np.asarray(local, dtype=np.int64)
        if objective is not None and not objective.active:
            objective = None  # FedProx at mu = 0 is FedAvg bit for bit, Ditto at lam = 0 Local
        losses = np.zeros(len(local))
        seen = np.zeros(len(local))
        if len(local) == 0 or epochs == 0:
            return np.full(len(local), np.nan)
        plan = self.plan(local, epochs, round, purpose, batch_size=batch_size, subsets=subsets,
                         max_batches=max_batches)
        skip = self.cfg.on_nonfinite == "skip"
        if skip:
            sel0 = _rows_selector(local, self.device)
            start = (self.params[sel0].clone(), {k: v[sel0].clone() for k, v in self.opt.state.items()})
        bad = np.zeros(len(local), bool)
        has = (plan.idx >= 0).any(2)  # [m, steps]: client i has a batch at step s
        if not self.batched and step is None:
            self._train_loop(local, plan, objective, bad, losses, seen)
        # Chunk-major: a chunk of clients takes all its steps before the next chunk
        # starts, so its rows stay in cache from one step to the next instead of
        # being streamed from memory once per step (clients do not interact inside
        # a call, so the order changes no result).
        for a, b in ([] if not self.batched and step is None else self._chunks(len(local))):
            for s in range(plan.steps):
                act = a + np.flatnonzero(has[a:b, s])
                if len(act) == 0:
                    continue
                # every step is the full batch width, padding included (weight 0), even
                # where no client stepping uses the last columns: trimmed to the widest
                # batch present, a client's short last batch had another width (and MKL
                # other GEMM kernels, with another order of additions) depending on the
                # clients sharing its rank, so its results depended on the placement
                idx = plan.idx[act, s]
                rows = local[act]
                x, y, w = self.batch(idx)
                sel = _rows_selector(rows, self.device)
                v = None
                if objective is not None and objective.sample_weight is not None:
                    at = torch.as_tensor(np.maximum(idx, 0), device=self.device)
                    v = objective.sample_weight.take(at) * w
                loss = step(self, sel, rows, x, y, w) if step else self._step(sel, rows, x, y, w, objective, v)
                nw = w.sum(1).cpu().numpy()
                lv = loss.detach().cpu().numpy()
                bad[act] |= ~np.isfinite(lv)
                losses[act] += lv * nw
                seen[act] += nw
            # a row sum is non-finite iff a parameter is (or the row overflows, which
            # is divergence all the same); isfinite over the rows cost as much as a
            # step, and the sum is cheapest while the chunk's rows are in cache
            bad[a:b] |= ~torch.isfinite(self.params[_rows_selector(local[a:b], self.device)].sum(1)).cpu().numpy()
        if bad.any():
            if not skip:
                k = int(np.flatnonzero(bad)[0])
                raise NonFiniteError(f"client {int(self.ids[local[k]])} produced a non-finite loss or parameters "
                                     f"in round {round + 1} ({purpose}); lower train.lr or set train.on_nonfinite=skip")
            # drop the update: the client keeps its rows from before this call
            rows = torch.as_tensor(np.flatnonzero(bad), device=self.device)
            at = torch.as_tensor(local[bad], device=self.device)
            self.params[at] = start[0][rows]
            for k, v in start[1].items():
                self.opt.state[k][at] = v[rows]
            self.skipped[local[bad]] += 1
            losses[bad] = np.nan
        return losses / np.maximum(seen, 1)

    @contextmanager
    def _bound(self) -> Iterator[Callable[[int, torch.Tensor], None]]:
        """The template module made to compute with client rows in place: ``bind(k,
        g)`` points its parameters at row ``k`` of ``self.params`` (and its float
        buffers at row ``k`` of ``self.buffers``) and their ``.grad`` at ``g [P]``, so
        a plain ``model(x)`` / ``backward()`` reads and writes the rows themselves.
        The template's own tensors are back after the block."""
        params = [p for _, p in self.model.named_parameters()]
        bufs = [(mod, name) for mod in self.model.modules() for name, b in mod.named_buffers(recurse=False)
                if b is not None and b.is_floating_point()]
        saved = [(p.data, p.grad) for p in params], [getattr(mod, name) for mod, name in bufs]

        def bind(k: int, g: torch.Tensor) -> None:
            o = 0
            for p, (_, shape, n) in zip(params, self.layout.params):
                p.data = self.params[k, o:o + n].view(shape)
                p.grad = g[o:o + n].view(shape)
                o += n
            o = 0
            for (mod, name), (_, shape, n) in zip(bufs, self.layout.buffers):
                setattr(mod, name, self.buffers[k, o:o + n].view(shape))
                o += n

        try:
            yield bind
        finally:
            for p, (data, grad) in zip(params, saved[0]):
                p.data, p.grad = data, grad
            for (mod, name), b in zip(bufs, saved[1]):
                setattr(mod, name, b)

    def _train_loop(self, local: np.ndarray, plan: BatchPlan, objective: Objective | None,
                    bad: np.ndarray, losses: np.ndarray, seen: np.ndarray) -> None:
        """The per-client path: client by client, all of a client's steps, as a plain
        torch loop on the template module bound to the client's rows (no
        functional_call, no per-step host sync, one gather of the client's inputs
        per call, one flat optimizer step); same batches and arithmetic as the
        batched path. Fills ``bad``, ``losses`` (sum of loss x samples) and ``seen``."""
        self.model.train()
        g = torch.empty(self.P, device=self.device)
        counts = (plan.idx >= 0).sum(2)  # [m, steps] real samples (a prefix of each batch)
        sw = objective.sample_weight if objective is not None else None
        with self._bound() as bind, torch.enable_grad():
            for i, k in enumerate(local.tolist()):
                bind(k, g)
                steps = np.flatnonzero(counts[i])
                if len(steps) == 0:
                    continue
                t = torch.as_tensor(np.maximum(plan.idx[i, steps], 0), device=self.device)
                xs = self.x.index_select(0, t.view(-1)).view(*t.shape, *self.x.shape[1:])
                ys = self.y.take(t)
                vs = sw.take(t) if sw is not None else None
                row, sel = self.params[k:k + 1], slice(k, k + 1)
                bias = objective.bias(local[i:i + 1]) if objective is not None else None
                total = torch.zeros((), device=self.device)
                rows = np.array([k])
                for j, c in enumerate(counts[i, steps].tolist()):
                    out = self.model(xs[j, :c])
                    if bias is not None:
                        out = out + bias[0]
                    if vs is None:
                        loss = F.cross_entropy(out, ys[j, :c])
                    else:  # per-sample weights: the batched path's sum(v l) / n
                        loss = (F.cross_entropy(out, ys[j, :c], reduction="none") * vs[j, :c]).sum() / c
                    g.zero_()
                    loss.backward()
                    gr = g[None]
                    if objective is not None:
                        gr = objective.apply(self, row, gr, rows)
                    self.opt.step_(sel, row, gr)
                    total += loss.detach() * c
                n = float(counts[i].sum())
                lv = float(total) / n
                bad[i] |= not np.isfinite(lv)
                losses[i] += lv * n
                seen[i] += n
                bad[i] |= not bool(torch.isfinite(row.sum()))

    def _step(self, sel, rows: np.ndarray, x, y, w, objective: Objective | None = None,
              v: torch.Tensor | None = None) -> torch.Tensor:
        """One optimizer step of ``rows`` (``sel``: their selector) on their batches
        ``x, y, w``; returns their losses. ``v``: per-sample loss weights (zero on
        padding), see ``Objective.sample_weight``."""
        p = self.params[sel]  # a view when the rows are contiguous
        # The fused update runs client by client on one thread; with more threads
        # the batched GEMM + add_ of the unfused one parallelise and win (at two
        # threads, 128 MLP clients: 9.1-9.4 vs 9.6-10.2 ms a call), and on a GPU
        # the unfused path is the one measured.
        fuse = self.device.type == "cpu" and torch.get_num_threads() == 1 and objective is None
        sgd = self.opt.fused_sgd() if fuse else None
        if self.batched and self.stacked is not None and sgd is not None:
            with torch.no_grad():
                g, loss = _stacked_grads(self.stacked, self.parts(p), x, y, w, self._grad_blocks(len(rows)), sgd)
        else:
            scale, valid = None, None
            if v is not None:
                valid = w > 0
                # every path computes the weighted mean sum(w l) / max(sum w, 1): feed it
                # weights summing to n (no clamp) and rescale by sum(v) / n afterwards
                n, tot = w.sum(1), v.sum(1)
                w = torch.where(tot[:, None] > 0, v * (n / tot.clamp_min(1e-30))[:, None], w)
                scale = tot / n.clamp_min(1.0)
            g, loss = self._grads(p, x, y, w, rows, None if objective is None else objective.bias(rows), valid)
            if scale is not None:
                loss = loss * scale
                for gb in ([g] if torch.is_tensor(g) else g):
                    gb.mul_(scale.view(-1, *(1,) * (gb.dim() - 1)))
            if objective is not None:
                g = objective.apply(self, p, g, rows)
        self.opt.step_(sel, p, g)
        if not isinstance(sel, slice):
            self.params[sel] = p
        return loss

    def _chunks(self, m: int) -> list[tuple[int, int]]:
        """Client ranges trained together. On the CPU about ``_CHUNK_BYTES`` of
        parameters: their forward, backward and update, and all of a call's steps,
        then share the cache instead of streaming every row from memory three times
        a step; a GPU takes all rows in one go."""
        if not self.batched or self.device.type != "cpu":
            return [(0, m)]
        k = max(1, _CHUNK_BYTES // (4 * self.P))
        return [(a, min(m, a + k)) for a in range(0, m, k)]

    # ------------------------------------------------------------------ evaluation
    def split_batches(self, split: str, local: np.ndarray | None = None
                      ) -> Iterator[tuple[slice, np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Every listed client's whole ``split`` in chunks of clients, padded:
        ``(positions in local, idx [m, n_max], x, y, w)`` with w = 0 on padding."""
        local = np.arange(self.n) if local is None else np.asarray(local)
        idx_all = self.split_index(local, split)
        if len(local) == 0 or idx_all.shape[1] == 0:
            return
        step = self._chunk(idx_all.shape[1])
        for a in range(0, len(local), step):
            sl = slice(a, min(a + step, len(local)))
            yield (sl, idx_all[sl], *self.batch(idx_all[sl]))

    @torch.no_grad()
    def shared_logits(self, row: torch.Tensor, x: torch.Tensor, local: np.ndarray) -> torch.Tensor:
        """``[m, b, C]`` outputs of one model ``row [P]`` on the listed clients' inputs
        ``x [m, b, ...]`` (a BatchNorm model with each client's own statistics)."""
        if self.layout.B:
            return self.logits(row.expand(len(local), -1).contiguous(), x, local)
        self.model.eval()
        return self._logits_one(row, x.reshape(-1, *x.shape[2:])).reshape(*x.shape[:2], -1)

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


# Parameter bytes per chunk of clients trained together on the CPU (Clients._chunks):
# 2 to 8 MiB ran alike at 128 digits-MLP clients, 1 MiB 25% slower (bench/README.md).
_CHUNK_BYTES = 4 << 20


def stacked_mlp(model: nn.Module) -> list[tuple[str, ...]] | None:
    """The layers of an ``nn.Sequential`` of Flatten / Linear / ReLU, or None.

    Such models (the MLPs) train through :func:`stacked_forward` instead of vmap:
    vmap's linear puts each weight gradient in transposed layout, and applying it
    to the row-major rows then costs a strided pass as long as the matmuls."""
    if not isinstance(model, nn.Sequential):
        return None
    ops: list[tuple[str, ...]] = []
    for name, mod in model.named_children():
        if isinstance(mod, nn.Linear):
            ops.append(("linear", f"{name}.weight", f"{name}.bias" if mod.bias is not None else ""))
        elif isinstance(mod, nn.ReLU):
            ops.append(("relu",))
        elif isinstance(mod, nn.Flatten) and mod.start_dim == 1 and mod.end_dim == -1:
            ops.append(("flatten",))
        else:
            return None
    return ops


def stacked_forward(ops: list[tuple[str, ...]], p: dict[str, torch.Tensor], x: torch.Tensor,
                     keep: list[torch.Tensor] | None = None) -> torch.Tensor:
    """``[m, b, C]`` logits of m MLPs (weights ``[m, out, in]``) on ``x [m, b, ...]``;
    ``keep`` collects each layer's input (what the backward needs)."""
    m, b = x.shape[:2]
    h = x.reshape(m, b, -1)
    for op in ops:
        if op[0] == "linear":
            if keep is not None:
                keep.append(h)
            wt = p[op[1]].transpose(1, 2)
            h = torch.baddbmm(p[op[2]].unsqueeze(1), h, wt) if op[2] else torch.bmm(h, wt)
        elif op[0] == "relu":
            h = torch.relu(h)
            if keep is not None:
                keep.append(h)
        # flatten: inputs were flattened above, and Flatten comes first in an MLP
    return h


def _stacked_grads(ops: list[tuple[str, ...]], p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                   w: torch.Tensor, out: list[torch.Tensor], sgd: tuple[float, float] | None = None,
                   bias: torch.Tensor | None = None) -> tuple[list[torch.Tensor | None], torch.Tensor]:
    """Loss ``[m]`` (weighted mean CE per row) of m MLPs and its gradient, written into
    ``out`` (per-parameter blocks ``[m, *shape]`` in ``p``'s order), by a hand-written
    backward: ``dW = dz^T h`` lands in the rows' own ``[m, out, in]`` layout through
    ``bmm(out=)`` with no autograd graph and no fresh gradient tensors.

    ``sgd = (lr, weight_decay)``: plain SGD is applied here to the weight blocks, as
    ``W <- (1 - lr wd) W - lr dz^T h`` in one ``baddbmm_``, and their entries in the
    returned list are None (the caller's optimizer updates the biases). No weight
    gradient is stored and read back: 7% less time per call at 128 clients on one
    thread, although torch runs an in-place baddbmm_ into rows of the [n, P]
    parameters (not contiguous) client by client, which is why the caller fuses on
    one thread only (bench/README.md)."""
    keep: list[torch.Tensor] = []
    logits = stacked_forward(ops, p, x, keep)
    if bias is not None:  # [m, C] per-row logit adjustment: d loss / d logits keeps its form
        logits = logits + bias.unsqueeze(1)
    wn = (w / w.sum(1, keepdim=True).clamp_min(1.0)).unsqueeze(-1)  # [m, b, 1]: each sample's share
    logp = torch.log_softmax(logits, -1)
    yi = y.unsqueeze(-1)
    loss = -padded_sum((logp.gather(-1, yi) * wn).squeeze(-1), 1)
    # d(sum of row losses)/dlogits = (softmax - onehot(y)) * w / n
    dz = logp.exp_()
    dz.scatter_add_(-1, yi, torch.full_like(yi, -1.0, dtype=dz.dtype))
    dz.mul_(wn)
    grad: dict[str, torch.Tensor | None] = dict(zip(p, out))
    for op in reversed(ops):
        if op[0] == "linear":
            h, W = keep.pop(), p[op[1]]
            if op[2]:
                torch.sum(dz, 1, out=grad[op[2]])
            dz_in = torch.bmm(dz, W) if keep else None  # the first layer's input gradient is not needed
            if sgd is not None:
                lr, wd = sgd
                W.baddbmm_(dz.transpose(1, 2), h, beta=1 - lr * wd, alpha=-lr)
                grad[op[1]] = None
            else:
                torch.bmm(dz.transpose(1, 2), h, out=grad[op[1]])
            dz = dz_in
        elif op[0] == "relu":
            # ReLU's own backward kernel: 7x faster here than dz * (h > 0), whose
            # bool mask and its conversion are unvectorised on CPU
            dz = torch.ops.aten.threshold_backward(dz, keep.pop(), 0)
    return list(grad.values()), loss


def padded_sum(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over the sample dimension ``dim``, whose padding (weight 0) is trailing
    zeros, to the same bits however wide the padding is. torch's sum vectorises
    along a contiguous dimension and its order of additions changes with the
    length, so a client's loss depended on the clients sharing its batch, hence on
    how many clients its rank hosts. cumsum adds left to right (in double on the
    CPU), and trailing zeros add nothing. Integer-valued sums (counts) are exact
    with ``sum`` and need no such care."""
    if t.shape[dim] == 0:  # no sample at all: the empty sum
        return t.sum(dim)
    return t.cumsum(dim).select(dim, -1)


def _loss_acc(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-row mean CE and accuracy of ``[m, b, C]`` logits over weighted samples."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none").view_as(w)
    n = w.sum(1).clamp_min(1.0)
    correct = (logits.argmax(-1) == y).float()
    return (padded_sum(ce * w, 1) / n).cpu().numpy(), ((correct * w).sum(1) / n).cpu().numpy()


def loss_acc_from_probs(probs: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`_loss_acc` for mixtures given as probabilities ``[m, b, C]``."""
    nll = -torch.log(probs.clamp_min(1e-12)).gather(-1, y[..., None]).squeeze(-1)
    n = w.sum(1).clamp_min(1.0)
    correct = (probs.argmax(-1) == y).float()
    return (padded_sum(nll * w, 1) / n).cpu().numpy(), ((correct * w).sum(1) / n).cpu().numpy()


def _rows_selector(rows: np.ndarray, device) -> slice | torch.Tensor:
    """A slice (view, no copy) when the rows are contiguous, else an index tensor."""
    if len(rows) and np.all(np.diff(rows) == 1):
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return torch.as_tensor(rows, device=device)
