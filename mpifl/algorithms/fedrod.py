"""FedRoD: H.-Y. Chen, W.-L. Chao, "On Bridging Generic and Personalized
Federated Learning for Image Classification", ICLR 2022.

The model is a body phi (features h = phi(x)) and a generic head (W_g, b_g), both
shared and averaged as in FedAvg; every client also keeps a personal head
(W_p,i, b_p,i) of the same shape (the paper's linear personal head, no
hypernetwork). Each local step of a sampled client i on a batch (x, y):

    h = phi(x),  z_g = W_g h + b_g,  z_p = W_p,i h + b_p,i          (before the step)
    (phi, W_g, b_g) <- SGD step on the balanced softmax loss
        BSM_i = CE(z_g + log pi_i, y),   pi_i,c = n_i,c / n_i      (client i's training label prior)
    (W_p,i, b_p,i)  <- SGD step on CE(stopgrad(z_g) + z_p, y), h detached

and client i predicts with z_g + z_p. The server averages (phi, W_g, b_g) over
the sampled clients by p_i (training-set size). The split into body and head is
the model's last ``nn.Linear`` (``mpifl.train.head.find_head``).

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedrod

Choices where the paper left room:
- A class absent from a client's training data has prior 0: its log-prior is
  -1e4 instead of -inf (its softmax term underflows to exactly 0 in float32 just
  the same, without the NaN that 0 * -inf gives on padded samples).
- The personal heads start as the initial model's head (PFLlib's choice) and
  keep their optimizer state (``train.optimizer``) across rounds; the shared part
  starts every round from the downloaded model with a fresh optimizer state.
- Only the sampled clients train their personal heads.
- Evaluation: a linear head on top of the same features sums, so z_g + z_p is
  the model with head (W_g + W_p,i, b_g + b_p,i); clients are evaluated with that
  model (the new global body and generic head, their own personal head).

Logs: the mixing row (p over the sampled clients); the training loss of the
personalized prediction; ``/fedrod/bsm_loss`` (the generic model's balanced
softmax loss); ``/fedrod/generic_test_acc``, the generic model's test accuracy
(the paper's G-FL, next to P-FL in ``test_acc``) in evaluation rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mpifl.algorithms.base import Context, Round, evaluates
from mpifl.algorithms.blocks import local_update, own_rows_metrics, sampled_weights
from mpifl.algorithms.state import per_client
from mpifl.logging.mixing import Shared
from mpifl.train import Step, StepView
from mpifl.train.head import Head, find_head

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "FedRoD: body + generic head averaged (balanced softmax), a personal linear head per client; predicts"
    " generic + personal logits"
)
MIXING_ROW = "p over sampled clients (body and generic head)"

ABSENT_LOG_PRIOR = -1e4  # log pi of a class the client does not hold (see the docstring)


@dataclass
class State:
    model: torch.Tensor  # [P] body + generic head, identical on every rank
    head: torch.Tensor = per_client()  # [n_local, C * width] personal heads, rows as Head.rows flattened
    head_opt: dict = per_client()  # their optimizer state


def _head(ctx: Context) -> Head:
    return find_head(ctx.clients, ctx.cfg.model.name, "fedrod")


def init(ctx: Context) -> State:
    c = ctx.clients
    h = _head(ctx)
    v = h.rows(c.init[None]).reshape(1, -1)
    return State(model=c.init.clone(), head=v.repeat(c.n, 1),
                 head_opt=c.optimizer(v.shape[1]).fresh_state(c.n))


def log_prior(ctx: Context) -> torch.Tensor:
    """[n_local, C] log of each local client's training label frequencies."""
    hist = torch.as_tensor(ctx.data.label_hist[ctx.comm.local_ids], dtype=torch.float64)
    prior = hist / hist.sum(1, keepdim=True).clamp_min(1)
    out = torch.where(prior > 0, prior.log(), torch.full_like(prior, ABSENT_LOG_PRIOR))
    return out.float().to(ctx.clients.device)


def round(ctx: Context, state: State, t: int) -> Round:
    c = ctx.clients
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    n = ctx.comm.n_local
    bsm, seen = np.zeros(n), np.zeros(n)
    mine, loss = local_update(ctx, state.model, sampled, t, step=_step(ctx, state, bsm, seen))
    bsm[mine] /= np.maximum(seen[mine], 1)
    bsm[np.setdiff1d(np.arange(n), mine)] = np.nan
    row, w = sampled_weights(ctx, sampled)
    state.model = ctx.comm.weighted_sum(c.params, w)
    extras = {"bsm_loss": bsm}
    if evaluates(ctx.cfg, t):
        extras["generic_test_acc"] = c.evaluate("test", state.model)[1]
    return Round(train_loss=loss, mixing=Shared(row), extras=extras)


def _step(ctx: Context, state: State, bsm: np.ndarray, seen: np.ndarray) -> Step:
    """The FedRoD step of the equations above, for ``Clients.train`` (the personal
    heads and their optimizer state are the step's state); adds each client's
    sample-weighted BSM loss into ``bsm`` and its samples into ``seen``."""
    c = ctx.clients
    head = _head(ctx)
    bias = log_prior(ctx)
    h_opt = c.optimizer(state.head.shape[1], state.head_opt)
    C, D = head.n_classes, head.width

    def step(view: StepView, x: torch.Tensor, y: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        p, hp, rows = view.params, view["head"], view.rows
        m = len(rows)
        with torch.no_grad():
            feats = head.features_of(c, p, x, rows)  # [m, b, d], before the step
            z_g = head.logits(feats, head.rows(p))
        g, loss_g = view.grads(p, x, y, wt, bias=bias[torch.as_tensor(rows, device=bias.device)])
        view.step_(p, g)
        # personal head: CE(z_g + z_p, y) by its closed-form gradient, features fixed
        z = z_g + head.logits(feats, hp.view(m, C, D))
        share = (wt / wt.sum(1, keepdim=True).clamp_min(1.0)).unsqueeze(-1)  # [m, b, 1]
        logp = torch.log_softmax(z, -1)
        loss = -(logp.gather(-1, y.unsqueeze(-1)) * share).sum((1, 2))
        dz = (logp.exp() - F.one_hot(y, C).to(z.dtype)) * share  # d loss / d z
        g_head = torch.bmm(dz.transpose(1, 2), feats)  # [m, C, d]
        if head.bias is not None:
            g_head = torch.cat([g_head, dz.sum(1).unsqueeze(-1)], dim=2)
        view.step_(hp, g_head.reshape(m, -1), opt=h_opt)
        nw = wt.sum(1).cpu().numpy()
        bsm[rows] += loss_g.detach().cpu().numpy() * nw
        seen[rows] += nw
        return loss

    return Step(step, {"head": state.head, "head_opt": state.head_opt})


def personalized(ctx: Context, state: State) -> torch.Tensor:
    """[n_local, P]: the global model with head (W_g + W_p,i, b_g + b_p,i)."""
    c = ctx.clients
    head = _head(ctx)
    rows = state.model.repeat(c.n, 1)
    return head.put(rows, head.rows(rows) + state.head.view(c.n, head.n_classes, head.width))


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx, personalized(ctx, state))
