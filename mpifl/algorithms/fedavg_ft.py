"""FedAvg+FT ("FedAvg+"): FedAvg, then before evaluation every client fine-tunes
the global model for ``algorithm.ft_epochs`` local epochs on its own data.
Evaluation-time only: the global model is not changed by fine-tuning.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedavg_ft algorithm.ft_epochs=1
"""

from __future__ import annotations

import numpy as np

from . import fedavg
from .base import Context, own_rows_metrics

State = fedavg.State
init = fedavg.init
round = fedavg.round


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    c = ctx.clients
    saved_params, saved_opt = c.params.clone(), {k: v.clone() for k, v in c.opt.state.items()}
    c.params[:] = state.model
    c.opt.reset()
    c.train(np.arange(c.n), ctx.cfg.algorithm.ft_epochs, t, purpose="finetune")
    out = own_rows_metrics(ctx)
    c.params[:] = saved_params
    c.opt.state.update(saved_opt)
    return out
