"""FedC2I ("Influence-Oriented Personalized Federated Learning"; docs/algorithms.md):
each client aggregates the others' models with its own weights, measured by
leave-one-out influence at the client level (feature extractor) and at the
class level (one classifier row per class).

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/fedc2i-featshift.yaml run.threads=1 fedc2i.alpha=5

Every round t, each client i, from the models theta_j uploaded at the end of t-1:

1. Client level: theta^{-j} = mean_{m != j} theta_m, built from the running sum
   S = sum_m theta_m (one Allreduce) as (S - theta_j) / (N - 1); l_i^{-j} is its
   loss on one random batch of D_i^train; a_i = softmax_j(alpha * l_i^{-j}).
   The models reach the clients by ``comm.ring`` (a rank holds its own block and
   one incoming block) and the sum ``sum_j a_i[j] theta_j`` is accumulated during
   that single pass with a running-max (online) softmax, so no second pass.
2. Class level: with the batch features h = phi(x) computed once, row c of the
   averaged classifier Vbar is replaced by v_c^{-j} = mean_{m != j} v_{m,c}; only
   logit c changes, so every (j, c) loss l_i^{-j,c} comes from one einsum and a
   log-sum-exp without column c. M_i[:, c] = softmax_j(alpha * l_i^{-j,c}).
3. phi_i = sum_j a_i[j] phi_j; v_{i,c} = sum_j M_i[j,c] v_{j,c}.
4. E local epochs (the optimizer restarts each round).

Our reading where the paper's equations leave room (docs/algorithms.md):
- leave-one-out means are unweighted (every client counts 1/(N-1));
- the classifier is the last ``nn.Linear`` (rows v_c = [W_c, b_c]); it is found
  from the model, so the split works for any model whose output is that layer;
- the class-level losses are measured on the features the client will use this
  round: sum_j a_i[j] phi_j (full method), its own phi_i (class_only_local) or
  the unweighted mean phi (class_only_global). docs/algorithms.md does not say which
  features; this keeps the measurement consistent with the model being built;
- BatchNorm models evaluate every model with the client's own running stats
  (buffers are never exchanged, as in the other algorithms).

Ablations (``fedc2i.ablation``, the paper's Table 3): ``client_only`` aggregates
the whole model with a_i; ``class_only_local`` keeps phi_i local and aggregates
the classifier with M_i; ``class_only_global`` uses the unweighted mean phi and
aggregates the classifier with M_i. What an ablation does not measure is logged
as NaN. ``mixing`` is the weight each client gives each model's feature
extractor: a_i (none, client_only), identity (class_only_local), 1/N
(class_only_global).

The paper trains with Adam lr 1e-3, 2 local epochs, batch 32: the ``train``
section is shared, so the ``jobs/fedc2i-*.yaml`` files set these.

Logs per round: /fedc2i/influence [R,N,N] (a), /fedc2i/class_influence
[R,N,N,C] (M), /graph/mixing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Interrupt, Round
from mpifl.algorithms.blocks import identity_rows, own_rows_metrics
from mpifl.algorithms.fedc2i_params import Params, check_config  # noqa: F401 - re-exported
from mpifl.algorithms.state import transient
from mpifl.logging.mixing import Dense
from mpifl.train import Clients, per_sample_loss
from mpifl.train.head import Head, find_head

# leave-one-out models scored in one engine call: bounds the call's activations
# (LOO_ROWS x the rank's clients x a batch) and is where a stop signal is heard
LOO_ROWS = 64

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedC2I: client- and class-level influence by leave-one-out models passed around the ring"
MIXING_ROW = "the influence vector a_i"


@dataclass
class State:
    head: Head = transient()  # derived from the model by init: nothing to checkpoint


@dataclass
class Aggregation:
    """One round's influence-oriented aggregation on this rank."""

    rows: torch.Tensor  # [n_local, P] the clients' new starting models
    influence: np.ndarray  # [n_local, N] a (NaN where not measured)
    class_influence: np.ndarray  # [n_local, N, C] M (NaN where not measured)
    mixing: np.ndarray  # [n_local, N]


def init(ctx: Context) -> State:
    return State(head=find_head(ctx.clients, ctx.cfg.model.name, "fedc2i"))


# --------------------------------------------------------------------------- measurements


def loo_losses(c: Clients, loo: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
               stop: Interrupt | None = None) -> torch.Tensor:
    """``[m, b]`` mean loss of each model row ``loo [b, P]`` on each local client's
    batch ``x [m, bs, ...]`` (client i's BatchNorm stats where the model has any).
    A stop signal (``stop.requested``) leaves the remaining rows' losses at zero:
    the round is being abandoned."""
    m, bs = y.shape
    b = loo.shape[0]
    out = torch.zeros(b, m, bs, c.n_classes, dtype=loo.dtype, device=loo.device)
    if c.rows_at_once:  # no BatchNorm: LOO_ROWS models on every client's batch in one call
        flat = x.reshape(1, m * bs, *x.shape[2:])
        for a in range(0, b, LOO_ROWS):
            if stop is not None and stop.requested:
                break
            rows = loo[a:a + LOO_ROWS]
            out[a:a + len(rows)] = c.logits(rows, flat.expand(len(rows), *flat.shape[1:])).reshape(len(rows), m, bs, -1)
    else:  # BatchNorm: each client its own statistics, one model row for every client at once
        local = np.arange(m)
        for j in range(b):
            if stop is not None and stop.requested:
                break
            out[j] = c.logits(loo[j].expand(m, -1), x, local)
    ce = per_sample_loss(out, y.expand(b, m, bs))
    return ((ce * w).sum(-1) / w.sum(-1).clamp_min(1.0)).T


def class_losses(h: torch.Tensor, y: torch.Tensor, w: torch.Tensor, v: torch.Tensor, bias: bool) -> torch.Tensor:
    """``[m, N, C]``: loss of the averaged classifier with row c replaced by the
    leave-j-out mean v_c^{-j}, on features ``h [m, bs, d]`` of each local batch.

    ``v [N, C, D]`` are every client's classifier rows, S_c = sum_j v_jc. Only
    logit c changes, from z_c = h . S_c / N to u_jc = h . (S_c - v_jc) / (N - 1),
    so with r_c = log-sum-exp of the other logits the loss of a sample is
    softplus(r_c - u_jc) + [y != c] (u_jc - z_y). One ``[m*bs, D] x [D, N*C]``
    matmul gives every u; the second term is linear in u, so its batch mean is
    taken on the features before the matmul (a ``[m, C, D]`` tensor).

    The softplus is written as relu(x) + log(1 + exp(-|x|)) with in-place ops
    on the one ``[m, bs, N, C]`` buffer: torch's CPU ``softplus``/``log1p`` are
    not vectorised and cost ~15x ``exp`` + ``log``. Where exp(-|x|) < 2^-24 the
    log term rounds to 0 instead of exp(-|x|), an absolute error below 6e-8.
    """
    N, C = v.shape[:2]
    m, bs = y.shape
    h1 = torch.cat([h, torch.ones_like(h[..., :1])], -1) if bias else h
    total = v.sum(0)
    loo = (total[None] - v) / (N - 1)  # [N, C, D] the v_c^{-j}
    z = h1 @ (total / N).T  # [m, bs, C] logits of the averaged classifier
    x = (h1.reshape(m * bs, -1) @ loo.reshape(N * C, -1).T).view(m, bs, N, C)  # u
    x.neg_().add_(_lse_without_each(z)[:, :, None, :])  # r_c - u_jc, in place
    sp = x.abs().neg_().exp_().add_(1.0).log_().add_(x.clamp_min_(0.0))  # softplus(x)
    wn = w / w.sum(1, keepdim=True).clamp_min(1.0)
    first = torch.bmm(wn[:, None, :], sp.view(m, bs, N * C)).view(m, N, C)
    other = wn[..., None] * (y[..., None] != torch.arange(C, device=y.device))  # [m, bs, C] weight where y != c
    zy = z.gather(-1, y[..., None])[..., 0]
    hbar = torch.bmm(other.transpose(1, 2), h1)  # [m, C, D] sum_b [y != c] wn h1
    second = torch.einsum("mcd,jcd->mjc", hbar, loo)
    return first.add_(second).sub_(torch.bmm(zy[:, None, :], other).view(m, 1, C))


def _lse_without_each(z: torch.Tensor) -> torch.Tensor:
    """``[..., C]``: entry c is the log-sum-exp of ``z`` over k != c.

    Shifting by the largest logit keeps the argmax's term exp(0) = 1 in every
    sum that leaves out some other class, so subtracting e_c cannot cancel; the
    sum that leaves out the argmax itself is shifted by the second largest.
    """
    top = z.topk(2, dim=-1)
    m1, m2 = top.values[..., :1], top.values[..., 1:]
    is_top = torch.arange(z.shape[-1], device=z.device) == top.indices[..., :1]
    e = (z - m1).exp()
    without_c = m1 + (e.sum(-1, keepdim=True) - e).log()
    without_top = m2 + (z - m2).exp().masked_fill(is_top, 0.0).sum(-1, keepdim=True).log()
    return torch.where(is_top, without_top, without_c)


def influence_batch(ctx: Context, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One random training batch per local client, from its (t, client) stream."""
    c = ctx.clients
    plan = c.plan(np.arange(c.n), 1, t, purpose="fedc2i_influence", max_batches=1)
    return c.batch(plan.idx[:, 0])


@torch.no_grad()
def aggregate(ctx: Context, state: State, t: int) -> Aggregation:
    """Steps 1-3 of a round: measure a_i and M_i, build each client's new model."""
    c, head, comm = ctx.clients, state.head, ctx.comm
    cfg = ctx.params
    alpha, ablation = cfg.alpha, cfg.ablation
    N, m, C = ctx.N, c.n, head.n_classes
    dev = c.device
    x, y, w = influence_batch(ctx, t)
    client_level = ablation in ("none", "client_only")
    total = comm.weighted_sum(c.params, np.ones(m)) if ablation != "class_only_local" else None

    v_all = torch.zeros(N, C, head.width, device=dev)
    loss = torch.full((m, N), float("nan"), device=dev)
    acc = torch.zeros(m, c.P, device=dev) if client_level else None
    run = {"max": torch.full((m,), float("-inf"), device=dev), "den": torch.zeros(m, device=dev)}

    def visit(ids: np.ndarray, rows: torch.Tensor) -> None:
        j = torch.as_tensor(ids, device=dev)
        if not client_level:  # only classifier rows travel
            v_all[j] = rows.reshape(len(ids), C, head.width)
            return
        v_all[j] = head.rows(rows)
        lj = loo_losses(c, (total[None] - rows) / (N - 1), x, y, w, ctx.stop)
        loss[:, j] = lj
        s = alpha * lj
        new = torch.maximum(run["max"], s.max(1).values)
        scale = torch.exp(run["max"] - new)
        e = torch.exp(s - new[:, None])
        acc.mul_(scale[:, None]).add_(e @ rows)
        run["den"] = run["den"] * scale + e.sum(1)
        run["max"] = new

    travelling = c.params if client_level else head.rows(c.params).reshape(m, -1)
    comm.ring(travelling, visit)
    ctx.stop.agreed(comm)  # a stop signal during the pass: every rank abandons the round here

    nan_a = np.full((m, N), np.nan, np.float32)
    nan_m = np.full((m, N, C), np.nan, np.float32)
    if client_level:
        a = torch.softmax(alpha * loss, dim=1)
        mixed = acc / run["den"][:, None]
        influence, mixing = a.cpu().numpy(), a.cpu().numpy()
        if ablation == "client_only":
            return Aggregation(mixed, influence, nan_m, mixing)
        base = mixed
    elif ablation == "class_only_local":
        base, influence, mixing = c.params.clone(), nan_a, identity_rows(ctx).densify()  # dense like its other rows
    else:  # class_only_global
        base, influence = (total / N).expand(m, -1).clone(), nan_a
        mixing = np.full((m, N), 1.0 / N, np.float32)

    h = head.features_of(c, base, x)
    mat = torch.softmax(alpha * class_losses(h, y, w, v_all, head.bias is not None), dim=1)  # over j
    v_new = torch.einsum("mjc,jcd->mcd", mat, v_all)
    return Aggregation(head.put(base, v_new), influence, mat.cpu().numpy(), mixing)


# --------------------------------------------------------------------------- the round


def round(ctx: Context, state: State, t: int) -> Round:
    c = ctx.clients
    agg = aggregate(ctx, state, t)
    c.params[:] = agg.rows
    c.reset_optimizer()
    loss = c.train(np.arange(c.n), ctx.cfg.train.local_epochs, t)
    return Round(train_loss=loss, mixing=Dense(agg.mixing),
                 extras={"influence": agg.influence.astype(np.float32),
                         "class_influence": agg.class_influence.astype(np.float32)})


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx)
