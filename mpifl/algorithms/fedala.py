"""FedALA: Zhang, Hua, Wang, Shen, Guan, Wang, Ma, "FedALA: Adaptive Local
Aggregation for Personalized Federated Learning", AAAI 2023.

The server is FedAvg's: Theta^t = sum_{i in S_t} p_i theta_i / sum_{i in S_t} p_i
over the round's sampled clients' uploads. A client does not overwrite its model
with Theta: it aggregates the two element by element (Eq. 4-5),

    theta^_i = theta_i + (Theta - theta_i) (.) W_i        on its top p layers,
    theta^_i = Theta                                      on the lower ones (W = 1),

with W_i element-wise weights in [0, 1] it learns (Eq. 6) on a random s% of its
training data D_i^s, by gradient descent of the loss of theta^_i with the model
weights frozen, each step clipped to [0, 1]:

    W_i <- clip(W_i - eta grad_{W_i} L(theta^_i; D_i^s), 0, 1),
    grad_{W_i} L = grad_{theta^} L (.) (Theta - theta_i).

In round t each sampled client i (Algorithm 1)

1. receives Theta^t; in round 1 (t = 0) its model is the initial Theta^0 and
   ALA is skipped (theta^_i = Theta^0); the first time it adapts (the paper's
   "start phase", t = 2 in its counting) W_i starts at ones and trains epoch by
   epoch over D_i^s until the population std of its last ``fedala.num_pre_loss``
   epoch losses is below ``fedala.threshold``; every later time, one epoch from
   the W_i it kept;
2. trains theta^_i E epochs (``train.local_epochs``) from a fresh optimizer and
   sends the result back as its new theta_i.

eta = ``fedala.eta``, s = ``fedala.rand_percent``, p = ``fedala.layers``.
Clients are evaluated on their own theta_i (Algorithm 1's output, the trained
local models), or with ``fedala.evaluate=adapted`` on the theta^_i their ALA makes
from the new global model (what the authors' code and PFLlib report).

    python -m mpifl.main jobs/quickstart.yaml algorithm.name=fedala fedala.layers=1 fedala.rand_percent=80

Reductions: ``fedala.layers=0`` (no layer adapts) and ``fedala.eta=0`` (W_i stays
at ones, theta^_i = Theta) are FedAvg bit for bit: theta^_i is computed as
Theta + (theta_i - Theta) (.) (1 - W_i), algebraically the same, which is Theta
exactly at W = 1 (tests/mpi/algorithms/test_fedala.py).

Choices where the paper leaves room:

- A layer is a module holding parameters of its own, counted from the output, as
  FedPer's (``Clients.layers``); the default p = 1 is the classifier, the paper's
  p = 1 (PFLlib's ``-p 2`` counts its weight and bias tensors, ``main.py``'s
  "more fine-grained than its original paper").
- Sampling and weights are FedAvg's (``algorithm.fraction``, p-weighted); only the
  sampled clients receive Theta and adapt (the paper's I^t). The start phase is
  each client's first adaptation, which at ``algorithm.fraction=1`` is the paper's
  t = 2 for every client; a client first sampled later adapts from the initial
  model it holds.
- D_i^s is drawn afresh every round, without replacement, max(1, floor(s n_i /
  100)) of the n_i training samples (PFLlib, ``utils/ALA.py:73``, takes a
  contiguous window of the client's list at a random start). Its epochs go in
  batches of ``train.batch_size``, each epoch reshuffled.
- "Until converged": the criterion is the authors' code's (threshold 0.1 on the
  std of the last 10 losses, PFLlib's defaults), on each epoch's mean loss (PFLlib,
  ``utils/ALA.py:142``, records the epoch's last batch's loss and asks for more than
  ``num_pre_loss`` of them, ``:150``); at most ``fedala.start_limit`` epochs, where
  PFLlib has no bound.
- W_i steps by plain gradient descent at eta, whatever ``train.optimizer``; a
  client's optimizer restarts for its local training every round, as FedAvg's.
  W's forward passes normalise a BatchNorm model's batches by their own statistics
  and leave the client's running statistics as they were (PFLlib's ALA trains a
  copy of the model).
- Which model is evaluated is mpifl's choice (``fedala.evaluate``). ``trained`` (the
  default) evaluates theta_i, as mpifl's other personalized methods evaluate the
  model a client trained; ``adapted`` evaluates, for every client, the theta^_i of
  an ALA from Theta^{t+1} (one epoch of W, a start phase for a client that has not
  had one) run on copies of W_i, as PFLlib's ``serverala.py:26-31`` evaluates after
  ``send_models``; nothing of it is kept, its batches come from streams of their own.

Batched: every training path; W's steps are an algorithm step (``mpifl.train.Step``)
on the rank's adapting clients together, each on its own D_i^s, the start-phase
clients dropping out as they converge. State: the global model [P] (identical on
every rank), W_i [n_local, P_top] and whether each client has had its start phase
(checkpointed). Logged: the mixing row (p over the sampled clients),
``/fedala/weight_mean`` [N, p] (the mean of W_i over each adapted layer, from the
output inward; ones until a client adapts), ``/fedala/ala_epochs`` (epochs of W this
round, 0 where it did not adapt) and the attributes ``fedala_layers`` (the layers'
names) and ``fedala_ala_params`` (P_top).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import local_update, own_rows_metrics, sampled_weights
from mpifl.algorithms.fedala_params import Params
from mpifl.algorithms.state import per_client, transient
from mpifl.errors import ConfigError
from mpifl.logging.mixing import Shared
from mpifl.train import Step, StepView

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = ("FedALA: FedAvg's server; each client starts from theta_i + (Theta - theta_i) W_i on its top "
           "`fedala.layers` layers, W_i in [0, 1] learned on `fedala.rand_percent`% of its data")
MIXING_ROW = "p over sampled clients (each client then weighs it by W_i)"


@dataclass
class State:
    model: torch.Tensor  # [P] global model Theta^t, identical on every rank
    W: torch.Tensor = per_client()  # [n_local, P_top] aggregation weights W_i of the top layers' columns
    started: np.ndarray = per_client()  # [n_local] bool: the client has had its start phase
    top: torch.Tensor = transient()  # [P_top] the top layers' columns (derived by init)
    groups: list = transient()  # per adapted layer, from the output: (name, its positions in top)


def init(ctx: Context) -> State:
    c, k = ctx.clients, ctx.params.layers
    found = c.layers()
    if k > len(found):
        raise ConfigError(f"fedala.layers={k} is more than model.name={ctx.cfg.model.name!r}'s {len(found)} layers "
                          f"with parameters; allowed: at most {len(found)}", "fedala.layers")
    chosen = found[len(found) - k:][::-1] if k else []
    cols = [torch.cat([torch.arange(s.start, s.stop) for s in c.slices(names)]) for _, _, names in chosen]
    top = torch.cat(cols).to(c.device) if cols else torch.zeros(0, dtype=torch.long, device=c.device)
    ends = np.cumsum([0, *(len(x) for x in cols)])
    groups = [(name, slice(int(a), int(b))) for (name, _, _), a, b in zip(chosen, ends[:-1], ends[1:])]
    return State(model=c.init.clone(), W=torch.ones(c.n, len(top), dtype=c.init.dtype, device=c.device),
                 started=np.zeros(c.n, bool), top=top, groups=groups)


def ala_subsets(ctx: Context, mine: np.ndarray, t: int, purpose: str) -> list[np.ndarray]:
    """D_i^s of each client ``mine`` (positions) for round t, from the stream of
    ``purpose``: indices into the rank's samples."""
    c, s = ctx.clients, ctx.params.rand_percent
    out = []
    for k in mine:
        lo, hi = c.split_range(int(k), "train")
        m = max(1, (hi - lo) * s // 100) if hi > lo else 0
        g = ctx.rng(t, int(c.ids[k]), f"{purpose}/sample")
        out.append(lo + np.sort(g.choice(hi - lo, m, replace=False) if m else np.zeros(0, np.int64)))
    return out


def weight_step(top: torch.Tensor, centre: torch.Tensor, eta: float) -> Callable[..., torch.Tensor]:
    """Eq. 6 on a batch: W <- clip(W + eta g (.) d, 0, 1) with d = theta_i - Theta on the
    top columns (``view["d"]``), then theta^'s top columns Theta + d (.) (1 - W)."""

    def fn(view: StepView, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        hat, W, d = view.params, view["W"], view["d"]
        g, loss = view.grads(hat, x, y, w)
        W.add_(g[:, top] * d, alpha=eta).clamp_(0, 1)
        hat[:, top] = centre + d * (1 - W)
        return loss

    return fn


def converged(losses: list[float], f: Params) -> bool:
    """The start phase's end: the std of the last ``num_pre_loss`` losses below the
    threshold (or a non-finite loss: a dropped update ends it)."""
    if losses and not math.isfinite(losses[-1]):
        return True
    return len(losses) >= f.num_pre_loss and float(np.std(losses[-f.num_pre_loss:])) < f.threshold


def adapt(ctx: Context, state: State, mine: np.ndarray, t: int,
          purpose: str = "fedala") -> tuple[torch.Tensor, np.ndarray]:
    """ALA for clients ``mine`` (positions), updating ``state.W`` and ``state.started``
    (batches from the streams of ``purpose``): (theta^ rows [n_local, P], Theta in the
    rows of the others; the epochs of W each client took)."""
    c, f, top = ctx.clients, ctx.params, state.top
    centre = state.model[top]
    d = c.params[:, top] - centre  # theta_i - Theta, [n_local, P_top]
    hat = state.model.repeat(c.n, 1)
    hat[:, top] = centre + d * (1 - state.W)  # a client before its start phase has W_i at ones (init)
    subsets = dict(zip(mine.tolist(), ala_subsets(ctx, mine, t, purpose)))
    step = Step(weight_step(top, centre, f.eta), {"W": state.W, "d": d})
    epochs = np.zeros(c.n, np.int64)
    history: dict[int, list[float]] = {k: [] for k in subsets}
    active = mine
    stats = c.buffers.clone() if c.buffers.shape[1] else None
    with c.using(hat):
        for e in range(f.start_limit):
            loss = c.train(active, 1, t, purpose=f"{purpose}/{e}", subsets=[subsets[k] for k in active.tolist()],
                           step=step)
            epochs[active] += 1
            for k, v in zip(active.tolist(), loss.tolist()):
                history[k].append(v)
            active = np.array([k for k in active.tolist() if not state.started[k] and not converged(history[k], f)],
                              np.int64)
            if not len(active):
                break
    if stats is not None:  # W's passes leave BatchNorm's running statistics as they were (PFLlib's ALA runs a copy)
        c.buffers.copy_(stats)
    state.started[mine] = True
    return hat, epochs


def layer_means(state: State) -> np.ndarray:
    """[n_local, p] the mean of W_i over each adapted layer's columns, from the output."""
    return np.stack([state.W[:, s].double().mean(1).cpu().numpy() for _, s in state.groups], axis=1) \
        if state.groups else np.zeros((len(state.W), 0))


def round(ctx: Context, state: State, t: int) -> Round:
    c = ctx.clients
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    mine = ctx.local_of(sampled)
    start, epochs = state.model, np.zeros(c.n, np.int64)
    if t > 0 and len(state.top) and len(mine):
        start, epochs = adapt(ctx, state, mine, t)
    _, loss = local_update(ctx, start, sampled, t)
    row, w = sampled_weights(ctx, sampled)
    state.model = ctx.comm.weighted_sum(c.params, w)
    attrs = {"fedala_layers": [n for n, _ in state.groups], "fedala_ala_params": len(state.top)} if t == 0 else {}
    return Round(train_loss=loss, mixing=Shared(row), extras={"weight_mean": layer_means(state), "ala_epochs": epochs},
                 attrs=attrs)


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    """Every client on theta_i, or (``fedala.evaluate=adapted``) on the theta^_i its ALA
    makes from the new global model, run on copies of W_i and of the start-phase flags
    (its batches from streams of their own): nothing of it is kept."""
    if ctx.params.evaluate == "trained" or not len(state.top) or ctx.clients.n == 0:
        return own_rows_metrics(ctx)
    trial = replace(state, W=state.W.clone(), started=state.started.copy())
    hat, _ = adapt(ctx, trial, np.arange(ctx.clients.n), t, "fedala-eval")
    return own_rows_metrics(ctx, hat)
