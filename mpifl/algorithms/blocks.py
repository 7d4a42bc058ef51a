"""The building blocks algorithms share: import them from here, not from another
algorithm's module (``tests/test_structure.py`` holds every algorithm to it; a
variant named after its parent, ``fedprox_ft`` of ``fedprox``, may build on it).

What to reach for:

- one global model as the state: :class:`GlobalModel`, :func:`init_global`,
  :func:`evaluate_global`;
- a FedAvg round from one global model, with a local objective or a server
  optimizer: :func:`step` (:func:`server_round` for a :class:`ServerState`; Adam's
  or Yogi's server step: :class:`ServerAdaptive`);
- the sampled clients download a model and train: :func:`local_update`; only the
  download (a shared part, a personal start): :func:`download`;
- the weights of an average: :func:`sampled_weights` (p over the sampled
  clients), :func:`group_weights` (within groups); FedAvg inside each of K
  groups with K models: :func:`cluster_fedavg`;
- a global model whose shared columns are averaged and personal ones stay in
  each client's row: :class:`PartState`, :func:`part_state`, :func:`part_round`,
  :func:`part_evaluate` (the layers to split on: :func:`last_layers`);
- evaluation: :func:`own_rows_metrics` (each client's own row, or one model),
  :func:`evaluate_global` (a state's global ``model``), :func:`finetuned_metrics`
  (after local fine-tuning, training state untouched; a global model fine-tuned
  so, and the best one by validation: :class:`FineTuneState`, :func:`track_best`);
- a mixing matrix of no collaboration: :func:`identity_rows`;
- k neighbours of a client by weight, exploring with probability eps:
  :func:`sample_neighbours`.

Also for authors: :mod:`mpifl.algorithms.state` (``per_client``, ``transient``
state fields), :mod:`mpifl.train.head` (the body/head split of a model),
:mod:`mpifl.algorithms.shared_params` (hyper-parameter sections to subclass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.shared_params import AdaptiveParams
from mpifl.algorithms.state import transient
from mpifl.errors import ConfigError
from mpifl.logging.mixing import Dense, Grouped, Shared
from mpifl.train import Clients, NonFiniteError, Objective, Step


def sampled_weights(ctx: Context, sampled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FedAvg's weights: (row [N]: p normalised over the ``sampled`` clients, 0
    elsewhere, the same on every rank; this rank's share of it [n_local], the
    weights of its rows in ``ctx.comm.weighted_sum``)."""
    row = np.zeros(ctx.N)
    row[sampled] = ctx.p[sampled] / ctx.p[sampled].sum()
    return row, row[ctx.comm.local_ids]


def group_weights(ctx: Context, groups: np.ndarray, sampled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FedAvg inside groups: (weights [N]: p normalised within each group's
    ``sampled`` members, 0 elsewhere; this rank's share [n_local]) for
    ``ctx.comm.grouped_sum`` with ``groups`` ([N] ids, the same on every rank)."""
    w = np.zeros(ctx.N)
    for k in np.unique(groups[sampled]):
        s = sampled[groups[sampled] == k]
        w[s] = ctx.p[s] / ctx.p[s].sum()
    return w, w[ctx.comm.local_ids]


def own_rows_metrics(ctx: Context, params: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """val/test loss and accuracy of each client's own row (or one shared model)."""
    out = {}
    for split in ("val", "test"):
        loss, acc = ctx.clients.evaluate(split, params)
        out[f"{split}_loss"], out[f"{split}_acc"] = loss, acc
    return out


def identity_rows(ctx: Context) -> Dense:
    """This rank's rows of the identity, sparse ``[n_local, N]`` (no dense
    ``n_local x N`` array at large N; ``.densify()`` gives the dense one)."""
    from scipy import sparse  # here: a run whose algorithm makes no sparse rows never loads it

    n = ctx.comm.n_local
    return Dense(sparse.csr_matrix((np.ones(n, np.float32), (np.arange(n), ctx.comm.local_ids)), shape=(n, ctx.N)))


def download(ctx: Context, start: torch.Tensor, mine: np.ndarray, cols: torch.Tensor | None = None) -> None:
    """Local clients ``mine`` (positions) receive ``start`` ([P], or [n_local, P] per
    client) as their rows, with a fresh optimizer; the model counts as received.
    ``cols``: only these columns of a [P] ``start`` (a shared part: FedRep's body), the
    rest of each row stays the client's own."""
    c = ctx.clients
    if len(mine):
        idx = torch.as_tensor(mine, device=c.device)
        if cols is None:
            c.params[idx] = start if start.dim() == 1 else start[idx]
        else:
            c.params[idx[:, None], cols[None, :]] = start[cols]
        c.reset_optimizer(idx)
        ctx.comm.count(mine, recv=(c.P if cols is None else len(cols)) * ctx.comm.itemsize, models=1)


def local_update(ctx: Context, start: torch.Tensor, sampled: np.ndarray, t: int,
                 objective: Objective | None = None, step: Step | None = None,
                 batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sampled local clients download ``start`` ([P], or [n_local, P] per client)
    and train E epochs from a fresh optimizer (on ``objective``: FedProx's pull;
    by ``step``: the algorithm's own step, on batches of ``batch_size`` samples,
    default ``train.batch_size``); returns (local positions, losses [n_local], NaN
    where a client did not train or its update was dropped)."""
    c = ctx.clients
    mine = ctx.local_of(sampled)
    download(ctx, start, mine)
    loss = np.full(ctx.comm.n_local, np.nan)
    loss[mine] = c.train(mine, ctx.cfg.train.local_epochs, t, objective=objective, step=step, batch_size=batch_size)
    return mine, loss


@dataclass
class GlobalModel:
    """The state of a method with one global model (FedAvg, FedProx, Per-FedAvg)."""

    model: torch.Tensor  # [P] the global model, identical on every rank


def init_global(ctx: Context) -> GlobalModel:
    """The global model at the clients' common initial model."""
    return GlobalModel(model=ctx.clients.init.clone())


def evaluate_global(ctx: Context, state: GlobalModel | ServerState, t: int) -> dict[str, np.ndarray]:
    """Every client's val/test metrics of the state's global ``model``."""
    return own_rows_metrics(ctx, state.model)


class ServerOptimizer(Protocol):
    """The server's step from the global model and the sampled clients' weighted
    average to the next global model (FedAvg: the average itself). Its state
    (momentum, moments) is a field of the algorithm's ``State``, so checkpoints
    keep it: a dataclass of tensors identical on every rank."""

    def step(self, model: torch.Tensor, average: torch.Tensor) -> torch.Tensor: ...

    # optional: ``key``, the config key of the step size (``fedadam.lr``), named when it diverges


@dataclass
class ServerState:
    """FedAvg's state where the server keeps its own (FedAvgM, FedAdam, FedYogi)."""

    model: torch.Tensor  # [P] the global model x, identical on every rank
    server: ServerOptimizer  # its momentum or moments (checkpointed)


def server_round(ctx: Context, state: ServerState, t: int) -> Round:
    """``round`` of an algorithm whose ``state.server`` steps from the average
    (FedAvgM, FedAdam, FedYogi: a :class:`ServerOptimizer`)."""
    state.model, out = step(ctx, state.model, t, ctx.cfg.algorithm.fraction, server=state.server)
    return out


# a loss past this many times log(classes) (a uniform guess's) at the model clients
# start from: the server's step threw it out (lr=10 for FedAdam: 1e5 times), not training
WILD_LOSS = 1000


def step(ctx: Context, model: torch.Tensor, t: int, fraction: float, objective: Objective | None = None,
         server: ServerOptimizer | None = None) -> tuple[torch.Tensor, Round]:
    """One FedAvg round from the global ``model`` [P]: the new model and the round
    (local training on ``objective`` when given; the new model is ``server``'s step
    from the clients' average, or the average itself)."""
    sampled = ctx.sample(t, fraction)
    try:
        _, loss = local_update(ctx, model, sampled, t, objective)
    except NonFiniteError as e:
        raise _diverged(ctx, model, server, t) or e from None
    row, w = sampled_weights(ctx, sampled)
    average = ctx.comm.weighted_sum(ctx.clients.params, w)
    return (average if server is None else server.step(model, average)), Round(train_loss=loss, mixing=Shared(row))


def _diverged(ctx: Context, model: torch.Tensor, server: ServerOptimizer | None, t: int) -> NonFiniteError | None:
    """The error naming the server's step size when the global model the clients
    started from already gives a wild loss (non-finite, or past :data:`WILD_LOSS`
    times a uniform guess's: the server's step diverged, not the clients'
    training); None otherwise."""
    key = getattr(server, "key", None)
    if key is None or ctx.clients.n == 0:
        return None
    loss, _ = ctx.clients.evaluate("train", model, np.arange(1))
    if np.all(loss <= WILD_LOSS * np.log(ctx.clients.n_classes)):  # NaN: not <=
        return None
    p = getattr(ctx.cfg, key.split(".")[0])
    return NonFiniteError(f"the global model the server's step made before round {t + 1} gives a loss of "
                          f"{float(loss[0]):.3g} on client {int(ctx.clients.ids[0])}'s training data: the "
                          f"server's step diverged; lower {key} (now {p.lr:g})")


@dataclass
class ServerAdaptive:
    """Adam's or Yogi's step on the average client update (a :class:`ServerOptimizer`)."""

    rule: Literal["adam", "yogi"]
    lr: float
    beta1: float
    beta2: float
    tau: float
    m: torch.Tensor  # [P] first moment, identical on every rank
    v: torch.Tensor  # [P] second moment

    @classmethod
    def fresh(cls, rule: Literal["adam", "yogi"], p: AdaptiveParams, model: torch.Tensor) -> ServerAdaptive:
        return cls(rule, p.lr, p.beta1, p.beta2, p.tau, torch.zeros_like(model),
                   torch.full_like(model, p.tau * p.tau))

    @property
    def key(self) -> str:
        """The config key of the step size, named when the step diverges."""
        return f"fed{self.rule}.lr"

    def step(self, model: torch.Tensor, average: torch.Tensor) -> torch.Tensor:
        delta = average - model
        self.m = self.beta1 * self.m + (1 - self.beta1) * delta
        d2 = delta * delta
        if self.rule == "adam":
            self.v = self.beta2 * self.v + (1 - self.beta2) * d2
        else:  # Yogi: v moves toward Delta^2 by at most (1 - beta2) Delta^2
            self.v = self.v - (1 - self.beta2) * d2 * torch.sign(self.v - d2)
        return model + self.lr * self.m / (torch.sqrt(self.v) + self.tau)


def cluster_fedavg(ctx: Context, models: torch.Tensor, cl: np.ndarray, t: int,
                 fraction: float) -> tuple[torch.Tensor, Round]:
    """One round of FedAvg inside each cluster of ``cl`` ([N] labels 0..K-1, the
    same on every rank) with ``models`` [K, P]: returns the new models and the round
    (Oracle with the true clusters, pFedLIA with the ones it found)."""
    sampled = ctx.sample(t, fraction)
    mine_cluster = torch.as_tensor(cl[ctx.comm.local_ids], device=models.device)
    _, loss = local_update(ctx, models[mine_cluster], sampled, t)

    w, wl = group_weights(ctx, cl, sampled)
    sums = ctx.comm.grouped_sum(ctx.clients.params, wl, cl[ctx.comm.local_ids], len(models))
    hit = torch.as_tensor(np.isin(np.arange(len(models)), cl[sampled]), device=sums.device)
    models = torch.where(hit[:, None], sums, models)

    # row i: w within i's cluster; a cluster with no sampled client keeps its
    # model (row e_i), which is the groups format's own rule
    return models, Round(train_loss=loss, mixing=Grouped(cl, w))


@dataclass
class PartState:
    """A global model whose shared columns are averaged, the personal ones kept by
    each client in its own row (FedBN, FedPer, LG-FedAvg, FedBABU)."""

    model: torch.Tensor  # [P] global model; only its shared columns are used
    shared: torch.Tensor = transient()  # [P_shared] column indices averaged (derived by init)
    personal: torch.Tensor = transient()  # [P - P_shared] column indices kept by each client


def part_state(c: Clients, personal_names: set[str]) -> PartState:
    """The state whose personal part is the named parameters (none: FedAvg)."""
    keep = torch.zeros(c.P, dtype=torch.bool, device=c.device)
    for s in c.slices(sorted(personal_names)):
        keep[s] = True
    return PartState(model=c.init.clone(), shared=torch.nonzero(~keep).flatten(),
                     personal=torch.nonzero(keep).flatten())


def part_round(ctx: Context, state: PartState, t: int, name: str, objective: Objective | None = None) -> Round:
    """One round: sampled clients download the shared columns, keep their personal
    ones, train E epochs (on ``objective``: FedBABU's frozen head); the shared
    columns become their p-weighted average. Logs ``personal_drift`` and the
    attribute ``<name>_personal_params``."""
    c, comm, shared = ctx.clients, ctx.comm, state.shared
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    mine = ctx.local_of(sampled)
    download(ctx, state.model, mine, shared)
    loss = np.full(comm.n_local, np.nan)
    loss[mine] = c.train(mine, ctx.cfg.train.local_epochs, t, objective=objective)
    row, w = sampled_weights(ctx, sampled)
    model = state.model.clone()
    model[shared] = comm.weighted_sum(c.params[:, shared], w)
    state.model = model
    p = state.personal
    drift = torch.linalg.vector_norm(c.params[:, p] - c.init[p], dim=1).double().cpu().numpy()
    attrs = {f"{name}_personal_params": len(p)} if t == 0 else {}
    return Round(train_loss=loss, mixing=Shared(row), extras={"personal_drift": drift}, attrs=attrs)


def part_evaluate(ctx: Context, state: PartState, t: int) -> dict[str, np.ndarray]:
    """Every client with the global shared part and its own personal part."""
    rows = ctx.clients.params.clone()
    rows[:, state.shared] = state.model[state.shared]
    return own_rows_metrics(ctx, rows)


def last_layers(ctx: Context, k: int, key: str) -> set[str]:
    """Parameter names of the model's last ``k`` layers; more than it has is refused, naming ``key``."""
    found = ctx.clients.layers()
    if k > len(found):
        raise ConfigError(f"{key}={k} is more than model.name={ctx.cfg.model.name!r}'s {len(found)} layers with "
                          f"parameters; allowed: at most {len(found)}", key)
    return {n for _, _, names in found[len(found) - k:] for n in names} if k else set()


@dataclass
class FineTuneState:
    """A global model fine-tuned before evaluation (FedAvg+FT, FedProx+FT), and the
    best one so far by mean validation accuracy (``start=best_val``)."""

    model: torch.Tensor  # [P] the global model, identical on every rank
    best: torch.Tensor | None = None  # [P] the global model of best mean val accuracy (start=best_val)
    best_acc: float = -1.0  # its mean validation accuracy over clients
    best_round: int = -1


def init_finetune(ctx: Context) -> FineTuneState:
    return FineTuneState(model=ctx.clients.init.clone())


def ft_epochs(ctx: Context) -> int:
    """The fine-tuning epochs: the chosen algorithm's ``ft_epochs``, 0 meaning DPFL's 2 * tau."""
    return ctx.params.ft_epochs or 2 * ctx.cfg.train.local_epochs


def track_best(ctx: Context, state: FineTuneState, out: Round, t: int) -> None:
    """Evaluate the new global model on every client's val split and keep it in
    ``state.best`` if its mean over clients beats the best so far. The mean is
    taken over all N clients' accuracies gathered in client order, so it is the
    same number on every rank and for every rank count."""
    _, acc = ctx.clients.evaluate("val", state.model)
    mean = float(np.nanmean(ctx.comm.allgather_rows(acc)))
    if state.best is None or mean > state.best_acc:
        state.best, state.best_acc, state.best_round = state.model.clone(), mean, t
    out.extras["global_val_acc"] = acc
    out.attrs["best_round"] = state.best_round


def finetuned_metrics(ctx: Context, model: torch.Tensor, epochs: int, t: int) -> dict[str, np.ndarray]:
    """val/test metrics of every client after ``epochs`` local epochs from ``model``
    [P] with a fresh optimizer; the clients' own rows and optimizer are untouched."""
    c = ctx.clients
    with c.using(model.repeat(c.n, 1)):
        c.train(np.arange(c.n), epochs, t, purpose="finetune")
        return own_rows_metrics(ctx)


def sample_neighbours(w: np.ndarray, i: int, k: int, eps: float, g: np.random.Generator) -> np.ndarray:
    """k ids != i for client i: uniform with probability eps, else the k largest
    ``w[j]``; one permutation of the others from ``g`` orders both cases (it is the
    uniform draw and the tie-break of the top-k). FedeRiCo's step 1, FedFomo's
    exploration."""
    explore = g.random() < eps
    others = np.delete(np.arange(len(w)), i)
    perm = g.permutation(others)
    if explore:
        return perm[:k]
    return perm[np.argsort(-w[perm], kind="stable")][:k]
