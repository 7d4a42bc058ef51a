"""LG-FedAvg: Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov,
Morency, "Think Locally, Act Globally: Federated Learning with Local and Global
Representations", arXiv:2001.01523, 2020.

The reverse of FedPer: each client keeps its own lower layers (the local
representation), and only the top ``lg_fedavg.global_layers`` layers (the global
model) are averaged. With theta_k = (l_k, g_k), g_k the last layers, in round t
each sampled client k

1. downloads g^t and keeps its local l_k;
2. trains (l_k, g) together E epochs (``train.local_epochs``), fresh optimizer;
3. sends g_k back: g^{t+1} = sum_{k in S_t} p_k g_k / sum_{k in S_t} p_k.

Client k is evaluated with (l_k, g^{t+1}). Only the global layers travel, the
method's saving in communication. ``lg_fedavg.global_layers`` equal to the model's
number of layers leaves no local part: FedAvg bit for bit.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=lg_fedavg lg_fedavg.global_layers=1

Choices where the paper leaves room:

- A layer is a module holding parameters of its own (``Clients.layers``), counted
  from the output; the default of 1 global layer (the classifier) is PFLlib's
  split (``model.head`` averaged, ``model.base`` local); the paper's global part
  is the top layers of its CNNs and MLPs, of a size it varies.
- The paper's optional auxiliary local losses (unsupervised or fairness terms on
  the representation) are left out: the local layers train on the classification
  loss only, the variant the paper and PFLlib call LG-FedAvg.
- The paper can start from FedAvg-pretrained models; here every client starts
  from the initial model. Sampling and weights are FedAvg's; the optimizer
  restarts every round.

State and logs: FedBN's partial averaging (``blocks.part_round``): the global model
[P] (its global layers' columns), each client's local layers in its own row; the
mixing row (p over the sampled clients, of the global layers),
``/lg_fedavg/personal_drift`` ||l_k - l^0|| and the attribute
``lg_fedavg_personal_params``.
"""

from __future__ import annotations

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import PartState, last_layers, part_evaluate, part_round, part_state
from mpifl.algorithms.lg_fedavg_params import Params  # noqa: F401 - re-exported

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = ("LG-FedAvg: the last `lg_fedavg.global_layers` layers averaged, the layers below them local; the whole "
           "model trains at once")
MIXING_ROW = "p over sampled clients (the global layers)"


State = PartState


def init(ctx: Context) -> State:
    c = ctx.clients
    shared = last_layers(ctx, ctx.params.global_layers, "lg_fedavg.global_layers")
    return part_state(c, set(c.param_names) - shared)


def round(ctx: Context, state: State, t: int) -> Round:
    return part_round(ctx, state, t, "lg_fedavg")


evaluate = part_evaluate
