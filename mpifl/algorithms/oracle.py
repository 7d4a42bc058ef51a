"""Oracle: FedAvg run separately inside each ground-truth cluster. The upper
bound of any clustering method; needs a partition that records true clusters.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=oracle

One Allreduce of ``[K, P]`` per round (``grouped_sum``). A cluster none of whose
clients was sampled keeps its model for that round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import cluster_fedavg, own_rows_metrics
from mpifl.algorithms.oracle_params import check_config  # noqa: F401 - re-exported

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedAvg inside each true cluster"
MIXING_ROW = "p over sampled clients of i's cluster"


@dataclass
class State:
    models: torch.Tensor  # [K, P] one model per true cluster


def init(ctx: Context) -> State:
    k = int(ctx.data.cluster.max()) + 1
    return State(models=ctx.clients.init.repeat(k, 1))


def round(ctx: Context, state: State, t: int) -> Round:
    state.models, out = cluster_fedavg(ctx, state.models, ctx.data.cluster, t, ctx.cfg.algorithm.fraction)
    return out


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    c = ctx.clients
    c.params[:] = state.models[torch.as_tensor(ctx.data.cluster[ctx.comm.local_ids], device=c.device)]
    return own_rows_metrics(ctx)
