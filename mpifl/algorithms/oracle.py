"""Oracle: FedAvg run separately inside each ground-truth cluster. The upper
bound of any clustering method; needs a partition that records true clusters.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=oracle

One Allreduce of ``[K, P]`` per round (``grouped_sum``). A cluster none of whose
clients was sampled keeps its model for that round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round, group_weights, own_rows_metrics
from mpifl.algorithms.fedavg import local_update
from mpifl.algorithms.mixing import Grouped
from mpifl.errors import check

if TYPE_CHECKING:
    from mpifl.config.sections import ConfigBase as Config

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedAvg inside each true cluster"
MIXING_ROW = "p over sampled clients of i's cluster"


def check_config(cfg: Config) -> None:
    p = cfg.data.partition
    check(p not in ("iid", "patho", "dirichlet"), "algorithm.name", "oracle",
          f"oracle needs true clusters: data.partition={p!r} records none; "
          "use clusters, noisy_clusters, permuted_clusters, domains, feature_shift or label_flip")


@dataclass
class State:
    models: torch.Tensor  # [K, P] one model per true cluster


def init(ctx: Context) -> State:
    k = int(ctx.data.cluster.max()) + 1
    return State(models=ctx.clients.init.repeat(k, 1))


def round(ctx: Context, state: State, t: int) -> Round:
    state.models, out = cluster_fedavg(ctx, state.models, ctx.data.cluster, t, ctx.cfg.algorithm.fraction)
    return out


def cluster_fedavg(ctx: Context, models: torch.Tensor, cl: np.ndarray, t: int,
                   fraction: float) -> tuple[torch.Tensor, Round]:
    """One round of FedAvg inside each cluster of ``cl`` ([N] labels 0..K-1, the
    same on every rank) with ``models`` [K, P]: returns the new models and the round."""
    sampled = ctx.sample(t, fraction)
    mine_cluster = torch.as_tensor(cl[ctx.comm.local_ids], device=models.device)
    _, loss = local_update(ctx, models[mine_cluster], sampled, t)

    w, wl = group_weights(ctx, cl, sampled)
    sums = ctx.comm.grouped_sum(ctx.clients.params, wl, cl[ctx.comm.local_ids], len(models))
    hit = torch.as_tensor(np.isin(np.arange(len(models)), cl[sampled]), device=sums.device)
    models = torch.where(hit[:, None], sums, models)

    # row i: w within i's cluster; a cluster with no sampled client keeps its
    # model (row e_i), which is the groups format's own rule
    return models, Round(train_loss=loss, mixing=Grouped(cl, w))


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    c = ctx.clients
    c.params[:] = state.models[torch.as_tensor(ctx.data.cluster[ctx.comm.local_ids], device=c.device)]
    return own_rows_metrics(ctx)
