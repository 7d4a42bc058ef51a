"""FedEM: Marfoq, Neglia, Bellet, Kameni, Vidal, "Federated Multi-Task Learning
under a Mixture of Distributions" (NeurIPS 2021). Each client's data is a
mixture of M underlying distributions; M component models are shared by all
clients, and client i keeps its own mixture weights pi_i.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedem fedem.components=4

Round t, for every sampled client i (its n_i training samples s):

1. download the M global components theta_1..theta_M;
2. E-step: per-sample responsibilities on its own training data
   ``q_i(s, m) = pi_im exp(-l(theta_m; x_s, y_s)) / sum_m' pi_im' exp(-l(theta_m'; x_s, y_s))``
   (l: cross-entropy, the negative log-likelihood of the label);
3. M-step: ``pi_im = (1/n_i) sum_s q_i(s, m)``, then every component trains E local
   epochs from the global one on the responsibility-weighted loss: a batch B gives
   ``(1/|B|) sum_{s in B} q_i(s, m) l(theta_m; x_s, y_s)``;
4. the server averages each component over the sampled clients, weighted by p_i
   (training-set size): ``theta_m = sum_i p_i theta_im / sum_i p_i``.

Prediction of client i: ``p(y|x) = sum_m pi_im softmax(f(theta_m; x))_y``. With M = 1
this is FedAvg (q = 1: the plain loss, the p-weighted average).

Choices where the paper left room (taken from its authors' code where it shows one):
- components start apart: component 0 is the run's model init (so M = 1 is FedAvg),
  component m >= 1 is built with its own torch seed from the run's seed (the
  authors build learner m with seed + m); equal starts would keep q uniform.
- pi_i starts uniform (1/M); the E-step runs on the downloaded components (before
  training), over the client's whole training split, in eval mode.
- the batch loss divides by the batch size, not by the sum of its
  responsibilities (authors' ``(loss_vec @ weights) / batch size``): a component a
  client's data hardly belongs to moves little; ``mpifl.train.Objective.sample_weight``.
- every component of a client sees the same shuffled batches in a round, and each
  starts from a fresh optimizer state (as FedAvg's clients do here).
- only sampled clients update pi_i; the others keep theirs for prediction.
- BatchNorm statistics (where the model has them) stay per client as everywhere in
  mpifl: one set per client, shared by its M components.

Traffic: a sampled client receives and sends M models; one Allreduce of P floats per
component. Logged per round: ``/fedem/pi`` [N, M] (every client's mixture weights
after the round: which components it uses) and the mixing row p over the sampled
clients (each component's average).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl import models
from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import sampled_weights
from mpifl.algorithms.fedem_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.state import per_client
from mpifl.logging.mixing import Shared
from mpifl.rng import GLOBAL, rng
from mpifl.train import Objective, loss_acc_from_probs, per_sample_loss

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "FedEM: `fedem.components` shared models, per-client mixture weights pi_i by EM, each component "
    "averaged like FedAvg; prediction = pi_i-weighted mixture"
)
MIXING_ROW = "p over sampled clients (each component)"

INIT_PURPOSE = "fedem/init"


@dataclass
class State:
    components: torch.Tensor  # [M, P] the global components, identical on every rank
    pi: np.ndarray = per_client()  # [n_local, M] mixture weights


def component_seed(seed: int, m: int) -> int:
    """The torch seed of component m >= 1's initial weights, from the run's seed."""
    return int(rng(seed, -1, GLOBAL, f"{INIT_PURPOSE}/{m}").integers(2**63 - 1))


def init(ctx: Context) -> State:
    c, d, M = ctx.clients, ctx.data, ctx.params.components
    rows = [c.init.clone()]
    for m in range(1, M):
        model = models.build(ctx.cfg.model, d.in_shape, d.n_classes, component_seed(ctx.cfg.run.seed, m))
        rows.append(c.flatten(model)[0].to(c.init))
    return State(components=torch.stack(rows), pi=np.full((ctx.comm.n_local, M), 1.0 / M))


def sample_losses(ctx: Context, components: torch.Tensor, local: np.ndarray, split: str = "train"
                  ) -> list[tuple[np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per chunk of ``local`` clients: (sample indices [m, n], y, w, per-sample
    cross-entropy [m, n, M] of every component)."""
    c = ctx.clients
    out = []
    for sl, idx, x, y, w in c.split_batches(split, local):
        ls = [per_sample_loss(c.shared_logits(row, x, local[sl]).transpose(1, 2), y, dim=1)
              for row in components]
        out.append((idx, y, w, torch.stack(ls, -1)))
    return out


def estep(ctx: Context, state: State, mine: np.ndarray) -> torch.Tensor:
    """Responsibilities of the sampled local clients ``mine``: updates their pi and
    returns ``[n_samples, M]`` per-sample weights indexed like the rank's samples
    (zero outside their training splits)."""
    c, M = ctx.clients, len(state.components)
    q_all = torch.zeros(c.n_samples, M, device=c.device)
    pos = 0
    for idx, _, w, loss in sample_losses(ctx, state.components, mine):
        logpi = torch.log(torch.as_tensor(state.pi[mine[pos:pos + len(idx)]], dtype=loss.dtype, device=c.device))
        q = torch.softmax(logpi[:, None, :] - loss, dim=-1) * w[..., None]  # [m, n, M]
        n = w.sum(1).clamp_min(1.0)
        state.pi[mine[pos:pos + len(idx)]] = (q.sum(1) / n[:, None]).double().cpu().numpy()
        valid = idx >= 0
        q_all[torch.as_tensor(idx[valid], device=c.device)] = q[torch.as_tensor(valid, device=c.device)]
        pos += len(idx)
    return q_all


def round(ctx: Context, state: State, t: int) -> Round:
    c, M = ctx.clients, len(state.components)
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    mine = ctx.local_of(sampled)
    loss = np.full(ctx.comm.n_local, np.nan)
    q = estep(ctx, state, mine) if len(mine) else None
    row, w = sampled_weights(ctx, sampled)
    if len(mine):
        ctx.comm.count(mine, recv=M * c.P * ctx.comm.itemsize, models=M)
        loss[mine] = 0.0
    new = torch.empty_like(state.components)
    idx = torch.as_tensor(mine, device=c.device)
    for m in range(M):
        # the clients' own rows are the scratch space of each component's local training
        if len(mine):
            c.params[idx] = state.components[m]
            c.reset_optimizer(idx)
            loss[mine] += c.train(mine, ctx.cfg.train.local_epochs, t,
                                  objective=Objective(sample_weight=q[:, m].contiguous()))
        new[m] = ctx.comm.weighted_sum(c.params, w)
    state.components = new
    return Round(train_loss=loss, mixing=Shared(row), extras={"pi": state.pi.astype(np.float32)})


def mixture_metrics(ctx: Context, components: torch.Tensor, pi: np.ndarray) -> dict[str, np.ndarray]:
    """val/test loss and accuracy of every local client's pi-weighted mixture."""
    c = ctx.clients
    local = np.arange(ctx.comm.n_local)
    out = {}
    for split in ("val", "test"):
        loss, acc = np.full(len(local), np.nan), np.full(len(local), np.nan)
        for sl, _, x, y, w in c.split_batches(split, local):
            weights = torch.as_tensor(pi[sl], dtype=torch.float32, device=c.device)
            probs = sum(weights[:, m, None, None] * torch.softmax(c.shared_logits(row, x, local[sl]), -1)
                        for m, row in enumerate(components))
            loss[sl], acc[sl] = loss_acc_from_probs(probs, y, w)
        out[f"{split}_loss"], out[f"{split}_acc"] = loss, acc
    return out


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return mixture_metrics(ctx, state.components, state.pi)
