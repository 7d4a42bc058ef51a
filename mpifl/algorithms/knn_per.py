"""kNN-Per: Marfoq, Neglia, Vidal, Kameni, Bellet, "Personalized Federated
Learning through Local Memorization" (ICML 2022). FedAvg trains one global
model; at evaluation every client interpolates the model's prediction with a
k-nearest-neighbour classifier over a datastore of its own training embeddings.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=knn_per knn_per.k=10 knn_per.lam=0.5

Training is FedAvg's (``blocks.step``). At evaluation client i, with the global
model's body phi (everything before the last ``nn.Linear``, ``mpifl.train.head``):

1. datastore ``S_i = {(phi(x_j), y_j)}`` over its training split;
2. for a query x, its k nearest entries N_k(x) in S_i (Euclidean distance d);
3. ``p_kNN(y|x) = sum_{j in N_k(x), y_j = y} exp(-d_j^2 / T) / sum_{j in N_k(x)} exp(-d_j^2 / T)``
   (the paper's Gaussian kernel; T = ``knn_per.temperature``);
4. ``p(y|x) = lam p_kNN(y|x) + (1 - lam) softmax(f(x))_y``.

With lam = 0 this is FedAvg's evaluation; k = 10 and lam = 0.5 are DPFL's
settings (its appendix F.6).

Choices where the paper left room:
- the kernel is normalised over the k neighbours (a softmax of -d^2 / T), so
  far-apart embeddings cannot underflow every weight to zero; a client with fewer
  than k training samples uses all of them.
- the neighbour search is exact: ``torch.cdist`` + ``topk`` on the rank's device,
  batched over clients: faster than scikit-learn's NearestNeighbors fitted per
  client on small datastores, even at 500 samples a client (bench/README.md
  "kNN-Per neighbour search").
- lam is one value for every client (the paper tunes it per client on validation
  data; DPFL fixes it).
- the datastore is rebuilt at every evaluation from the current global model and
  is never kept (nothing beyond FedAvg's state is checkpointed).

Logged: FedAvg's mixing row every round. kNN-Per's gain over its own global
model is this run's accuracy against a FedAvg run with the same seed (or
``knn_per.lam=0``): the paper's comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import step
from mpifl.algorithms.knn_per_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.state import transient
from mpifl.train import loss_acc_from_probs
from mpifl.train.head import Head, find_head

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "kNN-Per: FedAvg, then each client interpolates `knn_per.lam` x kNN (`knn_per.k` neighbours among its"
    " training embeddings) with the model"
)
MIXING_ROW = "as fedavg"


@dataclass
class State:
    model: torch.Tensor  # [P] the global model, identical on every rank
    head: Head | None = transient(default=None)


def init(ctx: Context) -> State:
    return State(model=ctx.clients.init.clone(), head=find_head(ctx.clients, ctx.cfg.model.name, "knn_per"))


def round(ctx: Context, state: State, t: int) -> Round:
    state.model, out = step(ctx, state.model, t, ctx.cfg.algorithm.fraction)
    return out


def knn_probs(store: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, query: torch.Tensor, k: int,
              n_classes: int, temperature: float) -> torch.Tensor:
    """``[m, b, C]`` kNN label distributions of queries ``[m, b, d]`` among each
    row's datastore ``store [m, n, d]`` (``labels [m, n]``, ``valid [m, n]`` bool)."""
    d2 = torch.cdist(query, store).square_()
    d2.masked_fill_(~valid[:, None, :], float("inf"))
    kk = min(k, store.shape[1])
    near, at = torch.topk(d2, kk, dim=-1, largest=False)  # [m, b, kk]
    kern = torch.softmax(-near / temperature, -1)  # inf distance (padding): weight 0
    lab = labels.gather(1, at.reshape(len(at), -1)).reshape(at.shape)
    return label_sums(lab, kern, n_classes)


def label_sums(lab: torch.Tensor, kern: torch.Tensor, n_classes: int) -> torch.Tensor:
    """``[..., C]``: per class, the sum of the ``kern`` weights of the neighbours with
    that label (``lab``, ``kern`` ``[..., kk]``)."""
    if kern.device.type == "cpu":
        out = torch.zeros(*kern.shape[:-1], n_classes, dtype=kern.dtype, device=kern.device)
        return out.scatter_add_(-1, lab, kern)
    # On a GPU scatter_add_ adds neighbours of one label with atomics, in no fixed order, so
    # the bits would change from run to run (a resumed run would not equal a straight one)
    return one_hot_sums(lab, kern, n_classes)


def one_hot_sums(lab: torch.Tensor, kern: torch.Tensor, n_classes: int) -> torch.Tensor:
    """:func:`label_sums` by a one-hot product summed by a reduction: the same bits every time."""
    return (torch.nn.functional.one_hot(lab, n_classes).to(kern.dtype) * kern[..., None]).sum(-2)


def interpolated_metrics(ctx: Context, model: torch.Tensor, head: Head) -> dict[str, np.ndarray]:
    """val/test loss and accuracy of lam p_kNN + (1 - lam) p_model per local client."""
    c, kp = ctx.clients, ctx.params
    local = np.arange(c.n)
    out: dict[str, np.ndarray] = {}
    train = c.split_index(local, "train")
    for split in ("val", "test"):
        loss, acc = np.full(c.n, np.nan), np.full(c.n, np.nan)
        for sl, _, x, y, w in c.split_batches(split, local):
            # the datastore: the chunk's training embeddings under the global model
            rows = model.expand(len(x), -1)  # read-only copies: a stride-0 view
            xs, ys, ws = c.batch(train[sl])
            store = head.features_of(c, rows, xs, local[sl])
            query = head.features_of(c, rows, x, local[sl])
            p = (1 - kp.lam) * torch.softmax(c.shared_logits(model, x, local[sl]), -1)
            if kp.lam:
                p += kp.lam * knn_probs(store, ys, ws > 0, query, kp.k, c.n_classes, kp.temperature)
            loss[sl], acc[sl] = loss_acc_from_probs(p, y, w)
        out[f"{split}_loss"], out[f"{split}_acc"] = loss, acc
    return out


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return interpolated_metrics(ctx, state.model, state.head)
