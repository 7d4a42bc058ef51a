"""FedRep: Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared
Representations for Personalized Federated Learning", ICML 2021.

The model is a shared body phi (the representation) and a personal head h_k
(the classifier: the model's last ``nn.Linear``, ``mpifl.train.head.find_head``). In
round t each sampled client k

1. downloads the global body phi^t and keeps its own head h_k;
2. trains the head with the body frozen for ``fedrep.head_epochs`` epochs:
   h_k <- h_k - lr grad_h F_k(h_k, phi^t);
3. trains the body with the (new) head frozen for ``train.local_epochs`` epochs:
   phi_k <- phi_k - lr grad_phi F_k(h_k, phi_k), from phi^t;
4. sends phi_k back: phi^{t+1} = sum_{k in S_t} p_k phi_k / sum_{k in S_t} p_k.

Only the body columns of the parameter row travel and are averaged; heads never
leave their client. Client k is evaluated with (phi^{t+1}, h_k) — also a client
not sampled this round, which holds the global body as soon as it downloads.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedrep fedrep.head_epochs=10

Choices where the paper leaves room:

- ``fedrep.head_epochs`` defaults to 10, the paper's experiments (10 epochs for
  the head, 1 for the representation); the authors' code splits 10 epochs as 9
  head + 1 body, PFLlib's ``plocal_epochs`` defaults to 1. The body's epochs are
  ``train.local_epochs`` (default 1, the paper's one epoch).
- The head and the body have their own optimizers (``train.optimizer``), both
  fresh every round as in FedAvg; heads start as the initial model's head.
- The two phases draw different batches (purposes "head" and "train").
- Only sampled clients train; the others keep their heads unchanged.

State: the global model [P] (identical on every rank; only its body columns are
used); each client's head lives in the head columns of its own row (checkpointed
with the clients). Logged: the mixing row of the body (p over the sampled
clients) and ``/fedrep/head_train_loss`` (``train_loss`` is the body phase's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import download, own_rows_metrics, sampled_weights
from mpifl.algorithms.fedrep_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.state import transient
from mpifl.logging.mixing import Shared
from mpifl.train import Objective
from mpifl.train.head import Head, body_slices, find_head

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "FedRep: shared body averaged, personal head (last `nn.Linear`) kept; head epochs with the body "
    "frozen, then body epochs with the head frozen"
)
MIXING_ROW = "p over sampled clients (the body only)"


@dataclass
class State:
    model: torch.Tensor  # [P] global model; its body columns are the shared body phi
    head: Head = transient()  # derived from the model by init: nothing to checkpoint
    body: torch.Tensor = transient()  # [P_body] column indices of the body in a row


def init(ctx: Context) -> State:
    c = ctx.clients
    head = find_head(c, ctx.cfg.model.name, "fedrep")
    cols = torch.cat([torch.arange(s.start, s.stop) for s in body_slices(c, head)]).to(c.device)
    return State(model=c.init.clone(), head=head, body=cols)


def round(ctx: Context, state: State, t: int) -> Round:
    c, comm, body = ctx.clients, ctx.comm, state.body
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    mine = ctx.local_of(sampled)
    download(ctx, state.model, mine, body)
    body_names = [n for n in c.param_names if n not in state.head.names]
    head_loss = np.full(comm.n_local, np.nan)
    with c.using(c.params):  # the head's own optimizer, fresh: same rows
        head_loss[mine] = c.train(mine, ctx.params.head_epochs, t, purpose="head",
                                  objective=Objective(frozen=body_names))
    loss = np.full(comm.n_local, np.nan)
    loss[mine] = c.train(mine, ctx.cfg.train.local_epochs, t, objective=Objective(frozen=state.head.names))

    row, w = sampled_weights(ctx, sampled)
    model = state.model.clone()
    model[body] = comm.weighted_sum(c.params[:, body], w)
    state.model = model
    return Round(train_loss=loss, mixing=Shared(row), extras={"head_train_loss": head_loss})


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    rows = ctx.clients.params.clone()
    rows[:, state.body] = state.model[state.body]
    return own_rows_metrics(ctx, rows)
