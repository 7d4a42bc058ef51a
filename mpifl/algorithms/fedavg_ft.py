"""FedAvg+FT ("FedAvg+"): FedAvg, then before evaluation every client fine-tunes
a global model for ``fedavg_ft.ft_epochs`` local epochs (default 0: 2 * ``train.local_epochs``,
DPFL's 2*tau) on its own data and is
evaluated on the result. Evaluation-time only: neither the global model nor the
clients' training state is changed by fine-tuning.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedavg_ft fedavg_ft.ft_epochs=1

Which global model is fine-tuned (``fedavg_ft.start``):

- ``last`` (default, mpifl's FedAvg+FT so far): the current global model w^{t+1}.
- ``best_val``: DPFL's FedAvg+FT (appendix F.6: "save the best models on the
  validation dataset when training, then starting from that model perform 2*tau
  local epochs"): after every round the new global model is evaluated on every
  client's validation split; the model with the highest mean over clients of
  that accuracy so far (the earliest on ties) is kept in the state (and in
  checkpoints), and fine-tuning starts from it. This costs one validation pass
  per round, whatever ``run.eval_every`` is, so the choice does not depend on
  the evaluation schedule.

Fine-tuning runs from a fresh optimizer on batches of its own purpose
("finetune"), through ``Clients.using`` on a copy of the model per client.
FedProx+FT (``fedprox_ft``) shares the fine-tuning and tracking (``blocks.finetuned_metrics``,
``blocks.track_best``).

Logged: the mixing row (as FedAvg); with ``best_val``, ``/<name>/global_val_acc``
(each client's validation accuracy of the new global model) every round and the
root attribute ``best_round`` (the round whose model fine-tuning starts from).
"""

from __future__ import annotations

import numpy as np

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import FineTuneState, finetuned_metrics, ft_epochs, init_finetune, step, track_best
from mpifl.algorithms.fedavg_ft_params import Params, selection_samples  # noqa: F401 - re-exported

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "FedAvg, then `fedavg_ft.ft_epochs` of local fine-tuning before evaluation, from the current global "
    "model or (`fedavg_ft.start=best_val`, DPFL's FedAvg+FT) the one of best mean validation accuracy"
)
MIXING_ROW = "as fedavg"


State = FineTuneState
init = init_finetune


def round(ctx: Context, state: State, t: int) -> Round:
    state.model, out = step(ctx, state.model, t, ctx.cfg.algorithm.fraction)
    if ctx.params.start == "best_val":
        track_best(ctx, state, out, t)
    return out


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    start = state.best if ctx.params.start == "best_val" else state.model
    return finetuned_metrics(ctx, start, ft_epochs(ctx), t)
