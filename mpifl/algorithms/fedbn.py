"""FedBN: Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID
Features via Local Batch Normalization", ICLR 2021.

FedAvg in which every BatchNorm layer stays with its client: its affine
parameters (gamma, beta) and its running statistics are never sent nor averaged.
With theta_k = (phi_k, beta_k), beta_k the client's BatchNorm parameters and phi_k
all others, in round t each sampled client k (Algorithm 1 of the paper)

1. downloads phi^t and keeps its own beta_k: theta_k <- (phi^t, beta_k);
2. trains theta_k E epochs (``train.local_epochs``) from a fresh optimizer;
3. sends phi_k back: phi^{t+1} = sum_{k in S_t} p_k phi_k / sum_{k in S_t} p_k.

Client k is evaluated with (phi^{t+1}, beta_k) and its own running statistics.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/fedc2i-featshift.yaml algorithm.name=fedbn model.name=resnet18

The models with BatchNorm: ``resnet18`` (torchvision's, every ``BatchNorm2d``,
the downsample branches' too) and ``mlp`` with ``model.batchnorm=true`` (a
BatchNorm1d before each hidden ReLU). The plain ``mlp``, ``lenet``, ``cnn_dpfl`` and
``cnn2`` have none: their personal part is empty and FedBN is FedAvg bit for bit (the same
download and average; ``tests/mpi/algorithms/test_fedbn.py``); the log's root attribute
``fedbn_personal_params`` = 0 says so.

Choices where the paper leaves room:

- Sampling and weights are FedAvg's (``algorithm.fraction``, p-weighted): the
  paper's Algorithm 1 averages all clients with weights 1/N (its experiments:
  every client every round, equal sizes), which is ``algorithm.fraction=1`` on
  equal-size splits.
- A BatchNorm layer is found by its module's type (``torch.nn`` ``_BatchNorm``),
  not its name. A client's BatchNorm parameters start as the initial model's and
  change only when it trains; running statistics are per client in every mpifl
  algorithm (``Clients.buffers``), so FedAvg on ``resnet18`` is FedAvg with local
  statistics ("SiloBN"-like) and FedBN differs from it by the affine parameters.
- Each client's optimizer restarts every round, as in FedAvg.

State: the global model [P] (identical on every rank; only its shared columns
are used); each client's BatchNorm parameters live in its own row's columns
(checkpointed with the clients). Logged: the mixing row (p over the sampled
clients, of the shared part), ``/fedbn/personal_drift``, ||beta_k - beta^0|| of
every client (how far its BatchNorm parameters moved from the initial ones), and
the attribute ``fedbn_personal_params`` (entries of a row kept local).

The same partial averaging, with another personal part, is FedPer's,
LG-FedAvg's and FedBABU's: :class:`PartState`, :func:`part_round` and :func:`part_evaluate`.
"""

from __future__ import annotations

from torch import nn

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import PartState, part_evaluate, part_round, part_state

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedBN: FedAvg whose BatchNorm parameters and statistics stay local (no BatchNorm: FedAvg)"
MIXING_ROW = "p over sampled clients (all but BatchNorm)"


State = PartState


def batchnorm_names(layers: list[tuple[str, nn.Module, list[str]]]) -> set[str]:
    """Names of the parameters of every BatchNorm layer among ``layers`` (``Clients.layers()``)."""
    return {n for _, mod, own in layers if isinstance(mod, nn.modules.batchnorm._BatchNorm) for n in own}


def init(ctx: Context) -> PartState:
    return part_state(ctx.clients, batchnorm_names(ctx.clients.layers()))


def round(ctx: Context, state: PartState, t: int) -> Round:
    return part_round(ctx, state, t, "fedbn")


evaluate = part_evaluate
