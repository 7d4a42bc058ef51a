"""FedeRiCo: Sui, Wen, Lau, Ross, Cresswell, "Find Your Friends: Personalized
Federated Learning with the Right Collaborators" (NeurIPS 2022 FL workshop,
arXiv:2210.06597). Decentralized EM: every client owns one model and learns
which other clients' models explain its data.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/federico-digits.yaml federico.eps=0.1 federico.k=3

Each round, for every client i (in parallel, on the rank hosting it), following
docs/algorithms.md (FedeRiCo):

1. sample neighbours S_i (k of them, never i) from its own seeded stream: with
   probability ``eps`` k uniform draws, else the k largest ``w_i[j]``, ties broken
   by that stream's permutation;
2. ``pull`` theta_j for j in S_i, point to point from the rank hosting j (each
   model travels once per destination rank);
3. E-step: loss L_i(theta_j) for j in S_i + {i} on local training batches,
   ``Lhat_i[j] <- (1-beta) Lhat_i[j] + beta L_i(theta_j)``, ``w_i = softmax(-Lhat_i / T)``;
4. M-step: ``g_ij = grad L_i(theta_j)`` on a local batch; ``w_i[j] g_ij`` is
   ``push``ed to j's owner, which sums ``G_j = sum_i w_i[j] g_ij`` (its own term
   included, nothing else) and takes one optimizer step;
5. prediction: mixture of output probabilities of the models client i holds this
   round (its own and the k pulled), weights w_i renormalised over them.

No rank ever holds more than its clients' models and the rows they pulled;
rank 0 only writes the log.

Choices where the paper is silent or docs/algorithms.md is our reading (stated there):
- Initial models (``init``): the paper's clients each own a model, and its
  EMA argument ("If one of the models, say theta_j, performs slightly better than
  other models for client i at the beginning of training...") presumes they start
  apart; its code base, FedEM, builds each learner with its own seed (seed +
  learner id). ``per_client`` (default) builds client i's model with a torch seed
  drawn from i's own stream (round -1, purpose ``federico/init``), so it does not
  depend on the ranks; ``shared`` starts every client from the run's one init (the
  runtime's ``clients.init``), where all models look alike at first and w starts
  uniform. BatchNorm buffers start from each client's build too.
- ``Lhat`` before any measurement (docs/algorithms.md allows 0 or the first measured
  loss): ``loss_init: first`` (default) fills client i's row, in round 0, with
  the loss it measures for its own model, so the models it has not measured yet
  look as good as its own (with ``init: shared`` that is every model's loss and w
  starts uniform). ``zero`` makes every
  unmeasured model look better than any measured one: in round 1 top-k then
  picks only unmeasured models and a client's weight on its own model collapses
  (exp(-beta L / T) against 1), which, with small temperatures, hands its model
  over to other clients' gradients.
- ``w = softmax(-s Lhat / temperature)`` with s = 1 (``loss_scale: mean``) or
  s = n_i^train (``sum``, the likelihood of the whole local set).
- The E-step loss and the M-step gradient come from the same draw: batch 0 of
  the round's plan gives both (one forward-backward per model); with
  ``estep_batches`` > 1 (or ``all``) the E-step loss averages over the further
  batches too, as the sample-weighted mean over all of them.
- The models a client holds for prediction are the pulled ones (before their
  owners' step) and its own model after its step: what a real client has at
  the end of the round.
- BatchNorm buffers do not travel: a client runs pulled models with its own
  running statistics (only params are exchanged, as the paper's gradients are).
- One optimizer step per round and model, on ``train`` (shared section): the
  paper's setting is Adam with lr 1e-3 and batch 50, which the jobs files set
  (``train.optimizer=adam train.lr=0.001``); the runtime's default is SGD.
- ``train.local_epochs`` is not used.
- ``mask: groups`` is an ablation, not the paper: w_i is zeroed outside client i's
  true group (the partition's clusters) and renormalised after every E-step (and
  at the start), so only group-mates' gradients and predictions are mixed; it
  separates learning who the group is from the EM weighting within it.

Logged per round: ``/federico/client_weights`` [N,N] (w after the E-step),
``/federico/tracked_loss`` [N,N] (Lhat), ``/federico/neighbours`` [N,k], and
``/graph/mixing`` (w restricted to S_i + {i}, renormalised: the prediction
weights). The runtime logs bytes and models received per client.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl import models
from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import sample_neighbours
from mpifl.algorithms.federico_params import Params, check_config  # noqa: F401 - re-exported
from mpifl.algorithms.state import per_client, transient
from mpifl.logging.mixing import Dense
from mpifl.train import loss_acc_from_probs, per_sample_loss
from mpifl.train.evaluation import clients_per_chunk

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedeRiCo: decentralized EM, k neighbours pulled point to point, weighted gradients pushed back"
MIXING_ROW = "i's prediction weights over itself and its neighbours"

PURPOSE = "federico/neighbours"
BATCH_PURPOSE = "federico/batch"
INIT_PURPOSE = "federico/init"


@dataclass
class State:
    tracked_loss: np.ndarray = per_client()  # [n_local, N] Lhat_i
    weights: np.ndarray = per_client()  # [n_local, N] w_i
    neighbours: np.ndarray = per_client()  # [n_local, k] S_i of the last round
    # pulled rows of the round in progress, for its prediction
    held: dict[int, torch.Tensor] = transient(default_factory=dict)


# --------------------------------------------------------------------------- the steps


def ema(tracked: np.ndarray, ids: np.ndarray, losses: np.ndarray, beta: float) -> np.ndarray:
    """Step 3: ``Lhat[j] <- (1-beta) Lhat[j] + beta L[j]`` for j in ids; others unchanged."""
    out = tracked.copy()
    out[ids] = (1 - beta) * tracked[ids] + beta * np.asarray(losses, dtype=tracked.dtype)
    return out


def client_weights(tracked: np.ndarray, temperature: float, scale: float = 1.0) -> np.ndarray:
    """Step 3: ``softmax(-scale * Lhat / temperature)`` over the last axis."""
    z = -scale * np.asarray(tracked, np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def group_mask(w: np.ndarray, mine: np.ndarray, cluster: np.ndarray) -> np.ndarray:
    """``federico.mask=groups``: rows of ``w`` (clients ``mine``) zeroed outside each
    client's true group and renormalised (the client itself is always inside)."""
    out = np.where(cluster[None, :] == cluster[mine][:, None], w, 0.0)
    return out / out.sum(-1, keepdims=True)


def held_weights(w: np.ndarray, held: np.ndarray) -> np.ndarray:
    """Step 5: ``w`` restricted to the ids held and renormalised (a row of mixing)."""
    out = np.zeros_like(w, dtype=np.float64)
    out[held] = w[held]
    return out / out.sum()


# --------------------------------------------------------------------------- contract


def init_seed(ctx: Context, i: int) -> int:
    """The torch seed of client i's initial model: its own stream (setup round -1),
    so a client's start does not depend on the ranks or on the other clients."""
    return int(ctx.rng(-1, int(i), INIT_PURPOSE).integers(2**63 - 1))


def init_rows(ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
    """``federico.init=per_client``: (params, buffers) rows of this rank's clients,
    each built by ``models.build`` with the client's own seed."""
    c, d = ctx.clients, ctx.data
    built = [models.build(ctx.cfg.model, d.in_shape, d.n_classes, init_seed(ctx, i)) for i in ctx.comm.local_ids]
    rows = [c.flatten(m) for m in built]
    params = torch.stack([p for p, _ in rows]).to(c.params)
    buffers = torch.stack([b for _, b in rows]).to(c.buffers)
    return params, buffers


def init(ctx: Context) -> State:
    n, N, k = ctx.comm.n_local, ctx.N, ctx.params.k
    if ctx.params.init == "per_client" and n:
        # (a resumed run overwrites these rows from its checkpoint)
        ctx.clients.params[:], ctx.clients.buffers[:] = init_rows(ctx)
    tracked = np.zeros((n, N))
    weights = client_weights(tracked, ctx.params.temperature)
    if ctx.params.mask == "groups":  # round 1's top-k already picks group-mates first
        weights = group_mask(weights, ctx.comm.local_ids, ctx.data.cluster)
    return State(tracked_loss=tracked, weights=weights, neighbours=np.zeros((n, k), np.int64))


def _scales(ctx: Context) -> np.ndarray:
    if ctx.params.loss_scale == "sum":
        return ctx.clients.sizes[:, 0].astype(np.float64)
    return np.ones(ctx.comm.n_local)


def _estep_batches(ctx: Context) -> int | None:
    e = ctx.params.estep_batches
    return None if e == "all" else int(e)


def round(ctx: Context, state: State, t: int) -> Round:
    f, c, comm = ctx.params, ctx.clients, ctx.comm
    n, ids = comm.n_local, comm.local_ids
    # 1. neighbours, from each client's own stream and its own weights
    # (every rank hosts at least one client: config validation sees to it)
    S = np.stack([sample_neighbours(state.weights[r], int(i), f.k, f.eps, ctx.rng(t, int(i), PURPOSE))
                  for r, i in enumerate(ids)])
    # 2. pull the neighbours' models (copies, as they are before this round's step)
    held = comm.pull(c.params, {r: S[r].tolist() for r in range(n)})

    # 3./4. loss and gradient of every held model on the client's batch 0
    local = np.arange(n)
    plan = c.plan(local, 1, t, BATCH_PURPOSE, max_batches=_estep_batches(ctx))
    members = np.concatenate([S, ids[:, None]], axis=1)  # [n, k+1]: neighbours, then self
    rows_of = np.repeat(local, f.k + 1)
    # the round's two largest temporaries, [n (k+1), P] each, in buffers kept from round to round
    models = torch.stack([held[int(j)] if j != ids[r] else c.params[r]
                          for r, js in enumerate(members) for j in js], out=c.scratch("federico/models", len(rows_of)))
    x, y, w = c.batch(plan.idx[rows_of, 0])
    grads, loss0 = c.grads(models, x, y, w, rows_of, out=c.scratch("federico/grads", len(rows_of)))
    loss_sum = loss0.detach().double().cpu().numpy() * w.sum(1).double().cpu().numpy()
    seen = w.sum(1).double().cpu().numpy()
    for s in range(1, plan.steps):  # further E-step batches: losses only
        xs, ys, ws = c.batch(plan.idx[rows_of, s])
        ls, ns = _batch_losses(ctx, models, xs, ys, ws, rows_of)
        loss_sum += ls
        seen += ns
    losses = (loss_sum / np.maximum(seen, 1)).reshape(n, f.k + 1)

    scales = _scales(ctx)
    if t == 0 and f.loss_init == "first":
        state.tracked_loss[:] = losses[:, f.k:]
    for r in range(n):
        state.tracked_loss[r] = ema(state.tracked_loss[r], members[r], losses[r], f.beta)
    state.weights = client_weights(state.tracked_loss, f.temperature, scales[:, None])
    if f.mask == "groups":
        state.weights = group_mask(state.weights, ids, ctx.data.cluster)

    wij = torch.as_tensor(state.weights[rows_of, members.reshape(-1)], dtype=grads.dtype, device=grads.device)
    scaled = grads.mul_(wij[:, None]).reshape(n, f.k + 1, -1)  # in place: [n (k+1), P] is the round's largest
    contributions = {r: {int(j): scaled[r, q] for q, j in enumerate(S[r])} for r in range(n)}
    G = comm.push(contributions, c.P, device=c.device)
    G.add_(scaled[:, f.k])  # the owner's own term never leaves the client
    c.apply_gradient(G)
    c.count(local, 1, (plan.idx[:, 0] >= 0).sum(1))  # one step, on batch 0 (the E-step's others: losses only)

    state.neighbours = S
    state.held = held
    mixing = np.stack([held_weights(state.weights[r], members[r]) for r in range(n)])
    return Round(
        train_loss=losses[:, f.k].copy(),
        mixing=Dense(mixing.astype(np.float32)),
        extras={"client_weights": state.weights.astype(np.float32),
                "tracked_loss": state.tracked_loss.astype(np.float32),
                "neighbours": S.astype(np.int64)},
    )


@torch.no_grad()
def _batch_losses(ctx: Context, models: torch.Tensor, x, y, w, rows_of) -> tuple[np.ndarray, np.ndarray]:
    """(sum of per-sample losses, samples) of each model row on its batch."""
    logits = ctx.clients.logits(models, x, rows_of)
    ce = per_sample_loss(logits, y)
    return (ce * w).sum(1).double().cpu().numpy(), w.sum(1).double().cpu().numpy()


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    """Step 5 on each client's val and test split."""
    c, comm, k = ctx.clients, ctx.comm, ctx.params.k
    n, ids = comm.n_local, comm.local_ids
    out = {}
    members = np.concatenate([state.neighbours, ids[:, None]], axis=1)
    for split in ("val", "test"):
        loss, acc = np.full(n, np.nan), np.full(n, np.nan)
        idx_all = c.split_index(np.arange(n), split)
        if idx_all.shape[1]:
            step = max(1, clients_per_chunk(c, idx_all.shape[1]) // (k + 1))
            for a in range(0, n, step):
                rs = np.arange(a, min(n, a + step))
                x, y, w = c.batch(idx_all[rs])
                # the q-th held model of every client at once, on the clients' own inputs:
                # k + 1 calls instead of one on k + 1 copies of the inputs
                probs = torch.stack([torch.softmax(c.logits(torch.stack(
                    [state.held[int(members[r][q])] if members[r][q] != ids[r] else c.params[r] for r in rs],
                    out=c.scratch("federico/evaluate", len(rs))), x, rs), -1) for q in range(k + 1)], 1)
                mix = torch.as_tensor(np.stack([held_weights(state.weights[r], members[r])[members[r]]
                                                for r in rs]), dtype=probs.dtype, device=probs.device)
                probs = (probs * mix[:, :, None, None]).sum(1)
                loss[rs], acc[rs] = loss_acc_from_probs(probs, y, w)
        out[f"{split}_loss"], out[f"{split}_acc"] = loss, acc
    return out
