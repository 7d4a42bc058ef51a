"""Side by side with PFLlib: the same method, splits, model, initial weights and
hyper-parameters in mpifl and in PFLlib, read from a local checkout.

    python bench/peer_pfllib.py --pfllib /path/to/PFLlib --method fedavg --seeds 0 1 2
    python bench/peer_pfllib.py --pfllib /path/to/PFLlib --method fedprox --rounds 20 fedprox.mu=0.1
    python bench/peer_pfllib.py --pfllib ... --method fedavg --only mpifl      # one side only

For each seed: mpifl builds its partition (``mpifl.data.build``: every client's
train/val/test split), and this script writes PFLlib's client files from it
(``dataset/<name>/train|test/<i>.npz`` in a scratch copy of PFLlib's ``system/``
folder, so the checkout is never written to): client i's training split as its
train file and its test split as its test file (PFLlib has no validation split;
the clients' val samples go unused there). PFLlib's ``system/main.py`` then runs
as its own process, with its ``DNN`` model replaced by mpifl's model of the same
seed (same layers, same initial weights; the last ``nn.Linear`` is its ``fc``,
which PFLlib's head-splitting methods take as the head). mpifl runs
``python -m mpifl.main`` with the same config. The two alternate per seed (mpifl,
PFLlib, mpifl, ...), so machine load hits them alike.

Reported per side and seed: final test accuracy after ``--rounds`` rounds, as the
mean over clients of each client's accuracy (mpifl's tables) and as PFLlib's
``sum(correct) / sum(samples)`` (its "Averaged Test Accuracy"), and the wall time
of the whole process. Both sides start with their Python modules byte-compiled
(mpifl's package and PFLlib's scratch copy, ``compileall``): with
PYTHONDONTWRITEBYTECODE set, each process would otherwise compile them again, a
cost no installed package pays; the dataset is read (or made) once before
anything is timed, which fills mpifl's dataset cache (``mpifl/data/cache.py``)
as a user's first run does. PFLlib evaluates at the start of each of its rounds 0..R,
so its evaluation at round R follows R rounds of training, as mpifl's last does.

Mapped hyper-parameters (``BASE`` and each method's row of ``METHODS``): rounds,
clients, join ratio, batch size, learning rate, local epochs, classes; a method
adds its own. PFLlib trains plain SGD (no momentum, no weight decay), so the
config must ask mpifl for the same. PFLlib is never imported by mpifl: it runs
only here, as a measuring stick.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The common ground of every comparison (mpifl keys; overridable on the command line)
DEFAULTS = {
    "data.name": "digits", "data.partition": "dirichlet", "data.n_clients": 20, "data.dirichlet_alpha": 0.1,
    "model.name": "mlp", "model.hidden": "[128, 128]", "train.optimizer": "sgd", "train.lr": 0.05,
    "train.momentum": 0.0, "train.weight_decay": 0.0, "train.batch_size": 10, "train.local_epochs": 1,
    "run.rounds": 20, "algorithm.fraction": 1.0,
    # a plain MLP trains batched under auto; a BatchNorm MLP's path would be timed at start
    # and could differ from launch to launch (and so its bits): pinned
    "train.batched": "on",
}

# PFLlib flag -> the mpifl key it takes its value from
BASE = {"-gr": "run.rounds", "-nc": "data.n_clients", "-jr": "algorithm.fraction",
        "-lbs": "train.batch_size", "-lr": "train.lr", "-ls": "train.local_epochs"}

# mpifl algorithm -> (PFLlib's -algo, {PFLlib flag: mpifl key, fixed value, or a
# function of the flattened mpifl config}); a method's engineer adds its row,
# mapping every hyper-parameter PFLlib reads
METHODS: dict[str, tuple[str, dict[str, str | float | int | Callable[[dict], object]]]] = {
    "fedavg": ("FedAvg", {}),
    "local": ("Local", {}),
    # PFLlib's server sends the top -M rows of its affinity matrix, which starts as the
    # identity: its M counts the client's own stored model, so M = fedfomo.m + 1 gives
    # both sides m other clients' models. Its validation share is fixed at 0.2 in
    # clientfomo.py (fedfomo.val_frac's default); it has no epsilon-greedy exploration.
    "fedfomo": ("FedFomo", {"-M": lambda flat: int(flat["fedfomo.m"]) + 1}),
    # PFLlib's FedProto: MSE (mean over coordinates) to the global prototype x lamda,
    # as mpifl's; it averages prototypes uniformly over clients and collects them
    # during training (mpifl: count-weighted, after training; bench/README.md)
    "fedproto": ("FedProto", {"-lam": "fedproto.lam"}),
    # PFLlib's -al is APFL's initial alpha; its alpha step is -lr, as mpifl's (train.lr)
    "apfl": ("APFL", {"-al": "apfl.alpha"}),
    # PFLlib's PerAvg: inner step, outer step (beta) and evaluation step are all -lr
    # (run mpifl with perfedavg.alpha=train.lr, perfedavg.beta=0); a step takes a
    # 2 x -lbs batch split in two, as mpifl's fo; its server calls each client's
    # train() twice a round, so -ls is half of mpifl's train.local_epochs
    "perfedavg": ("PerAvg", {"-ls": lambda flat: max(1, int(flat["train.local_epochs"]) // 2)}),
    "fedrod": ("FedROD", {}),
    # clientProx: PerturbedGradientDescent, grad + mu (w - w_global)
    "fedprox": ("FedProx", {"-mu": "fedprox.mu"}),
    # clientDitto: args.mu is Ditto's lambda; ptrain runs plocal_epochs (mpifl's 0 = train.local_epochs)
    "ditto": ("Ditto", {"-mu": "ditto.lam",
                        "-pls": lambda flat: flat["ditto.personal_epochs"] or flat["train.local_epochs"]}),
    # clientRep: plocal_epochs of head (body frozen), then local_epochs of body (head frozen)
    "fedrep": ("FedRep", {"-pls": "fedrep.head_epochs"}),
    # serverscaffold.py: Delta y averaged uniformly (1/num_join_clients) x -slr, Delta c with
    # 1/num_clients (the paper's); mpifl weighs both by p (equal on equal-size clients)
    "scaffold": ("SCAFFOLD", {"-slr": "scaffold.lr"}),
    # clientdyn.py: (alpha/2) x the norm, not its square, of w - w_global (mpifl: the paper's square)
    "feddyn": ("FedDyn", {"-al": "feddyn.alpha"}),
    # PFLlib's head is the model's fc (PeerModel's last Linear): fedper.personal_layers=1, lg_fedavg.global_layers=1
    "fedper": ("FedPer", {}),
    "lg_fedavg": ("LG-FedAvg", {}),
    # serverbabu.py fine-tunes once, after its last round, each client's own last local
    # model (no send_models before it), not the global model (the paper's, mpifl's)
    "fedbabu": ("FedBABU", {"-fte": "fedbabu.ft_epochs"}),
    # clientbn.py:48 keeps a parameter local when its name holds "bn" (PeerModel names
    # BatchNorm modules so); its running statistics stay local in every PFLlib method
    # (set_parameters copies parameters only), as in mpifl's. Compare with model.batchnorm=true
    "fedbn": ("FedBN", {}),
    # clientmoon.py: the representation is model.base(x), the input of fc, as mpifl's
    "moon": ("MOON", {"-mu": "moon.mu", "-tau": "moon.tau"}),
    # clientpFedMe.py trains only the selected clients (pfedme.all_train=false; the same at
    # -jr 1); its pFedMeOptimizer (fedoptimizer.py:34, :45) adds mu theta, mu = 0.001, to the
    # inner gradient; its "personalized" evaluation reads the model's parameters, which
    # set_parameters made w^t (clientpFedMe.py:56 aliases them): it reports the global model
    "pfedme": ("pFedMe", {"-lam": "pfedme.lam", "-K": "pfedme.K", "-lrp": "pfedme.personal_lr",
                          "-bt": "pfedme.beta"}),
    # clientamp.py:42: (lam/alpha)/2 x the norm, not its square, of w - u (mpifl: the paper's
    # square); serveramp.py:84-91 weighs the previous round's uploads (the same set at -jr 1)
    "fedamp": ("FedAMP", {"-alk": "fedamp.alpha", "-lam": "fedamp.lam", "-sg": "fedamp.sigma"}),
    # PFLlib's -p (layer_idx) counts parameter tensors, mpifl's fedala.layers modules: a Linear
    # is two (weight, bias). Its threshold 0.1 and num_pre_loss 10 are fixed (ALA's defaults,
    # clientala.py:17 passes neither), mpifl's defaults. serverala.py:73 runs ALA on every
    # client every round (the paper: the sampled; the same at -jr 1), and serverala.py:26-31
    # evaluates after it: the ALA-initialised models from Theta^R (mpifl: each client's trained model)
    "fedala": ("FedALA", {"-et": "fedala.eta", "-s": "fedala.rand_percent",
                          "-p": lambda flat: 2 * int(flat["fedala.layers"])}),
}


def _peer_model_class():
    from collections import OrderedDict

    from torch import nn

    class PeerModel(nn.Module):
        """mpifl's model with its last Linear as ``fc`` (PFLlib splits heads there) and
        each BatchNorm module named ``bn<i>`` (PFLlib's FedBN finds them by name)."""

        def __init__(self, seq: nn.Sequential):
            super().__init__()
            body = list(seq)[:-1]
            self.base = nn.Sequential(OrderedDict(
                (f"bn{i}" if isinstance(m, nn.modules.batchnorm._BatchNorm) else str(i), m)
                for i, m in enumerate(body)))
            self.fc = list(seq)[-1]

        def forward(self, x):
            return self.fc(self.base(x))

    PeerModel.__module__ = __name__
    PeerModel.__qualname__ = "PeerModel"
    return PeerModel


def __getattr__(name: str):
    if name == "PeerModel":  # built on demand: torch is only needed in the child
        cls = _peer_model_class()
        globals()["PeerModel"] = cls
        return cls
    raise AttributeError(name)


def mpifl_config(method: str, seed: int, overrides: list[str]):
    from mpifl import config

    pairs = {**DEFAULTS, "algorithm.name": method, "run.seed": seed}
    for o in overrides:
        k, _, v = o.partition("=")
        pairs[k] = v
    return config.load(None, [f"{k}={v}" for k, v in pairs.items()])


def pfllib_args(method: str, cfg, name: str) -> list[str]:
    algo, extra = METHODS[method]
    args = ["-data", name, "-m", "DNN", "-algo", algo, "-dev", "cpu", "-ncl", "0", "-eg", "1", "-t", "1",
            "-go", "peer"]
    flat = {f"{s}.{k}": v for s, sec in cfg.to_dict().items() for k, v in sec.items()}
    for flag, key in {**BASE, **extra}.items():
        value = key(flat) if callable(key) else flat[key] if isinstance(key, str) and key in flat else key
        args += [flag, str(value)]
    return args


def write_clients(cfg, root: Path, name: str) -> int:
    """PFLlib's client files from mpifl's partition; returns the number of classes."""
    from mpifl.data import build

    data = build(cfg.data, cfg.run.seed, np.arange(cfg.data.n_clients))
    for split, s in (("train", 0), ("test", 2)):
        d = root / "dataset" / name / split
        d.mkdir(parents=True, exist_ok=True)
        for k in range(cfg.data.n_clients):
            lo, n = int(data.offsets[k, s]), int(data.sizes[k, s])
            item = {"x": data.x[lo:lo + n], "y": data.y[lo:lo + n]}
            with open(d / f"{k}.npz", "wb") as f:
                np.savez_compressed(f, data=item)
    return data.n_classes


def run_pfllib(pfllib: Path, method: str, cfg, work: Path, keep_last: bool = False, threads: int = 1) -> dict:
    name = f"mpifl-{cfg.data.name}"
    shutil.copytree(pfllib / "system", work / "system")
    if keep_last:  # a diagnosis: PFLlib's training loader drops each epoch's short last batch
        base = work / "system" / "flcore" / "clients" / "clientbase.py"
        text = base.read_text()
        assert text.count("drop_last=True") == 1, "PFLlib's clientbase.py changed: update --pfllib-keep-last"
        base.write_text(text.replace("drop_last=True", "drop_last=False"))
    n_classes = write_clients(cfg, work, name)
    compileall.compile_dir(str(work / "system"), quiet=1)  # as mpifl's (run_mpifl): bytecode ready
    args = pfllib_args(method, cfg, name)
    args[args.index("-ncl") + 1] = str(n_classes)
    out = work / "stats.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(work / "system"), str(out),
           json.dumps(cfg.to_dict()), "--", *args]
    t0 = time.perf_counter()
    path = os.pathsep.join([str(REPO), str(REPO / "bench"), str(work / "system")])
    p = subprocess.run(cmd, cwd=work / "system", capture_output=True, text=True, check=False,
                       env={**os.environ, "PYTHONPATH": path, "PEER_THREADS": str(threads)})
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"PFLlib failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    stats = json.loads(out.read_text())
    # its servers print each round's time (training, aggregation and the evaluation
    # that opens the round); PFLlib's own summary averages rounds 1.., as here
    budget = [float(line.rsplit(None, 1)[-1]) for line in p.stdout.splitlines()
              if line.startswith("-") and "time cost" in line]
    return {**stats, "wall_s": wall, "round_s": float(np.mean(budget[1:])) if len(budget) > 1 else float("nan")}


def child(system: str, out: str, cfg_json: str, argv: list[str]) -> None:
    """Inside PFLlib's process: its DNN becomes mpifl's model, its per-client test
    statistics are recorded, then its main.py runs as it would from the shell."""
    import runpy

    import torch

    from mpifl import config, models

    os.chdir(system)
    sys.path.insert(0, system)
    cfg = config.from_dict(json.loads(cfg_json))
    from mpifl.data import build

    data = build(cfg.data, cfg.run.seed, np.arange(0))
    template = models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)

    # imported by its module name, so that PFLlib's torch.save of the model can
    # pickle the class (this file runs as __main__, which runpy replaces)
    import flcore.trainmodel.models as pm
    from flcore.servers import serverbase
    from peer_pfllib import PeerModel

    pm.DNN = lambda *a, **k: PeerModel(__import__("copy").deepcopy(template))
    last: dict = {}

    def record(fn):
        def wrapped(self, *a, **k):
            stats = fn(self, *a, **k)
            if isinstance(stats, (list, tuple)) and len(stats) >= 3 and isinstance(stats[1], list):
                last["n"], last["correct"] = list(map(float, stats[1])), list(map(float, stats[2]))
            return stats
        return wrapped

    def wrap_all():
        for mod in list(sys.modules.values()):
            if not getattr(mod, "__name__", "").startswith("flcore.servers."):
                continue
            for cls in vars(mod).values():
                if isinstance(cls, type) and issubclass(cls, serverbase.Server):
                    for attr, fn in list(vars(cls).items()):
                        if attr.startswith("test_metrics") and callable(fn) and not hasattr(fn, "_peer"):
                            w = record(fn)
                            w._peer = True
                            setattr(cls, attr, w)

    import importlib

    for f in sorted(Path(system, "flcore", "servers").glob("server*.py")):
        try:
            importlib.import_module(f"flcore.servers.{f.stem}")
        except Exception:  # noqa: BLE001 - a server whose extra dependency is missing is not ours
            pass
    wrap_all()
    _stand_ins()
    torch.set_num_threads(max(1, int(os.environ.get("PEER_THREADS", "1"))))
    sys.argv = ["main.py", *argv]
    runpy.run_path("main.py", run_name="__main__")
    n, correct = np.array(last["n"]), np.array(last["correct"])
    Path(out).write_text(json.dumps({"acc_mean": float(np.mean(correct / np.maximum(n, 1))),
                                     "acc_weighted": float(correct.sum() / n.sum())}))


def _stand_ins() -> None:
    """Empty modules for PFLlib's imports that no compared method uses, where they are
    not installed: main.py imports every server (FedPAC's needs cvxpy) and its memory
    reporter (calmsize, a size formatter)."""
    import importlib
    import types

    for name in ("cvxpy", "calmsize"):
        try:
            importlib.import_module(name)
        except ImportError:
            mod = types.ModuleType(name)
            mod.size = float  # calmsize.size: formats a memory report with "{:.2f}"
            sys.modules[name] = mod


def run_mpifl(method: str, cfg, overrides: list[str], work: Path, ranks: int, threads: int = 1) -> dict:
    from mpifl.logging.h5 import open_run

    args = [f"{k}={v}" for k, v in {**DEFAULTS, "algorithm.name": method, "run.seed": cfg.run.seed}.items()]
    args += [*overrides, f"run.out_dir={work}", "run.name=mpifl", f"run.threads={threads}", "run.checkpoint_every=0"]
    compileall.compile_dir(str(REPO / "mpifl"), quiet=1)  # a second run's state, as PFLlib's scratch copy
    cmd = [sys.executable, "-m", "mpifl.main", *args]
    if ranks > 1:
        cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(ranks), sys.executable, "-m", "mpi4py",
               "-m", "mpifl.main", *args]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"mpifl failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    run = open_run(work / "mpifl")
    acc, n_test = run.metric("test_acc")[-1], run.get("clients/n_test")
    import h5py

    with h5py.File(work / "mpifl" / "run.h5", "r") as f:  # per round: training, exchange and evaluation
        round_s = np.asarray(f["rounds/wall_s"])
        path = str(f.attrs.get("train_path", "?"))
    return {"acc_mean": float(np.nanmean(acc)), "acc_weighted": float(np.nansum(acc * n_test) / n_test.sum()),
            "wall_s": wall, "round_s": float(np.mean(round_s[1:])) if len(round_s) > 1 else float(round_s[0]),
            "train_path": path}


def paired_interval(gaps: list[float]) -> tuple[float, float, float]:
    """(low, mean, high): the mean of per-seed gaps with its two-sided 95% Student t
    interval (nan bounds for one seed)."""
    from scipy import stats

    d = np.asarray(gaps, dtype=float)
    if len(d) < 2:
        return float("nan"), float(d.mean()), float("nan")
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return float(d.mean() - half), float(d.mean()), float(d.mean() + half)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        system, out, cfg_json, _, *rest = argv[1:]
        child(system, out, cfg_json, rest)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pfllib", type=Path, help="a PFLlib checkout (its system/ folder is used)")
    ap.add_argument("--method", required=True, choices=sorted(METHODS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ranks", type=int, default=1, help="mpifl's MPI ranks")
    ap.add_argument("--threads", type=int, default=1, help="mpifl's torch threads per rank")
    ap.add_argument("--pfllib-threads", type=int, default=1, help="PFLlib's torch threads (one process)")
    ap.add_argument("--only", choices=["mpifl", "pfllib"], help="run one side only")
    ap.add_argument("--pfllib-keep-last", action="store_true",
                    help="diagnosis: PFLlib trains on each epoch's short last batch too, as mpifl "
                         "(its scratch copy's training DataLoader gets drop_last=False)")
    ap.add_argument("overrides", nargs="*", help="mpifl section.key=value (both sides get the mapped ones)")
    a = ap.parse_args(argv)
    if a.only != "mpifl" and (a.pfllib is None or not (a.pfllib / "system" / "main.py").is_file()):
        ap.error("--pfllib must name a PFLlib checkout (with system/main.py)")
    rows = []
    from mpifl.data import datasets

    datasets.load(mpifl_config(a.method, a.seeds[0], a.overrides).data, a.seeds[0])  # untimed: the dataset cache
    for seed in a.seeds:
        cfg = mpifl_config(a.method, seed, a.overrides)
        row = {"seed": seed}
        with tempfile.TemporaryDirectory(prefix="mpifl-peer-") as tmp:
            if a.only != "pfllib":
                row["mpifl"] = run_mpifl(a.method, cfg, a.overrides, Path(tmp) / "m", a.ranks, a.threads)
            if a.only != "mpifl":
                row["pfllib"] = run_pfllib(a.pfllib.resolve(), a.method, cfg, Path(tmp) / "p", a.pfllib_keep_last,
                                           a.pfllib_threads)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{a.method}: final test accuracy after {cfg.run.rounds} rounds (mean over clients / "
          f"sum(correct)/sum(samples)); mean s per round (rounds 1..) and whole-process wall s; mpifl "
          f"{a.ranks} rank(s) x {a.threads} thread(s), PFLlib 1 process x {a.pfllib_threads} thread(s)")
    for side in ("mpifl", "pfllib"):
        got = [r[side] for r in rows if side in r]
        if got:
            m = np.array([g["acc_mean"] for g in got])
            w = np.array([g["acc_weighted"] for g in got])
            t = np.array([g["wall_s"] for g in got])
            rs = np.array([g["round_s"] for g in got])
            extra = f"  train_path {got[0]['train_path']}" if "train_path" in got[0] else ""
            print(f"  {side:7s} " + "  ".join(f"{x:.4f}/{y:.4f}" for x, y in zip(m, w))
                  + f"   mean {m.mean():.4f}/{w.mean():.4f}   round {rs.mean():.3f}s   wall {t.mean():.1f}s{extra}")
    if all("mpifl" in r and "pfllib" in r for r in rows):
        gap = np.mean([r["mpifl"]["acc_weighted"] - r["pfllib"]["acc_weighted"] for r in rows])
        speed = np.mean([r["pfllib"]["round_s"] / r["mpifl"]["round_s"] for r in rows])
        whole = np.mean([r["pfllib"]["wall_s"] / r["mpifl"]["wall_s"] for r in rows])
        print(f"  gap (mpifl - PFLlib, weighted): {100 * gap:+.2f} pp; mpifl faster per round x{speed:.2f}, "
              f"whole process x{whole:.2f}")
        for key in ("acc_mean", "acc_weighted"):
            lo, mid, hi = paired_interval([r["mpifl"][key] - r["pfllib"][key] for r in rows])
            print(f"  paired by seed, {key}: {100 * mid:+.2f} pp, 95% interval [{100 * lo:+.2f}, {100 * hi:+.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
