"""FedPer: Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with
Personalization Layers", arXiv:1912.00818, 2019.

FedAvg of the base layers; the top K_P layers (the personalization layers)
stay with each client. With theta_k = (phi_k, h_k), h_k the parameters of the
model's last ``fedper.personal_layers`` layers, in round t each sampled client k

1. downloads phi^t and keeps its own h_k;
2. trains (phi, h_k) together E epochs (``train.local_epochs``), fresh optimizer;
3. sends phi_k back: phi^{t+1} = sum_{k in S_t} p_k phi_k / sum_{k in S_t} p_k.

Client k is evaluated with (phi^{t+1}, h_k). Unlike FedRep, body and head train
at once, on the same batches. ``fedper.personal_layers=0`` is FedAvg bit for bit.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedper fedper.personal_layers=1

Choices where the paper leaves room:

- A layer is a module holding parameters of its own (an ``nn.Linear``, a conv, a
  BatchNorm), counted from the output; the default K_P = 1 keeps the classifier
  (the split of PFLlib's FedPer, ``model.head``, and of FedRep's comparisons);
  the paper tries 1 to 4 on its ResNet and MobileNet.
- Sampling and weights are FedAvg's (``algorithm.fraction``, p-weighted).
- Personal layers start as the initial model's and change only when the client
  trains; the optimizer restarts every round, as in FedAvg.

State and logs: FedBN's partial averaging (``blocks.part_round``): the global model
[P] (its shared columns), each client's personal layers in its own row; the mixing
row (p over the sampled clients, of the shared part), ``/fedper/personal_drift``
||h_k - h^0|| and the attribute ``fedper_personal_params``.
"""

from __future__ import annotations

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import PartState, last_layers, part_evaluate, part_round, part_state
from mpifl.algorithms.fedper_params import Params  # noqa: F401 - re-exported

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = ("FedPer: base layers averaged, the last `fedper.personal_layers` layers personal; the whole model "
           "trains at once")
MIXING_ROW = "p over sampled clients (the base layers)"


State = PartState


def init(ctx: Context) -> State:
    return part_state(ctx.clients, last_layers(ctx, ctx.params.personal_layers, "fedper.personal_layers"))


def round(ctx: Context, state: State, t: int) -> Round:
    return part_round(ctx, state, t, "fedper")


evaluate = part_evaluate
