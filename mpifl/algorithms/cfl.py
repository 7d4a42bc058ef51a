"""CFL: Sattler, Müller, Samek, "Clustered Federated Learning: Model-Agnostic
Distributed Multitask Optimization Under Privacy Constraints" (IEEE TNNLS, 2020).
FedAvg inside each cluster; a cluster whose clients' updates have converged as a
whole but not one by one is split in two by the cosine similarity of the updates.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=cfl cfl.warmup_rounds=5

Each round t, with S the sampled clients (``algorithm.fraction``) and c(i) the
cluster of client i (every client starts in cluster 0):

1. client i in S downloads its cluster's model theta_c, trains E local epochs
   (fresh optimizer) and uploads the update dtheta_i = theta_i - theta_c;
2. for each cluster c with sampled members S_c, with p-weights
   a_i = n_i / sum_{j in S_c} n_j:
       mean norm  ||sum_{i in S_c} a_i dtheta_i||,   max norm  max_{i in S_c} ||dtheta_i||;
   c is split when t >= ``warmup_rounds``, it has more than ``min_size`` members,
   mean norm < ``eps1`` and max norm > ``eps2``;
3. a split cluster is cut by the optimal bipartition of the cosine similarities
   alpha_ij = <dtheta_i, dtheta_j> / (||dtheta_i|| ||dtheta_j||) of its members:
   the two groups c1, c2 minimising max_{i in c1, j in c2} alpha_ij. Merging the
   most similar pairs first until two groups are left (single linkage, the
   paper's Algorithm 2) reaches that minimum exactly: it cuts the weakest edge of
   the maximum spanning tree. ``linkage: complete`` instead takes complete
   linkage, what the paper's reference code and FL-bench run (a heuristic for the
   same criterion). Both are scikit-learn's agglomerative clustering on the
   distance 1 - alpha. The half holding the smallest client id keeps the cluster
   id, the other half takes the next free id and starts from the same model;
4. theta_c <- theta_c + sum_{i in S_c} a_i dtheta_i for every cluster with sampled
   members (after the splits: within the new clusters); one grouped Allreduce.

Choices where the paper leaves room (its experiments have every client take part
each round; here a fraction is sampled):
- a split needs every member's update, not only the sampled ones': in a round
  where a cluster splits, its members that were not sampled also download the
  cluster model and train from it once (the same batches they would draw if
  sampled), and upload the update for the similarities only (charged as one
  model received and one sent); only sampled clients' updates enter the average.
- the norms are those of the sampled members' updates (at least one);
- defaults eps1 = 0.4, eps2 = 1.6, warm-up 20 rounds, min size 2 are those of the
  paper's reference code (its MNIST setting; the norms scale with the learning
  rate, epochs and model, so other settings need other values);
- the aggregation weights are the paper's n_i / n_c (its reference code averages
  unweighted; equal when the clients hold as many samples).

Evaluation: every client evaluates its cluster's model. Logged per round:
``/cfl/cluster`` [N] (cluster id of every client after the round's splits; also
read by ``python -m mpifl.analyze`` for the ARI), ``/cfl/update_norm`` [N]
(||dtheta_i||, nan when not sampled), ``/cfl/mean_norm`` and ``/cfl/max_norm`` [N]
(of the client's cluster before the splits, nan when it had no sampled member),
``/graph/mixing`` (a within the clusters); root attribute ``cfl_splits``: one
``[round, cluster, new cluster, mean norm, max norm, members]`` per split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import group_weights, local_update, own_rows_metrics
from mpifl.algorithms.cfl_params import Params  # noqa: F401 - re-exported
from mpifl.logging.mixing import Grouped

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "Clustered FL: FedAvg per cluster; a cluster whose mean update norm < `cfl.eps1` and largest > "
    "`cfl.eps2` splits by the optimal bipartition of its updates' cosine similarities"
)
MIXING_ROW = "p over sampled clients of i's cluster"


@dataclass
class State:
    cluster: np.ndarray  # [N] cluster id of every client, the same on every rank
    models: torch.Tensor  # [K, P] one model per cluster
    splits: np.ndarray  # [S, 6] round, cluster, new cluster, mean norm, max norm, members


def init(ctx: Context) -> State:
    return State(cluster=np.zeros(ctx.N, np.int64), models=ctx.clients.init.clone()[None],
                 splits=np.zeros((0, 6)))


def norms(G: np.ndarray, a: np.ndarray) -> tuple[float, float]:
    """(mean norm, max norm) of updates with Gram matrix ``G`` and weights ``a``."""
    return float(np.sqrt(max(a @ G @ a, 0.0))), float(np.sqrt(np.max(np.diag(G))))


def bipartition(U: torch.Tensor, linkage: str = "single") -> np.ndarray:
    """0/1 labels of the rows of ``U`` [m, P] (m >= 2): agglomerative clustering
    into two groups on 1 - cosine similarity, label 0 on the group holding row 0."""
    from sklearn.cluster import AgglomerativeClustering  # here: every run imports this module (its Params)

    u = U.double()
    u = u / u.norm(dim=1, keepdim=True).clamp_min(1e-12)
    dist = np.clip(1.0 - (u @ u.T).cpu().numpy(), 0.0, None)
    np.fill_diagonal(dist, 0.0)
    labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage=linkage).fit(dist).labels_
    return (labels != labels[0]).astype(np.int64)


def round(ctx: Context, state: State, t: int) -> Round:
    f, c, comm = ctx.params, ctx.clients, ctx.comm
    ids, P = comm.local_ids, c.P
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    cl = state.cluster
    start = state.models[torch.as_tensor(cl[ids], device=c.device)]
    mine, loss = local_update(ctx, start, sampled, t)
    # the server's view of the uploads: their Gram matrix gives every norm it tests
    U = comm.allgather_ids(c.params - start, sampled).double()
    G = (U @ U.T).cpu().numpy()
    a, _ = group_weights(ctx, cl, sampled)
    K = len(state.models)
    mean_n, max_n = np.full(K, np.nan), np.full(K, np.nan)
    fire = []
    for k in np.unique(cl[sampled]):
        pos = np.flatnonzero(cl[sampled] == k)
        mean_n[k], max_n[k] = norms(G[np.ix_(pos, pos)], a[sampled[pos]])
        if t >= f.warmup_rounds and (cl == k).sum() > f.min_size and mean_n[k] < f.eps1 and max_n[k] > f.eps2:
            fire.append(int(k))

    new = cl.copy()
    if fire:
        members = np.flatnonzero(np.isin(cl, fire))
        extra = ctx.local_of(np.setdiff1d(members, sampled))
        if len(extra):  # members not sampled: one update each, for the similarities only
            idx = torch.as_tensor(extra, device=c.device)
            c.params[idx] = start[idx]
            c.reset_optimizer(idx)
            c.train(extra, ctx.cfg.train.local_epochs, t)
            comm.count(extra, recv=P * comm.itemsize, sent=P * comm.itemsize, models=1)
        V = comm.allgather_ids(c.params - start, members)
        splits = []
        for k in fire:
            m = members[cl[members] == k]
            half = bipartition(V[np.searchsorted(members, m)], f.linkage)
            knew = K + len(splits)
            new[m[half == 1]] = knew
            splits.append([t, k, knew, mean_n[k], max_n[k], len(m)])
        state.models = torch.cat([state.models, state.models[fire]])
        state.splits = np.concatenate([state.splits, np.array(splits, np.float64)])
    state.cluster = new

    # FedAvg inside the (new) clusters, over their sampled members
    w, wl = group_weights(ctx, new, sampled)
    sums = comm.grouped_sum(c.params, wl, new[ids], len(state.models))
    hit = torch.as_tensor(np.isin(np.arange(len(state.models)), new[sampled]), device=sums.device)
    state.models = torch.where(hit[:, None], sums.to(state.models), state.models)

    un = np.full(comm.n_local, np.nan)
    pos = np.searchsorted(sampled, ids[mine])
    un[mine] = np.sqrt(np.diag(G)[pos])
    return Round(
        train_loss=loss, mixing=Grouped(new, w),
        extras={"cluster": new[ids].astype(np.int64), "update_norm": un,
                "mean_norm": mean_n[cl[ids]], "max_norm": max_n[cl[ids]]},
        attrs={"cfl_splits": state.splits.tolist()} if fire else {},
    )


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    c = ctx.clients
    return own_rows_metrics(ctx, state.models[torch.as_tensor(state.cluster[ctx.comm.local_ids], device=c.device)])
