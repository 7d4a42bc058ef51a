"""FedBABU: Oh, Kim, Yun, "FedBABU: Toward Enhanced Representation for
Federated Image Classification", ICLR 2022.

FedAvg of the body only: the head (the classifier, the model's last
``nn.Linear``, ``mpifl.train.head.find_head``) keeps its random initial
weights h^0 through federated training and is never updated nor sent; it is
fine-tuned for personalization only at evaluation. In round t each sampled client k

1. downloads the body phi^t (its head is h^0, as everyone's: only the body travels);
2. trains the body E epochs (``train.local_epochs``) with the head frozen:
   phi_k <- phi_k - lr grad_phi F_k(phi_k, h^0), from a fresh optimizer;
3. sends phi_k back: phi^{t+1} = sum_{k in S_t} p_k phi_k / sum_{k in S_t} p_k.

Evaluation (every client, every evaluating round): from (phi^{t+1}, h^0) the
client fine-tunes the whole model ``fedbabu.ft_epochs`` epochs on its training
data, from a fresh optimizer, and is evaluated on the result; nothing of that
fine-tuning is kept (``blocks.finetuned_metrics``).

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedbabu fedbabu.ft_epochs=5

Choices where the paper leaves room:

- ``fedbabu.ft_epochs`` defaults to 5; the paper reports several fine-tuning
  lengths tau (PFLlib's ``fine_tuning_epochs`` default is 10). Fine-tuning
  updates body and head together, as the paper's main personalization (and
  PFLlib's ``fine_tune``, ``which_module=['base', 'head']``), with ``train.lr``.
- The head is the last ``nn.Linear`` (the models of ``mpifl.models``); its columns
  of the global model stay h^0 exactly (the body's columns alone are averaged).
- Sampling and weights are FedAvg's; fine-tuning draws its own batches (purpose
  "finetune"), as FedAvg+FT's.

State: FedBN's partial averaging (``blocks.part_round``) with the head as the part
each row keeps (at h^0: it is frozen): the global model [P] (identical on every
rank). Logged: the mixing row (p over the sampled clients, of the body),
``/fedbabu/personal_drift`` ||h_k - h^0|| (0 throughout: the check that the head
never trained) and the attribute ``fedbabu_personal_params``; ``test_acc`` is the
fine-tuned models'. A model without a last ``nn.Linear`` applied to flat
features is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import PartState, finetuned_metrics, part_round, part_state
from mpifl.algorithms.fedbabu_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.state import transient
from mpifl.train import Objective
from mpifl.train.head import find_head

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = ("FedBABU: body averaged with the head frozen at its random initial weights; every client fine-tunes "
           "the whole model `fedbabu.ft_epochs` epochs before evaluation")
MIXING_ROW = "p over sampled clients (the body only)"


@dataclass
class State(PartState):
    """The global model (body phi^t, initial head h^0) and the head's columns,
    which every client's row holds at h^0."""

    head: tuple[str, ...] = transient()  # the head's parameter names (derived by init)


def init(ctx: Context) -> State:
    head = find_head(ctx.clients, ctx.cfg.model.name, "fedbabu").names
    part = part_state(ctx.clients, set(head))
    return State(model=part.model, shared=part.shared, personal=part.personal, head=head)


def round(ctx: Context, state: State, t: int) -> Round:
    return part_round(ctx, state, t, "fedbabu", Objective(frozen=state.head))


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return finetuned_metrics(ctx, state.model, ctx.params.ft_epochs, t)
