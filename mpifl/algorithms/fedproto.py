"""FedProto: Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, "FedProto: Federated
Prototype Learning across Heterogeneous Clients" (AAAI 2022). Clients exchange
per-class mean embeddings (prototypes) instead of models; every client keeps
its own model.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedproto fedproto.lam=1

The model splits into a body f (everything before the last ``nn.Linear``,
``mpifl.train.head``) and a classifier. Round t, for every sampled client i:

1. local training, E epochs on its own model, each batch B minimising
   ``(1/|B|) sum_{s in B} [ CE(g(f(x_s)), y_s) + lam * (1/d) ||f(x_s) - C_bar_{y_s}||^2 ]``
   where C_bar_c are the global prototypes of the previous round (no term for a
   class that has none yet: round 0 is plain cross-entropy);
2. local prototypes of the trained body on its training split,
   ``C_i^c = (1/n_ic) sum_{s: y_s = c} f(x_s)``, sent with the counts n_ic;
3. the server averages them per class weighted by the counts,
   ``C_bar_c = sum_i n_ic C_i^c / sum_i n_ic`` over the sampled clients that hold
   class c, and sends C_bar to every client.

Prediction (as the paper evaluates): the class of the nearest global prototype,
``argmin_c ||f(x) - C_bar_c||``. The reported loss is the cross-entropy of
``softmax_c(-||f(x) - C_bar_c||^2)`` (classes with no prototype get probability 0).

Choices where the paper left room:
- the squared distance is averaged over the d coordinates, as the authors' code
  (and PFLlib's) does with ``nn.MSELoss``; lam = 1 is the authors' default (``--ld``).
- local prototypes are computed after training with the trained body, as the
  paper's Algorithm 1 writes them (PFLlib averages the embeddings seen during
  training instead); the server weighs them by class counts (PFLlib: uniformly).
  They are taken in eval mode, as prediction uses them: with BatchNorm that is
  the running statistics, while training's features use the batch's, so on tiny
  clients the two can sit far apart (resnet18 on 6 digits a client diverged at
  lr 0.05 and trained at 0.005).
- a class without a global prototype contributes no regulariser, and its samples
  still count in the batch mean (as in PFLlib); the client's optimizer state
  persists across rounds (no model is downloaded).
- only sampled clients (``algorithm.fraction``) train and send prototypes; a class
  no sampled client holds keeps its previous global prototype.
- the gradient of the prototype term flows through the body: a custom step
  (``Clients.train(step=...)``), batched over clients with vmap (per-client loop
  for BatchNorm models or ``train.batched=off``).

Traffic: a sampled client sends C (d + 1) floats (its prototypes and counts);
every client receives the C d global prototypes. Models never travel, so the
mixing matrix is the identity. Logged per round: ``/fedproto/prototypes``
[N, C, d] (the local prototypes each client sent, NaN where it sent none) and
``/fedproto/class_count`` [N, C] (the counts it sent, 0 when not sampled): the
global prototypes of round t are their count-weighted means.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import vmap

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import identity_rows
from mpifl.algorithms.fedproto_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.state import transient
from mpifl.train import Step, StepView, loss_acc_from_probs, per_sample_loss
from mpifl.train.head import Head, find_head

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "FedProto: personal models; clients send per-class mean embeddings, the server averages them by class"
    " count; loss CE + `fedproto.lam` x distance to the global prototype; nearest-prototype prediction"
)
MIXING_ROW = "identity (models never travel)"


@dataclass
class State:
    protos: torch.Tensor  # [C, d] global prototypes, identical on every rank
    counts: torch.Tensor  # [C] samples behind each (0: no prototype yet)
    head: Head | None = transient(default=None)  # the model's body/head split


def init(ctx: Context) -> State:
    h = find_head(ctx.clients, ctx.cfg.model.name, "fedproto")
    dev = ctx.clients.device
    return State(protos=torch.zeros(h.n_classes, h.dim, device=dev), counts=torch.zeros(h.n_classes, device=dev),
                 head=h)


def make_step(head: Head, protos: torch.Tensor, counts: torch.Tensor, lam: float) -> Step:
    """The custom step: one optimizer step on CE + lam * mean-square distance to
    the global prototype of each sample's class."""
    has = (counts > 0).to(protos.dtype)

    def one(state: dict[str, torch.Tensor], x, y, w, bufs=None):
        h, z = head.forward_parts(state, x, bufs)
        ce = per_sample_loss(z, y)
        reg = ((h - protos[y]) ** 2).mean(-1) * has[y]
        return ((ce + lam * reg) * w).sum() / w.sum().clamp_min(1.0)

    batched = vmap(one, in_dims=(0, 0, 0, 0))

    def step(view: StepView, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        c, p, rows = view.clients, view.params, view.rows
        head.module.train()
        with torch.enable_grad():
            if c.rows_at_once:  # BatchNorm: each client its own statistics
                leaves = {k: v.detach().requires_grad_(True) for k, v in c.parts(p).items()}
                loss = batched(leaves, x, y, w)
                g = list(torch.autograd.grad(loss.sum(), list(leaves.values())))
            else:
                g = torch.empty_like(p)
                ls = []
                for i in range(len(rows)):
                    keep = w[i] > 0
                    leaves = {k: v[0].detach().requires_grad_(True) for k, v in c.parts(p[i:i + 1]).items()}
                    bufs = c.buffers_of(rows[i])
                    li = one(leaves, x[i][keep], y[i][keep], w[i][keep], bufs)
                    gi = torch.autograd.grad(li, list(leaves.values()))
                    c.write_parts(g[i:i + 1], dict(zip(leaves, (t[None] for t in gi))))
                    ls.append(li.detach())
                loss = torch.stack(ls)
        head.module.eval()
        view.step_(p, g)
        return loss.detach()

    return Step(step)


def local_prototypes(ctx: Context, head: Head, local: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class sums ``[m, C, d]`` of the body's embeddings of each listed client's
    training split under its own row, and the class counts ``[m, C]``."""
    c = ctx.clients
    sums = torch.zeros(len(local), head.n_classes, head.dim, device=c.device)
    counts = torch.zeros(len(local), head.n_classes, device=c.device)
    for sl, _, x, y, w in c.split_batches("train", local):
        h = head.features_of(c, c.params[torch.as_tensor(local[sl], device=c.device)], x, local[sl])
        onehot = F.one_hot(y, head.n_classes).to(h.dtype) * w[..., None]  # [m, b, C]
        sums[sl] = torch.bmm(onehot.transpose(1, 2), h)
        counts[sl] = onehot.sum(1)
    return sums, counts


def round(ctx: Context, state: State, t: int) -> Round:
    c, head = ctx.clients, state.head
    C, d = head.n_classes, head.dim
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    mine = ctx.local_of(sampled)
    loss = np.full(ctx.comm.n_local, np.nan)
    step = make_step(head, state.protos, state.counts, ctx.params.lam)
    loss[mine] = c.train(mine, ctx.cfg.train.local_epochs, t, step=step)

    sums, counts = local_prototypes(ctx, head, mine)
    # each sampled client sends its C prototypes and counts: sums travel instead of
    # means (the same C (d + 1) floats), so one Allreduce gives the weighted means
    rows = torch.zeros(ctx.comm.n_local, C * (d + 1), device=c.device)
    rows[torch.as_tensor(mine, device=c.device)] = torch.cat([sums.reshape(len(mine), C * d), counts], 1)
    sel = np.zeros(ctx.comm.n_local)
    sel[mine] = 1.0
    total = ctx.comm.weighted_sum(rows, sel)
    tot_sums, tot_counts = total[:C * d].reshape(C, d), total[C * d:]
    got = tot_counts > 0
    state.protos = torch.where(got[:, None], tot_sums / tot_counts.clamp_min(1.0)[:, None], state.protos)
    state.counts = torch.where(got, tot_counts, state.counts)
    ctx.comm.count(np.arange(ctx.comm.n_local), recv=C * d * ctx.comm.itemsize)

    sent = np.full((ctx.comm.n_local, C, d), np.nan, np.float32)
    cnt = np.zeros((ctx.comm.n_local, C), np.float32)
    if len(mine):
        mean = (sums / counts.clamp_min(1.0)[..., None]).cpu().numpy()
        mean[(counts == 0).cpu().numpy()] = np.nan
        sent[mine], cnt[mine] = mean, counts.cpu().numpy()
    return Round(train_loss=loss, mixing=identity_rows(ctx), extras={"prototypes": sent, "class_count": cnt})


def nearest_prototype_probs(h: torch.Tensor, protos: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``softmax_c(-||h - C_c||^2 / d)`` over the classes that have a prototype:
    its argmax is the nearest prototype."""
    dist = ((h[..., None, :] - protos) ** 2).mean(-1)  # [m, b, C]
    dist = dist.masked_fill(counts <= 0, float("inf"))
    return torch.softmax(-dist, -1)


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    c, head = ctx.clients, state.head
    out = {}
    for split in ("val", "test"):
        loss, acc = np.full(c.n, np.nan), np.full(c.n, np.nan)
        for sl, _, x, y, w in c.split_batches(split):
            local = np.arange(c.n)[sl]
            h = head.features_of(c, c.params[sl], x, local)
            loss[sl], acc[sl] = loss_acc_from_probs(nearest_prototype_probs(h, state.protos, state.counts), y, w)
        out[f"{split}_loss"], out[f"{split}_acc"] = loss, acc
    return out
