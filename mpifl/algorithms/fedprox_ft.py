"""FedProx+FT: FedProx (``fedprox``: Li et al., "Federated Optimization in
Heterogeneous Networks", MLSys 2020) whose best-validation global model every
client fine-tunes before evaluation, as DPFL's baseline (Kharrat et al., appendix
F.6: "save the best models on the validation dataset when training FedProx, then
starting from that model perform 2*tau local epochs and report the average test
accuracies").

Training is FedProx's round (proximal weight ``fedprox.mu``). After every round
the new global model w^{t+1} is evaluated on every client's validation split;
the model with the highest mean over clients so far (earliest on ties) is kept.
Before evaluation each client i fine-tunes that model on its own loss F_i alone
(no proximal term) for ``fedprox_ft.ft_epochs`` local epochs from a fresh
optimizer, and is evaluated on the result. Fine-tuning and tracking are
``fedavg_ft``'s (one code path); neither changes the training state.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedprox_ft fedprox.mu=0.1

Choices: ``fedprox_ft.ft_epochs`` 0 (the default) means 2 * ``train.local_epochs`` (DPFL's 2*tau);
``start=last`` fine-tunes the current global model instead of the best one.
The fine-tuning runs at every evaluation (``run.eval_every``) from the best model
so far, so the last round's figures are DPFL's.

Logged: as ``fedprox`` (mixing row, ``drift``) plus, with ``best_val``,
``/fedprox_ft/global_val_acc`` per round and the root attribute ``best_round``.
"""

from __future__ import annotations

import numpy as np

from mpifl.algorithms import fedprox
from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import FineTuneState, finetuned_metrics, ft_epochs, init_finetune, track_best
from mpifl.algorithms.fedprox_ft_params import READS, Params, selection_samples  # noqa: F401 - re-exported

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedProx+FT (DPFL): FedProx's best-validation global model fine-tuned 2E epochs before evaluation"
MIXING_ROW = "as fedavg"


State = FineTuneState
init = init_finetune


def round(ctx: Context, state: State, t: int) -> Round:
    state.model, out = fedprox.step(ctx, state.model, t, ctx.cfg.fedprox.mu)  # it trains as FedProx does
    if ctx.params.start == "best_val":
        track_best(ctx, state, out, t)
    return out


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    p = ctx.params
    start = state.best if p.start == "best_val" else state.model
    return finetuned_metrics(ctx, start, ft_epochs(ctx), t)
