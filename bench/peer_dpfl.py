"""DPFL's graph construction against its authors' code (github salmakh1/DPFL, read
from a local checkout that is never written to): the same clients' models, the
same validation data and the same budget go to mpifl's BGGC/GGC and to the
authors' GGC, and the collaborator sets they choose are compared client by client.

    python bench/peer_dpfl.py --dpfl /tmp/DPFL --deps /tmp/dpfl-venv/lib/python3.11/site-packages
    python bench/peer_dpfl.py --dpfl /tmp/DPFL --deps ... --seeds 0 1 --val-batch 32

``--deps`` is a folder holding the authors' dependencies that mpifl's venv lacks and
their graph code imports (omegaconf, hydra-core, ordered-set; bench/README.md
says how to make it); it goes at the end of ``sys.path``, so mpifl's own packages
(torch, numpy) are the ones used. Stand-ins, none touching the maths:
``wandb`` (logging only) is a no-op module, and ``orderedset`` (a Cython package
that does not build on Python 3.11) is the pure-Python ``ordered-set`` package's
``OrderedSet`` (the same insertion-ordered set; the authors use it to keep the
order of a tried set's members, which only orders a sum).

How it is driven. The authors' GGC is ``selection.bandits.optimized_rgl_p``: their
training method ``trainClientsFL.train_clients`` (fl/train_clients_constrained_rgl.py)
calls it for every client at every graph round with the client's model, every
client's trained weights, the candidate list (the client first, then the others in
the rotated order ``active_clients[k:] + active_clients[:k]``; at later graph rounds
that list filtered to the first set found, ``greedy_set``), the client's
validation loader, the data weights and ``cardinality``. This script runs mpifl's
``dpfl`` for two rounds in one process (preprocessing BGGC over all clients, then
GGC over Omega), records the models each client's BGGC/GGC saw by wrapping
``dpfl.drive`` and ``dpfl.bggc``, and calls the authors' function with exactly
those models, as their training method would. Two of their calls are patched so
that both sides draw the same random numbers: ``random.shuffle`` of the
candidates (the authors' ``z_``) puts them in the order mpifl's stream gives
(a permutation of the sorted ids), and ``np.random.uniform`` returns that
stream's next uniform, one per decision, as mpifl draws them. The authors'
``cardinality`` counts the client itself (their loop stops at ``len(xi) ==
cardinality``); mpifl's ``B_c`` does not, so they get ``B_c + 1`` (N for inf).

Reported per partition, budget and graph round: clients whose sets agree, for the
validation loss as a per-sample mean over the split (mpifl's F_k^V; ``--val-batch
0``, the default) and, with ``--val-batch 32``, as the authors' mean of per-batch
means with their loader's batch size.

``--e2e`` runs both methods end to end instead (``run_authors``: their
``train_clients`` on mpifl's partition and initial weights, with their client's
hard-coded SGD matched on mpifl's side, ``ALIGN``) for every ``--seeds`` seed, and
prints mpifl - authors per seed over clients and over seeds paired by seed, with
analyze's interval; ``--authors-momentum reset`` clears their clients' momentum
after every aggregation, as mpifl's LocalOpt starts afresh.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# --e2e: their client's SGD is hard-coded (fl_client/client_celoss.py): momentum 0.9,
# weight decay 1e-4 whatever the config says; the jobs files hold the paper's 1e-3
ALIGN = ["train.momentum=0.9", "train.weight_decay=0.0001"]
JOBS = {"dir": "jobs/dpfl-fashionmnist-dir.yaml", "patho": "jobs/dpfl-fashionmnist-patho.yaml"}
BUDGETS = ["inf", "0.2N", "0.1N"]


def authors_ggc(dpfl_dir: Path, deps: Path | None):
    """The authors' ``optimized_rgl_p`` and its module, with the logging-only stand-ins."""
    sys.path.insert(0, str(dpfl_dir))
    if deps is not None:
        sys.path.append(str(deps))
    if "wandb" not in sys.modules:
        wandb = types.ModuleType("wandb")
        wandb.init = wandb.log = wandb.finish = lambda *a, **k: None
        sys.modules["wandb"] = wandb
    if "orderedset" not in sys.modules:
        from ordered_set import OrderedSet

        shim = types.ModuleType("orderedset")
        shim.OrderedSet = OrderedSet
        sys.modules["orderedset"] = shim
    bandits = importlib.import_module("selection.bandits")
    return bandits


def mpifl_rounds(job: str, budget: str, n_clients: int, seed: int, extra: list[str]):
    """Rounds 0 and 1 of mpifl's dpfl; returns (ctx, per-round logged sets, what
    each client's BGGC/GGC saw: (t, k, candidates, {j: row}, own row))."""
    from mpifl import config
    from mpifl.algorithms import dpfl
    from mpifl.comm import solo
    from mpifl.run import runtime

    cfg = config.load(REPO / job, [f"data.n_clients={n_clients}", f"dpfl.budget={budget}", "run.rounds=2",
                                   f"run.seed={seed}", "run.threads=1", "run.device=cpu", *extra])
    ctx = runtime.setup(cfg, solo()).ctx
    seen: list[tuple] = []
    drive0, bggc0 = dpfl.drive, dpfl.bggc

    def drive(comm, rows, runs):
        snap = rows.detach().clone()
        for i, run in runs.items():
            others = [j for j in range(ctx.N) if j != run.k]
            seen.append((0, run.k, others, {j: snap[j] for j in others}, snap[i]))
        return drive0(comm, rows, runs)

    def bggc(k, candidates, own, p, reward, budget, g, fetch):
        got = fetch(list(candidates))
        seen.append((1, int(k), list(candidates), {j: got[j].detach().clone() for j in candidates},
                     own.detach().clone()))
        return bggc0(k, candidates, own, p, reward, budget, g, fetch)

    dpfl.drive, dpfl.bggc = drive, bggc
    try:
        state = dpfl.init(ctx)
        logged = []
        for t, name in ((0, "candidates"), (1, "collaborators")):
            ctx.comm.reset_counters()  # as the runtime does before every round
            logged.append(dpfl.round(ctx, state, t).extras[name])
    finally:
        dpfl.drive, dpfl.bggc = drive0, bggc0
    return ctx, logged, seen


def authors_choice(bandits, ctx, t: int, k: int, candidates: list[int], rows: dict, own: torch.Tensor,
                   omega: list[int] | None, budget: float, val_batch: int) -> list[int]:
    """The authors' GGC for client k on the recorded models, drawing mpifl's numbers."""
    from torch.utils.data import DataLoader, TensorDataset

    c, N = ctx.clients, ctx.N
    layout = c.layout
    weights = {j: {n: v.detach().clone() for n, v in layout.unflatten(r).items()} for j, r in {**rows, k: own}.items()}
    lo, hi = c.split_range(k, "val")
    val = TensorDataset(c.x[lo:hi].cpu(), c.y[lo:hi].cpu())
    loader = DataLoader(val, batch_size=val_batch or (hi - lo), shuffle=False)
    rotated = list(range(k, N)) + list(range(k))  # active_clients[indx:] + active_clients[:indx]
    active = [j for j in rotated if j == k or j in candidates]
    if omega is not None:  # greedy_set: the rotated list filtered to the first set found
        active = [j for j in rotated if j == k or j in omega]
    purpose = "dpfl_bggc" if t == 0 else "dpfl_ggc"
    g = ctx.rng(t, k, purpose)

    def shuffle(z):
        z[:] = [int(j) for j in g.permutation(np.sort(np.asarray(z, np.int64)))]

    uniform0, shuffle0 = bandits.np.random.uniform, bandits.random.shuffle
    bandits.random.shuffle = shuffle
    bandits.np.random.uniform = lambda lo_=0, hi_=1: g.random()
    try:
        card = N if math.isinf(budget) else int(budget) + 1
        x, _ = bandits.optimized_rgl_p(model=copy.deepcopy(c.model).cpu(), local_weights=weights,
                                       active_clients=active, device=torch.device("cpu"), data_set=loader,
                                       sampling=False, p_=[1], agg_base=False, selected=dict.fromkeys(range(N), 0),
                                       data_weights=[float(v) for v in ctx.p], cardinality=card, t=t,
                                       task="notNLP", indd=None)
    finally:
        bandits.random.shuffle, bandits.np.random.uniform = shuffle0, uniform0
    return sorted(int(j) for j in x if j != k)


def unit(args) -> list[dict]:
    bandits = authors_ggc(args.dpfl, args.deps)
    rows = []
    for seed in args.seeds:
        for part in args.partitions:
            for budget in BUDGETS:
                torch.manual_seed(seed)
                random.seed(seed)
                ctx, logged, seen = mpifl_rounds(JOBS[part], budget, args.clients, seed, args.overrides)
                B = ctx.cfg.dpfl.budget_for(ctx.N)
                omega = {k: list(np.flatnonzero(logged[0][k])) for k in range(ctx.N)}
                agree = {0: 0, 1: 0}
                total = {0: 0, 1: 0}
                sizes = {0: [], 1: []}
                for t, k, cands, models, own in seen:
                    ours = sorted(np.flatnonzero(logged[t][k]).tolist())
                    theirs = authors_choice(bandits, ctx, t, k, cands, models, own,
                                            omega[k] if t == 1 else None, B, args.val_batch)
                    total[t] += 1
                    agree[t] += ours == theirs
                    sizes[t].append(len(ours))
                    if ours != theirs and args.verbose:
                        print(f"  differ: seed {seed} {part} B={budget} t={t} k={k}: mpifl {ours} authors {theirs}")
                for t in (0, 1):
                    row = {"seed": seed, "partition": part, "budget": budget, "B_c": B, "graph": "BGGC" if t == 0
                           else "GGC", "agree": agree[t], "clients": total[t],
                           "mean_set": float(np.mean(sizes[t])) if sizes[t] else 0.0}
                    rows.append(row)
                    print(f"seed {seed}  {part:5s}  B_c={budget:5s} ({B:g})  {row['graph']:4s}  "
                          f"same set: {agree[t]}/{total[t]}  mean |set| {row['mean_set']:.2f}", flush=True)
    return rows


# --------------------------------------------------------------------------- end to end


class _Datamodule:
    """Serves mpifl's partition the way the authors' datamodules do (their
    ``train_loaders``/``val_loaders`` conventions: batch_size, train shuffled, the
    rest in order, client by client through ``next_client``/``set_client``)."""

    def __init__(self, splits: list[dict], n_classes: int, batch_size: int, p: np.ndarray):
        self.splits, self.num_classes, self.batch_size, self.p = splits, n_classes, batch_size, p
        self.current_client_idx = 0

    def load_and_split(self, cfg, **_):
        from torch.utils.data import TensorDataset

        def sets(name):
            return [TensorDataset(*s[name]) for s in self.splits]

        weights = {i: float(v) for i, v in enumerate(self.p)}
        return sets("train"), sets("val"), None, sets("test"), None, None, None, None, weights

    def _loader(self, sets, shuffle):
        from torch.utils.data import DataLoader

        return DataLoader(sets[self.current_client_idx], batch_size=self.batch_size, shuffle=shuffle, drop_last=False)

    def train_loaders(self, sets):
        return self._loader(sets, True)

    def val_loaders(self, sets):
        return self._loader(sets, False)

    def global_test_loader(self, _):
        return None

    def set_client(self):
        self.current_client_idx = 0

    def next_client(self):
        self.current_client_idx += 1


class _BaseHead(torch.nn.Module):
    """mpifl's MLP split as the authors' models are: ``base`` (all but the last
    layer) and ``classifier`` (their code reads ``model.base``)."""

    def __init__(self, seq: torch.nn.Sequential):
        super().__init__()
        self.base = torch.nn.Sequential(*list(seq)[:-1])
        self.classifier = seq[-1]

    def forward(self, x):
        return self.classifier(self.base(x))


def run_authors(dpfl_dir: Path, deps: Path | None, cfg, rounds: int, local_steps: int, cardinality: int,
                reset_momentum: bool = False) -> dict:
    """The authors' ``trainClientsFL.train_clients`` on mpifl's partition and initial
    weights; per round and client, val and test accuracy of the model after local
    training and after aggregation (per-sample means, and the authors' batch means)."""
    from mpifl import models
    from mpifl.data import build

    authors_ggc(dpfl_dir, deps)  # their path, the stand-ins, and --deps on sys.path
    from omegaconf import OmegaConf
    mod = importlib.import_module("fl.train_clients_constrained_rgl")
    client_mod = importlib.import_module("fl_client.client_celoss")
    N = cfg.data.n_clients
    data = build(cfg.data, cfg.run.seed, np.arange(N))
    splits = []
    for k in range(N):
        one = {}
        for s, name in enumerate(("train", "val", "test")):
            lo, n = int(data.offsets[k, s]), int(data.sizes[k, s])
            one[name] = (torch.from_numpy(data.x[lo:lo + n]).float(), torch.from_numpy(data.y[lo:lo + n]).long())
        splits.append(one)
    p = data.sizes[:, 0] / data.sizes[:, 0].sum()
    dm = _Datamodule(splits, data.n_classes, cfg.train.batch_size, p)
    init = models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)  # mpifl's initial weights
    real_instantiate = mod.instantiate

    def instantiate(node, *a, **k):
        target = str(node.get("_target_", ""))
        if target == "peer.datamodule":
            return dm
        if target == "peer.model":
            return _BaseHead(copy.deepcopy(init))
        return real_instantiate(node, *a, **k)

    record: dict = {"trained": {}, "agg": {}, "trained_batchmean": {}, "agg_batchmean": {}}
    where = {"t": -1, "phase": "trained"}
    train0, validation0, testing0 = client_mod.Client.train, client_mod.Client.validation, mod.testing_

    def train(self, t=None, last_round=False):
        where["t"], where["phase"] = t, "trained"
        if reset_momentum and t is not None and t >= 3:  # their first aggregation ends round 2
            self.optimizer.state.clear()
        return train0(self, t=t, last_round=last_round)

    def validation(self, test_=False):
        out = validation0(self, test_=test_)
        split = "test" if test_ else "val"
        x, y = splits[self.client_id][split]
        self.model.eval()
        with torch.no_grad():
            acc = float((self.model(x).argmax(1) == y).float().mean())
        key = (where["t"], self.client_id, split)
        record[where["phase"]][key] = acc
        record[where["phase"] + "_batchmean"][key] = out["global_val_acc"] / 100
        return out

    def testing_(*a, **k):
        where["phase"] = "agg"
        try:
            return testing0(*a, **k)
        finally:
            where["phase"] = "trained"

    patches = {(mod, "instantiate"): instantiate, (mod, "testing_"): testing_,
               (mod, "run_wandb"): lambda *a, **k: "peer", (mod, "wandb_log"): lambda *a, **k: None,
               (mod, "saving_model"): lambda *a, **k: None, (mod, "initialize_weights"): lambda m: None,
               (client_mod.Client, "train"): train, (client_mod.Client, "validation"): validation,
               (torch.cuda, "current_device"): lambda: 0}
    saved = {key: getattr(*key) for key in patches}
    for (obj, name), fn in patches.items():
        setattr(obj, name, fn)
    conf = OmegaConf.create({
        "task": "notNLP", "device": False, "gpus": [0], "use_wandb": True, "rounds": rounds,
        "num_clients": N, "m": N, "available_clients": N,
        "split": {"alpha": cfg.data.dirichlet_alpha, "missing_classes": 0, "min_dataset_size": 0},
        "datamodule": {"_target_": "peer.datamodule", "seed": cfg.run.seed, "num_classes": data.n_classes},
        "model": {"_target_": "peer.model", "num_classes": data.n_classes},
        "client": {"_target_": "fl_client.client_celoss.Client", "client_id": 0, "local_steps": local_steps,
                   "task": "notNLP", "learning_rate": cfg.train.lr, "batch_size": cfg.train.batch_size,
                   "topk": False},
        "selection": {"_target_": "src.utils.train_utils.random_selection", "seed": cfg.run.seed},
        "sampling": False, "cardinality": cardinality, "p": [1], "periodicity_of_bandit": 1, "repetition": True,
        "greedy_set": True, "weighted_avg": True, "rgl": True, "constrained_greedy": False,
        "malicious_clients": False, "selected_attack": {}, "bandit": True, "global_": False, "real_bandit": False,
        "FedAvg": False, "random_sel": False, "rgl_base": False})
    try:
        trainer = mod.trainClientsFL(N, N, N, conf, {"split": "dirichlet", "datamodule": "peer"})
        t0 = time.perf_counter()
        trainer.train_clients()
        wall = time.perf_counter() - t0
    finally:
        for (obj, name), fn in saved.items():
            setattr(obj, name, fn)

    def grid(kind, split):
        return np.array([[record[kind][(t, k, split)] for k in range(N)] for t in range(rounds)])

    return {f"{kind}_{split}": grid(kind, split) for kind in record for split in ("val", "test")} | {"wall": wall}


def run_mpifl(job: str, budget: str, n_clients: int, seed: int, rounds: int, local_steps: int, extra: list[str],
              work: Path) -> dict:
    """``python -m mpifl.main`` on the same setting (one rank, one thread)."""
    from mpifl.logging.h5 import open_run

    args = [str(REPO / job), f"data.n_clients={n_clients}", f"dpfl.budget={budget}", f"run.rounds={rounds}",
            f"run.seed={seed}", f"dpfl.tau_init={3 * local_steps}", f"dpfl.tau_train={local_steps}",
            "dpfl.period=1", "run.threads=1", "run.device=cpu", f"run.out_dir={work}", "run.name=mpifl",
            "run.checkpoint_every=0", *extra]
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "mpifl.main", *args], cwd=REPO, capture_output=True, text=True,
                       check=False, env={**os.environ, "PYTHONPATH": str(REPO)})
    if p.returncode != 0:
        raise RuntimeError(f"mpifl failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    run = open_run(work / "mpifl")
    return {"agg_val": run.metric("val_acc"), "agg_test": run.metric("test_acc"),
            "trained_val": run.get("dpfl/trained_val_acc"), "trained_test": run.get("dpfl/trained_test_acc"),
            "wall": time.perf_counter() - t0}


def interval(d: np.ndarray) -> str:
    """Mean of the differences ``d`` (fractions) in points, with analyze's paired 95% t interval."""
    from mpifl.analysis.stats import paired_interval

    m, lo, hi, n = paired_interval(100 * np.asarray(d, np.float64))
    return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}] (n={n})"


def e2e(args) -> None:
    """Both methods per partition, budget and seed; mpifl - authors per seed over
    clients, then over seeds (each seed's mean over clients, paired by seed)."""
    from mpifl import config
    from mpifl.analysis.summary import best_val

    for part in args.partitions:
        for budget in args.budgets:
            per_seed: dict[str, list[tuple[float, float]]] = {}
            for seed in args.seeds:
                cfg = config.load(REPO / JOBS[part], [f"data.n_clients={args.clients}", f"run.seed={seed}",
                                                      *ALIGN, *args.overrides])
                B = config.load(REPO / JOBS[part], [f"data.n_clients={args.clients}", f"dpfl.budget={budget}"]
                                ).dpfl.budget_for(args.clients)
                card = args.clients if math.isinf(B) else int(B) + 1
                with tempfile.TemporaryDirectory() as work:
                    ours = run_mpifl(JOBS[part], budget, args.clients, seed, args.rounds, args.local_steps,
                                     [*ALIGN, *args.overrides], Path(work))
                theirs = run_authors(args.dpfl, args.deps, cfg, args.rounds + 2, args.local_steps, card,
                                     reset_momentum=args.authors_momentum == "reset")
                print(f"{part} B_c={budget} seed {seed}: wall mpifl {ours['wall']:.0f} s, "
                      f"authors {theirs['wall']:.0f} s", flush=True)
                for kind in ("trained", "agg"):
                    # the authors' rounds 0-1 are local only: their round r + 2 is mpifl's round r
                    tv, tt = theirs[f"{kind}_val"][2:], theirs[f"{kind}_test"][2:]
                    ov, ot = ours[f"{kind}_val"], ours[f"{kind}_test"]
                    for point, o, t in (("final", ot[-1], tt[-1]), ("best-val", best_val(ov, ot), best_val(tv, tt))):
                        per_seed.setdefault(f"{kind:7s} {point:8s}", []).append((o.mean(), t.mean()))
                        print(f"  {kind:7s} {point:8s} test acc: mpifl {100 * o.mean():.2f}, authors "
                              f"{100 * t.mean():.2f}, over clients {interval(o - t)}", flush=True)
                bm = theirs["agg_batchmean_test"][-1]
                print(f"  authors' own final aggregated test acc (mean of batch means): {100 * bm.mean():.2f}",
                      flush=True)
            print(f"{part} B_c={budget}, {len(args.seeds)} seeds (their momentum: {args.authors_momentum}); "
                  "mean over clients per seed, paired by seed:")
            for key, pairs in per_seed.items():
                o, t = np.array(pairs).T
                print(f"  {key} mpifl {100 * o.mean():.2f}, authors {100 * t.mean():.2f}, "
                      f"mpifl - authors {interval(o - t)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dpfl", type=Path, required=True, help="a checkout of salmakh1/DPFL")
    ap.add_argument("--deps", type=Path, help="a site-packages folder with omegaconf, hydra-core, ordered-set")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--partitions", nargs="+", default=["dir", "patho"], choices=sorted(JOBS))
    ap.add_argument("--val-batch", type=int, default=0,
                    help="the authors' validation loader batch (0 = the whole split: the per-sample mean)")
    ap.add_argument("--verbose", action="store_true", help="print every client whose sets differ")
    ap.add_argument("--e2e", action="store_true", help="run both methods end to end instead of the graph check")
    ap.add_argument("--budgets", nargs="+", default=BUDGETS, help="--e2e: budgets to run")
    ap.add_argument("--rounds", type=int, default=6, help="--e2e: mpifl rounds (the authors run 2 more)")
    ap.add_argument("--local-steps", type=int, default=1, help="--e2e: local epochs per round (tau_train)")
    ap.add_argument("--authors-momentum", choices=["keep", "reset"], default="keep",
                    help="--e2e: their SGD momentum across aggregation: kept (their code) or cleared after "
                         "every aggregation round, as mpifl's LocalOpt starts afresh")
    ap.add_argument("overrides", nargs="*", help="mpifl section.key=value on top of the jobs file")
    args = ap.parse_args(argv)
    if args.e2e:
        e2e(args)
        return 0
    rows = unit(args)
    bad = [r for r in rows if r["agree"] != r["clients"]]
    print(f"{len(rows) - len(bad)}/{len(rows)} (partition, budget, graph) cases agree on every client")
    return 0 if not bad or args.val_batch else 1


if __name__ == "__main__":
    sys.exit(main())
