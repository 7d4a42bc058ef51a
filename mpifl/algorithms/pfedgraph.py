"""pFedGraph: Ye, Ni, Wu, Zhang, Wang, Chen, "Personalized Federated Learning
with Inferred Collaboration Graphs" (ICML 2023). The server infers a
collaboration graph from the similarity of the clients' models and aggregates a
personalised model per client with its row; clients train with a similarity
regulariser toward their aggregate.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=pfedgraph pfedgraph.alpha=0.8

Each round t, with S the sampled clients (``algorithm.fraction``) and theta_0 the
run's initial model:

1. client i in S trains E local epochs from its own model theta_i (fresh
   optimizer) on
       L_i(theta) - lam * <c_i, theta> / ||theta||,     c_i = sum_j A_ij theta_j / ||theta_j||
   (the cosine similarity to its last aggregate, weighted by the graph; no term
   before the client's first aggregate);
2. the server (every rank, on the uploaded models of S) takes the dissimilarity
   d_ij = -cos(theta_i - theta_0, theta_j - theta_0), set to -1 below -0.9 (as in
   the authors' code), and solves for each i in S, over the simplex on S,
       A_i = argmin_{a >= 0, sum a = 1}  sum_j a_j d_ij + alpha ||a - p||^2,
   p_j = n_j / sum_{k in S} n_k. Its solution is the Euclidean projection of
   p - d_i / (2 alpha) onto the simplex (completing the square), computed exactly
   by the sort-and-threshold rule (``project_simplex``; tested against an
   enumeration of supports) rather than by a QP solver;
3. theta_i <- sum_{j in S} A_ij theta_j and c_i as above, for i in S; clients not
   sampled keep their model, aggregate and graph row.
The sampled models travel once to every rank (``allgather_ids``); each sampled
client is charged one model sent (its upload) and two received (its aggregate
and c_i).

Choices where the paper leaves room:
- the regulariser's sign: the paper's term pulls the local model toward its
  aggregate (the similarity is maximised, so it enters the loss with a minus
  sign); the authors' ``pfedgraph_cosine`` code adds ``lam * <c_i, theta>/||theta||``
  to the loss it minimises, which pushes away from it. We follow the paper.
- graph rows are solved over the sampled clients only (as the authors' code does
  with ``party_list_this_round``); the rest of a row keeps its last values, which
  start at 1/(N-1) off the diagonal (the authors' initial graph) and are logged,
  but the round's mixing is A_i on S.
- defaults alpha = 0.8, lam = 0.01: the authors' code (``--alpha``, ``--lam``).

Logged per round: ``/pfedgraph/graph`` [N, N] (the graph after the round),
``/graph/mixing`` (the round's rows A_i, e_i for clients not sampled).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import own_rows_metrics
from mpifl.algorithms.pfedgraph_params import Params  # noqa: F401 - re-exported
from mpifl.algorithms.state import per_client
from mpifl.logging.mixing import Dense
from mpifl.train import Step, StepView

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "pFedGraph: the server solves a graph row per sampled client from model similarity (simplex QP, "
    "`pfedgraph.alpha`), clients train with a cosine regulariser toward their aggregate (`pfedgraph.lam`)"
)
MIXING_ROW = "i's graph row over the sampled clients"


@dataclass
class State:
    graph: np.ndarray  # [N, N] the collaboration graph, the same on every rank
    target: torch.Tensor = per_client()  # [n_local, P] c_i, the regulariser's direction
    has_target: np.ndarray = per_client()  # [n_local] bool: c_i set


def init(ctx: Context) -> State:
    N = ctx.N
    g = np.full((N, N), 1.0 / max(N - 1, 1))
    np.fill_diagonal(g, 0.0)
    return State(graph=g, target=torch.zeros_like(ctx.clients.params),
                 has_target=np.zeros(ctx.comm.n_local, bool))


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of ``v`` onto {x >= 0, sum x = 1} (Held et al.'s rule:
    x = max(v - tau, 0) with the threshold tau from the sorted values)."""
    v = np.asarray(v, np.float64)
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, len(v) + 1)
    rho = int(np.flatnonzero(u - css / k > 0)[-1])
    return np.maximum(v - css[rho] / (rho + 1), 0.0)


def dissimilarity(D: torch.Tensor) -> np.ndarray:
    """d_ij = -cos(D_i, D_j), set to -1 where below -0.9 (the authors' rule)."""
    u = D.double()
    u = u / u.norm(dim=1, keepdim=True).clamp_min(1e-12)
    d = -(u @ u.T).cpu().numpy()
    return np.where(d < -0.9, -1.0, d)


def graph_rows(d: np.ndarray, p: np.ndarray, alpha: float) -> np.ndarray:
    """Row i: argmin over the simplex of d_i . a + alpha ||a - p||^2."""
    return np.stack([project_simplex(p - d[i] / (2 * alpha)) for i in range(len(d))])


def regulariser_step(target: torch.Tensor, lam: float, on: np.ndarray) -> Step:
    """A ``Clients.train`` step: cross-entropy gradient plus that of
    -lam <c_i, theta>/||theta|| for the rows ``on`` marks (local positions)."""

    def step(view: StepView, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        p, rows = view.params, view.rows
        g, loss = view.grads(p, x, y, w)
        use = torch.as_tensor(on[rows], device=p.device)
        if lam and bool(use.any()):
            c = target[torch.as_tensor(rows, device=p.device)]
            n = p.norm(dim=1, keepdim=True)
            # d/dtheta <c, theta>/||theta|| = c/||theta|| - <c, theta> theta/||theta||^3
            gr = c / n - (c * p).sum(1, keepdim=True) * p / n ** 3
            g = g - lam * torch.where(use[:, None], gr, torch.zeros_like(gr))
        view.step_(p, g)
        return loss

    return Step(step)


def round(ctx: Context, state: State, t: int) -> Round:
    f, c, comm = ctx.params, ctx.clients, ctx.comm
    ids, P = comm.local_ids, c.P
    sampled = ctx.sample(t, ctx.cfg.algorithm.fraction)
    mine = ctx.local_of(sampled)
    c.reset_optimizer(torch.as_tensor(mine, device=c.device))
    loss = np.full(comm.n_local, np.nan)
    loss[mine] = c.train(mine, ctx.cfg.train.local_epochs, t,
                         step=regulariser_step(state.target, f.lam, state.has_target))

    theta = comm.allgather_ids(c.params, sampled).to(c.params)  # [m, P] the uploads
    d = dissimilarity(theta - c.init)
    pw = ctx.p[sampled] / ctx.p[sampled].sum()
    A = graph_rows(d, pw, f.alpha)  # [m, m]
    state.graph[np.ix_(sampled, sampled)] = A

    pos = np.searchsorted(sampled, ids[mine])
    Al = torch.as_tensor(A[pos], dtype=theta.dtype, device=theta.device)
    if len(mine):
        idx = torch.as_tensor(mine, device=c.device)
        c.params[idx] = Al @ theta
        state.target[idx] = Al @ (theta / theta.norm(dim=1, keepdim=True).clamp_min(1e-12))
        state.has_target[mine] = True
        comm.count(mine, sent=P * comm.itemsize, recv=2 * P * comm.itemsize, models=2)

    mixing = np.zeros((comm.n_local, ctx.N), np.float32)
    mixing[np.arange(comm.n_local), ids] = 1.0
    if len(mine):
        mixing[mine] = 0.0
        mixing[np.ix_(mine, sampled)] = A[pos]
    return Round(train_loss=loss, mixing=Dense(mixing), extras={"graph": state.graph[ids].astype(np.float32)})


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx)
