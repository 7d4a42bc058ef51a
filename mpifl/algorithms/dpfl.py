"""DPFL: Kharrat, Canini, Horvath, "Decentralized Personalized Federated
Learning" (its statement: docs/algorithms.md, DPFL). Every client greedily chooses
whom to average with, never receiving more than a budget ``B_c`` of models.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/dpfl-mnist1d-dir.yaml dpfl.budget=0.1N run.threads=1

Round 0 is Algorithm 1's preprocessing: every client trains ``tau_init`` epochs
from the shared init, runs BGGC (Algorithm 3) over all other clients to get its
candidates ``Omega_k`` (|Omega_k| <= B_c) and takes the p-weighted mean over
``Omega_k + {k}``, which BGGC already holds as its running sum ``w_X``.
Rounds t >= 1: ``tau_train`` local epochs, pull the models of ``Omega_k``,
every ``period`` rounds run GGC (Algorithm 2) over them to choose
``C_k <= Omega_k``, and take the p-weighted mean over ``C_k + {k}``. Omega never
loses an edge. The reward of a set S is ``R(S) = -F_k^V(mean_p(S + {k}))``, the
validation loss of client k.

BGGC is written against a reward callback (``[m, P]`` models ->
``[m]`` rewards) and a batch-at-a-time ``request``/``feed`` protocol,
so the same code runs in the unit tests (any reward) and here (round 0: one
``pull`` per batch for all of a rank's clients in lockstep; later rounds: the
models pulled for GGC). BGGC holds at most B_c other
models at once and keeps only the running sums ``w_X``, ``w_Y`` (float64).

Following docs/algorithms.md where it and the paper differ or the paper is silent:
- Algorithm 2's stop test (printed outside its loop, with |X| = B_c) is
  "stop once |X \\ {k}| = B_c", checked before each candidate.
- The coin: one uniform u per considered candidate, add iff u < a/(a+b), add
  when a = b = 0; GGC and BGGC draw the shuffle then the u's from the same
  ``ctx.rng`` stream, hence identical sets (Theorem 1). So every round's GGC
  over the pulled Omega_k runs as BGGC on models already held: its running sums
  cost O(P) per candidate, where re-averaging each tried set (Algorithm 2 as
  printed) costs O(|Omega_k| P). tests/serial_ref.py keeps Algorithm 2 as
  printed, set means recomputed, as the reference both are checked against.
- Round 0 counts as one of ``run.rounds``, so a run has rounds-1 training rounds
  (the paper runs 98 after a preprocessing "worth 2 rounds").
- Between GGC rounds (``period`` > 1) a client pulls only ``C_k``, not Omega.
- The optimizer state (SGD momentum) is reset after each aggregation: every
  LocalOpt call starts fresh from the aggregated model.
- ``random_graph`` (the paper's Fig. 3 ablation, our reading): Omega_k is
  min(B_c, N-1) other clients drawn uniformly once, and C_k = Omega_k every
  round, with the same pulls and budget, no GGC.
- Robustness mode: ``malicious`` * N clients (seeded) see all their labels
  (train/val/test) through one fixed derangement of the classes, applied here
  in ``init`` to this rank's copy of their data (module-local; the data
  partition ``label_flip`` is separate). /clients/label_hist is logged before
  the flip. With ``malicious_run_ggc: false`` they neither run BGGC nor GGC:
  they train alone (mixing = identity) and still serve their models.
- The paper's optimizer (SGD lr 0.01, momentum 0.9, weight decay 1e-3, batch
  16) lives in the shared ``train`` section: jobs/dpfl-*.yaml set it.

Logs (per round, [R, N, ...]): /dpfl/candidates (Omega, bool), /dpfl/collaborators
(C_k, bool), /dpfl/reward (R(C_k) after aggregation), /dpfl/max_batch_models (most
models a client received in one pull: <= B_c by construction), /graph/mixing,
/comm/models_recv; once: /dpfl/malicious [N] bool.

Evaluation: /metrics/* are those of the aggregated model w_k each round ends with
(Algorithm 1 line 11). The paper only says it keeps "a best model per client based on
the validation dataset"; the authors' code (salmakh1/DPFL, fl/train_clients_constrained_rgl.py)
validates and checkpoints each client's model right after its local training, before
aggregation. Both are logged: /dpfl/trained_{val,test}_{loss,acc} are the models after
LocalOpt (round 0: after tau_init epochs), when the round is evaluated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from mpifl.algorithms.base import Context, Interrupt, Round, evaluates
from mpifl.algorithms.blocks import own_rows_metrics
from mpifl.algorithms.dpfl_params import Params, check_config, selection_samples  # noqa: F401 - re-exported
from mpifl.algorithms.state import per_client
from mpifl.logging.mixing import Dense
from mpifl.rng import GLOBAL

if TYPE_CHECKING:
    from mpifl.comm import Comm

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "DPFL: BGGC candidate graph under budget B_c, GGC collaborators every `dpfl.period` rounds"
MIXING_ROW = "p over i's collaborators and itself"

Reward = Callable[[torch.Tensor], Sequence[float]]  # [m, P] models -> [m] rewards (higher is better)


@dataclass
class Choice:
    members: list[int]  # chosen collaborators, sorted, without k
    reward: float  # R(members + {k})
    mean: torch.Tensor  # [P] p-weighted mean model over members + {k}


def take(a: float, b: float, u: float) -> bool:
    """GGC's coin for u ~ U[0, 1): add with probability a / (a + b); add when a = b = 0."""
    total = a + b
    return True if total <= 0 else u < a / total


def _shuffled(candidates: Sequence[int], g: np.random.Generator) -> list[int]:
    return [int(j) for j in g.permutation(np.sort(np.asarray(candidates, np.int64)))]


class _Scratch:
    """The float64 rows a GGC decision works in, shared by every BGGC of a process (they
    are fed one at a time): the candidate's weighted row, the two sums tried and the two
    models scored, in float64 and in the models' dtype. Each arithmetic step is the one
    the plain expressions ``(w_x + p_j row_j) / (p_x + p_j)`` run, written into these
    rows instead of fresh ones, so the rewards keep their bits (a decision costs no
    allocation and no stack copy: bench/README.md, Performance V)."""

    _kept: dict[tuple, _Scratch] = {}

    def __init__(self, P: int, dtype: torch.dtype, device: torch.device):
        f64 = {"dtype": torch.float64, "device": device}
        self.wj, self.sx, self.sy = (torch.empty(P, **f64) for _ in range(3))
        self.pair64 = torch.empty(2, P, **f64)
        self.pair = torch.empty(2, P, dtype=dtype, device=device)

    @classmethod
    def get(cls, row: torch.Tensor, dtype: torch.dtype) -> _Scratch:
        key = (row.numel(), dtype, row.device)
        if key not in cls._kept:
            cls._kept.clear()  # one size at a time: a process runs one model
            cls._kept[key] = cls(row.numel(), dtype, row.device)
        return cls._kept[key]


def _pair(reward: Reward, x: torch.Tensor, y: torch.Tensor, s: _Scratch) -> tuple[float, float]:
    """The rewards of float64 models x and y, scored in the models' dtype."""
    s.pair64[0].copy_(x)
    s.pair64[1].copy_(y)
    r = reward(s.pair.copy_(s.pair64))
    return float(r[0]), float(r[1])


class BGGC:
    """Algorithm 3 as a resumable process over batches of at most B_c models.

    ``request()`` names the batch it needs next ([] once done); ``feed(rows)``
    consumes it (``rows[j]`` for every requested j). Phase 1 sums every
    candidate into ``w_Y``; phase 2 receives them again in GGC's shuffled order
    and makes GGC's decisions from the running sums ``w_X``, ``w_Y``. It stops
    requesting once |X \\ {k}| = B_c.
    """

    def __init__(self, k: int, candidates: Sequence[int], own: torch.Tensor, p: np.ndarray, reward: Reward,
                 budget: float, g: np.random.Generator):
        self.k, self.p, self.reward, self.budget, self.g = int(k), np.asarray(p, np.float64), reward, budget, g
        self.dtype = own.dtype
        ids = [int(j) for j in np.sort(np.asarray(candidates, np.int64))]
        size = len(ids) if math.isinf(budget) else int(budget)
        size = max(size, 1)
        order = _shuffled(ids, g)  # line 9's shuffle, drawn first as GGC draws it
        self.batches = ([ids[i:i + size] for i in range(0, len(ids), size)],
                        [order[i:i + size] for i in range(0, len(order), size)])
        self.phase, self.step = 0, 0
        self.x = [self.k]
        self.w_x = own.double() * self.p[k]
        self.w_y = self.w_x.clone()
        self.p_x = self.p_y = float(self.p[k])
        self.r_x = self.r_y = math.nan
        self.largest = 0  # most models held at once
        self.received = 0  # models received in all
        if not self.batches[0]:
            self._start_decisions()

    @property
    def done(self) -> bool:
        return self.phase == 2

    def request(self) -> list[int]:
        return [] if self.done else list(self.batches[self.phase][self.step])

    def feed(self, rows: Mapping[int, torch.Tensor]) -> None:
        ids = self.request()
        assert ids, "BGGC.feed after it finished"
        assert len(ids) <= self.budget, "a BGGC batch larger than the budget"
        self.largest = max(self.largest, len(ids))
        self.received += len(ids)
        s = _Scratch.get(self.w_x, self.dtype)
        if self.phase == 0:
            for j in ids:
                self.w_y.add_(s.wj.copy_(rows[j]).mul_(self.p[j]))
                self.p_y += self.p[j]
            self.step += 1
            if self.step == len(self.batches[0]):
                self._start_decisions()
            return
        for j in ids:
            if len(self.x) - 1 >= self.budget:
                break
            wj = s.wj.copy_(rows[j]).mul_(self.p[j])  # p_j row_j in float64
            torch.add(self.w_x, wj, out=s.sx)
            torch.sub(self.w_y, wj, out=s.sy)
            torch.div(s.sx, self.p_x + self.p[j], out=s.pair64[0])
            torch.div(s.sy, self.p_y - self.p[j], out=s.pair64[1])
            r = self.reward(s.pair.copy_(s.pair64))
            r_xj, r_yj = float(r[0]), float(r[1])
            a, b = max(r_xj - self.r_x, 0.0), max(r_yj - self.r_y, 0.0)
            if take(a, b, self.g.random()):  # the sum tried becomes the set's: swapped in, no copy
                self.x.append(j)
                self.w_x, s.sx = s.sx, self.w_x
                self.p_x, self.r_x = self.p_x + self.p[j], r_xj
            else:
                self.w_y, s.sy = s.sy, self.w_y
                self.p_y, self.r_y = self.p_y - self.p[j], r_yj
        self.step += 1
        if self.step == len(self.batches[1]) or len(self.x) - 1 >= self.budget:
            self.phase = 2

    def _start_decisions(self) -> None:
        self.phase, self.step = 1, 0
        self.r_x, self.r_y = _pair(self.reward, self.w_x / self.p_x, self.w_y / self.p_y,
                                   _Scratch.get(self.w_x, self.dtype))
        if not self.batches[1]:
            self.phase = 2

    @property
    def result(self) -> Choice:
        assert self.done
        return Choice(sorted(self.x[1:]), self.r_x, (self.w_x / self.p_x).to(self.dtype))


def bggc(k: int, candidates: Sequence[int], own: torch.Tensor, p: np.ndarray, reward: Reward, budget: float,
         g: np.random.Generator, fetch: Callable[[list[int]], Mapping[int, torch.Tensor]]) -> Choice:
    """Run one BGGC to the end, ``fetch(ids)`` serving each batch."""
    run = BGGC(k, candidates, own, p, reward, budget, g)
    while not run.done:
        run.feed(fetch(run.request()))
    return run.result


def drive(comm: Comm, rows: torch.Tensor, runs: Mapping[int, BGGC], stop: Interrupt | None = None) -> np.ndarray:
    """Run this rank's BGGC processes (keyed by local index) in lockstep, one
    collective ``pull`` per batch step until every rank's are done. Returns, per
    local client, the most models it received in one pull (byte counters). A stop
    signal (``stop``) ends it between steps, on every rank together."""
    stop = stop or Interrupt()
    most = np.zeros(comm.n_local, np.int64)
    while True:
        wanted = {i: run.request() for i, run in runs.items()}
        wanted = {i: w for i, w in wanted.items() if w}
        if stop.agreed(comm, len(wanted)) == 0:
            return most
        before = comm.models_recv.copy()
        got = comm.pull(rows, wanted)
        np.maximum(most, comm.models_recv - before, out=most)
        for i, w in wanted.items():
            runs[i].feed({j: got[j] for j in w})
        del got


# --------------------------------------------------------------------------- the algorithm


@dataclass
class Peer:
    """One local client's graph state."""

    greedy: bool  # runs BGGC/GGC (false: a malicious client told not to)
    omega: list[int]  # candidates Omega_k, fixed after round 0
    chosen: list[int]  # collaborators C_k of the latest GGC


@dataclass
class State:
    budget: float  # B_c in clients (math.inf when unbounded)
    p: np.ndarray  # [N] p_i
    malicious: np.ndarray  # [N] bool
    peers: list[Peer] = per_client()  # one per local client


def derangement(n: int, g: np.random.Generator) -> np.ndarray:
    """A permutation of range(n) moving every element (n >= 2)."""
    while True:
        perm = g.permutation(n)
        if not np.any(perm == np.arange(n)):
            return perm


def init(ctx: Context) -> State:
    cfg, c, N = ctx.params, ctx.clients, ctx.N
    malicious = np.zeros(N, bool)
    n_bad = math.floor(cfg.malicious * N + 0.5)
    if n_bad:
        malicious[ctx.rng(-1, GLOBAL, "dpfl_malicious").choice(N, n_bad, replace=False)] = True
        perm = torch.as_tensor(derangement(c.n_classes, ctx.rng(-1, GLOBAL, "dpfl_flip")), device=c.device)
        for i, k in enumerate(ctx.comm.local_ids):
            if malicious[k]:
                c.relabel(i, perm)
    peers = [Peer(greedy=not (malicious[k] and not cfg.malicious_run_ggc), omega=[], chosen=[])
             for k in ctx.comm.local_ids]
    return State(cfg.budget_for(N), ctx.p, malicious, peers)


def _reward(ctx: Context, i: int) -> Reward:
    c = ctx.clients
    pair = c.scorer("val", np.full(2, i))  # GGC scores two models a decision: its samples gathered once

    def reward(models: torch.Tensor) -> np.ndarray:
        models = models.to(c.params.dtype)
        return -(pair(models) if len(models) == 2 else c.evaluate("val", models, np.full(len(models), i))[0])

    return reward


def _mean(ids: list[int], rows: Mapping[int, torch.Tensor], p: np.ndarray) -> torch.Tensor:
    w = torch.as_tensor(p[ids] / p[ids].sum(), dtype=torch.float64)
    return (w.to(rows[ids[0]].device) @ torch.stack([rows[j] for j in ids]).double()).to(rows[ids[0]].dtype)


def _preprocess(ctx: Context, state: State) -> tuple[list[torch.Tensor | None], np.ndarray]:
    """Round 0 after training: Omega_k for every local client and its new row."""
    c, comm, N, B = ctx.clients, ctx.comm, ctx.N, state.budget
    new: list[torch.Tensor | None] = [None] * comm.n_local
    if ctx.params.random_graph:
        for i, k in enumerate(comm.local_ids):
            others = np.delete(np.arange(N), k)
            n = int(min(B, N - 1))
            if state.peers[i].greedy:
                g = ctx.rng(0, int(k), "dpfl_random_graph")
                state.peers[i].omega = sorted(int(j) for j in g.choice(others, n, replace=False))
        return _aggregate_pulled(ctx, state, [pe.omega for pe in state.peers])
    runs = {i: BGGC(int(k), np.delete(np.arange(N), k), c.params[i], state.p, _reward(ctx, i), B,
                    ctx.rng(0, int(k), "dpfl_bggc"))
            for i, k in enumerate(comm.local_ids) if state.peers[i].greedy}
    most = drive(comm, c.params, runs, ctx.stop)
    for i, run in runs.items():
        choice = run.result
        assert len(choice.members) <= B and run.largest <= B
        state.peers[i].omega = choice.members
        new[i] = choice.mean
    return new, most


def _aggregate_pulled(ctx: Context, state: State,
                      sets: list[list[int]]) -> tuple[list[torch.Tensor | None], np.ndarray]:
    """Pull each local client's ``sets[i]`` and average over it plus itself."""
    c, comm = ctx.clients, ctx.comm
    got = comm.pull(c.params, {i: s for i, s in enumerate(sets) if s})
    new: list[torch.Tensor | None] = [None] * comm.n_local
    for i, (k, s) in enumerate(zip(comm.local_ids, sets)):
        if s:
            new[i] = _mean([int(k), *s], {**{j: got[j] for j in s}, int(k): c.params[i]}, state.p)
            state.peers[i].chosen = list(s)
    return new, comm.models_recv.copy()


def _trained_metrics(ctx: Context, t: int) -> dict[str, np.ndarray]:
    """val/test loss and accuracy of every client's model after its local training
    and before aggregation (``trained_*``; nan in rounds without evaluation). The
    run's own metrics are those of the aggregated model the round ends with."""
    n = ctx.comm.n_local
    if evaluates(ctx.cfg, t):
        got = own_rows_metrics(ctx)
    else:
        got = {f"{s}_{m}": np.full(n, np.nan) for s in ("val", "test") for m in ("loss", "acc")}
    return {f"trained_{k}": np.asarray(v, np.float32) for k, v in got.items()}


def round(ctx: Context, state: State, t: int) -> Round:
    cfg, c, comm, N = ctx.params, ctx.clients, ctx.comm, ctx.N
    everyone = np.arange(comm.n_local)
    loss = c.train(everyone, cfg.tau_init if t == 0 else cfg.tau_train, t)
    trained = _trained_metrics(ctx, t)
    if t == 0:
        new, most = _preprocess(ctx, state)
        for pe in state.peers:
            pe.chosen = list(pe.omega)
    elif cfg.random_graph or (t - 1) % cfg.period != 0:
        new, most = _aggregate_pulled(ctx, state, [pe.chosen for pe in state.peers])
    else:
        got = comm.pull(c.params, {i: pe.omega for i, pe in enumerate(state.peers) if pe.greedy and pe.omega})
        most = comm.models_recv.copy()
        new = [None] * comm.n_local
        for i, (k, pe) in enumerate(zip(comm.local_ids, state.peers)):
            if not (pe.greedy and pe.omega) or ctx.stop.requested:
                continue
            # GGC as BGGC over the pulled Omega_k: the same decisions (Theorem 1) from
            # running sums, O(P) per candidate instead of re-averaging the set
            choice = bggc(int(k), pe.omega, c.params[i], state.p, _reward(ctx, i), state.budget,
                          ctx.rng(t, int(k), "dpfl_ggc"), lambda ids: got)
            pe.chosen, new[i] = choice.members, choice.mean
        del got
        ctx.stop.agreed(comm)  # a client skipped for a stop signal: every rank abandons the round here
    assert most.max(initial=0) <= state.budget, "a client received more than B_c models in one pull"
    for i, row in enumerate(new):
        if row is not None:
            c.params[i] = row
    c.reset_optimizer()

    cand = np.zeros((comm.n_local, N), bool)
    coll = np.zeros((comm.n_local, N), bool)
    mixing = np.zeros((comm.n_local, N), np.float32)
    for i, (k, pe) in enumerate(zip(comm.local_ids, state.peers)):
        cand[i, pe.omega] = True
        coll[i, pe.chosen] = True
        members = [int(k), *pe.chosen]
        mixing[i, members] = state.p[members] / state.p[members].sum()
    reward = -c.evaluate("val")[0]
    out = Round(train_loss=loss, mixing=Dense(mixing),
                extras={"candidates": cand, "collaborators": coll, "reward": reward.astype(np.float32),
                        "max_batch_models": most.astype(np.int64), **trained})
    if t == 0:
        out.once["malicious"] = state.malicious[comm.local_ids]
        out.attrs["dpfl_budget"] = float(state.budget)
    return out


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    return own_rows_metrics(ctx)
