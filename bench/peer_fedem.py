"""Side by side with FedEM's authors' code (github omarfoq/FedEM, read from a
local checkout): the same splits, model, initial components and
hyper-parameters in mpifl's ``fedem`` and in the authors' ``FedEM``.

    python bench/peer_fedem.py --fedem /path/to/FedEM --seeds 0 1 2
    python bench/peer_fedem.py --fedem /path/to/FedEM --seeds 0 fedem.components=2 --rounds 20

For each seed mpifl builds its partition (the common ground of
``bench/peer_pfllib.py``: digits, Dirichlet 0.1, 20 clients, MLP [128, 128], SGD
lr 0.05 without momentum, batch 10, 1 local epoch, every client every round) and
this script writes the authors' client files from it
(``data/synthetic/all_data/train/task_<i>/{train,test}.pkl``, lists of (x, y):
their "tabular" loader) in a scratch copy of the checkout, which is never
written to. Client i's training split is its train file and its test split its
test file (the authors' E-step runs on the training data, as mpifl's does).

Inside the authors' process (``--child``) their own pieces run unchanged:
``init_clients``, ``get_learners_ensemble``, ``get_aggregator('centralized')``,
``aggregator.mix()`` per round and ``LearnersEnsemble.evaluate_iterator`` on each
client's test data at the end. Three things are set to match mpifl's config:
every learner's model becomes mpifl's MLP with mpifl's initial weights of that
component (component 0: the run's init; m >= 1: ``fedem.component_seed``),
its optimizer plain SGD with mpifl's lr (their ``sgd`` adds momentum 0.9 and
weight decay 5e-4), and two modules their code imports for logging only and
that are not installed here (``tensorboard``'s SummaryWriter, ``tqdm``) are
replaced by no-op stand-ins.

Reported per side and seed: final test accuracy after ``--rounds`` rounds, as
the mean over clients and as sum(correct) / sum(samples), and the wall time.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from peer_pfllib import mpifl_config, run_mpifl  # noqa: E402

FEDEM_DEFAULTS = {"fedem.components": 4}


def write_clients(cfg, root: Path) -> tuple[int, int]:
    """The authors' tabular client files from mpifl's partition; returns
    (input dimension, classes)."""
    from mpifl.data import build

    data = build(cfg.data, cfg.run.seed, np.arange(cfg.data.n_clients))
    base = root / "data" / "synthetic" / "all_data" / "train"
    for k in range(cfg.data.n_clients):
        d = base / f"task_{k}"
        d.mkdir(parents=True, exist_ok=True)
        for split, s in (("train", 0), ("test", 2)):
            lo, n = int(data.offsets[k, s]), int(data.sizes[k, s])
            items = [(data.x[j].reshape(-1).astype(np.float32), int(data.y[j])) for j in range(lo, lo + n)]
            with open(d / f"{split}.pkl", "wb") as f:
                pickle.dump(items, f)
    return int(np.prod(data.in_shape)), data.n_classes


def _module(name: str) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)  # torch's import scan asks for one
    return m


def _stub_logging_modules() -> None:
    """SummaryWriter and tqdm are used for logs and progress bars only."""
    tb = _module("torch.utils.tensorboard")

    class SummaryWriter:
        def __init__(self, *a, **k):
            pass

        def add_scalar(self, *a, **k):
            pass

        def flush(self):
            pass

        def close(self):
            pass

    tb.SummaryWriter = SummaryWriter
    sys.modules["torch.utils.tensorboard"] = tb
    tq = _module("tqdm")

    class _Bar:
        def __init__(self, it=None, *a, **k):
            self.it = it

        def __iter__(self):
            return iter(self.it)

        def update(self, *a):
            pass

        def close(self):
            pass

    tq.tqdm = _Bar
    sys.modules["tqdm"] = tq
    for name in ("tensorboard", "tensorboard.backend", "tensorboard.backend.event_processing",
                 "tensorboard.backend.event_processing.event_accumulator"):
        m = _module(name)
        m.EventAccumulator = None
        sys.modules.setdefault(name, m)


def child(fedem_dir: str, out: str, cfg_json: str, argv: list[str]) -> None:
    import copy

    import torch

    from mpifl import config, models
    from mpifl.algorithms.fedem import component_seed
    from mpifl.data import build

    os.chdir(fedem_dir)
    sys.path.insert(0, fedem_dir)
    _stub_logging_modules()
    cfg = config.from_dict(json.loads(cfg_json))
    data = build(cfg.data, cfg.run.seed, np.arange(0))
    M = cfg.fedem.components
    templates = [models.build(cfg.model, data.in_shape, data.n_classes,
                              cfg.run.seed if m == 0 else component_seed(cfg.run.seed, m)) for m in range(M)]
    torch.set_num_threads(1)

    sys.argv = ["run_experiment.py", *argv]
    import run_experiment as rx
    from utils.args import parse_args
    from utils.utils import get_aggregator, get_learners_ensemble

    args = parse_args()
    torch.manual_seed(args.seed)
    logs = Path(tempfile.mkdtemp(prefix="fedem-logs-"))
    clients = rx.init_clients(args, root_path=os.path.join("data", "synthetic", "all_data", "train"),
                              logs_dir=str(logs / "train"))
    ensemble = get_learners_ensemble(n_learners=M, name="synthetic", device="cpu", optimizer_name="sgd",
                                     scheduler_name="constant", initial_lr=args.lr, input_dim=args.input_dimension,
                                     output_dim=args.output_dimension, n_rounds=args.n_rounds, seed=args.seed, mu=0.0)

    def adopt(ens) -> None:
        """mpifl's model and initial weights for learner m; plain SGD at mpifl's lr."""
        for m, learner in enumerate(ens.learners):
            learner.model = copy.deepcopy(templates[m])
            learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=cfg.train.lr, momentum=0.0,
                                                weight_decay=0.0)
            learner.lr_scheduler = None
            learner.model_dim = sum(p.numel() for p in learner.model.parameters())
        ens.model_dim = ens.learners[0].model_dim  # the size of the updates fit_epochs returns

    adopt(ensemble)
    for c in clients:
        adopt(c.learners_ensemble)
    rx_logger = sys.modules["torch.utils.tensorboard"].SummaryWriter()
    aggregator = get_aggregator(aggregator_type="centralized", clients=clients, global_learners_ensemble=ensemble,
                                lr_lambda=args.lr_lambda, lr=args.lr, q=args.q, mu=args.mu,
                                communication_probability=args.communication_probability,
                                sampling_rate=args.sampling_rate, log_freq=args.log_freq,
                                global_train_logger=rx_logger, global_test_logger=rx_logger, test_clients=[],
                                verbose=0, seed=args.seed)
    for _ in range(args.n_rounds):
        aggregator.mix()
    n, correct, pis = [], [], []
    for c in clients:
        _, acc = c.learners_ensemble.evaluate_iterator(c.test_iterator)
        n.append(c.n_test_samples)
        correct.append(acc * c.n_test_samples)
        pis.append(c.learners_ensemble.learners_weights.tolist())
    n, correct = np.array(n, float), np.array(correct)
    Path(out).write_text(json.dumps({"acc_mean": float(np.mean(correct / np.maximum(n, 1))),
                                     "acc_weighted": float(correct.sum() / n.sum()), "pi": pis}))


def run_fedem(fedem: Path, cfg, work: Path) -> dict:
    work.mkdir(parents=True)
    for item in fedem.iterdir():  # the code, not the data folders of other experiments
        if item.suffix == ".py":
            shutil.copy(item, work / item.name)
        elif item.is_dir() and item.name in ("learners", "utils"):
            shutil.copytree(item, work / item.name)
    in_dim, n_classes = write_clients(cfg, work)
    argv = ["synthetic", "FedEM", "--n_learners", str(cfg.fedem.components), "--n_rounds", str(cfg.run.rounds),
            "--bz", str(cfg.train.batch_size), "--lr", str(cfg.train.lr), "--local_steps",
            str(cfg.train.local_epochs), "--sampling_rate", str(cfg.algorithm.fraction), "--log_freq",
            str(cfg.run.rounds + 1), "--device", "cpu", "--optimizer", "sgd", "--seed", str(cfg.run.seed),
            "--input_dimension", str(in_dim), "--output_dimension", str(n_classes)]
    out = work / "stats.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(work), str(out),
           json.dumps(cfg.to_dict()), "--", *argv]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "bench"), str(work)])})
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"FedEM failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return {**json.loads(out.read_text()), "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        fedem_dir, out, cfg_json, _, *rest = argv[1:]
        child(fedem_dir, out, cfg_json, rest)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fedem", type=Path, help="a checkout of github omarfoq/FedEM")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--only", choices=["mpifl", "fedem"], help="run one side only")
    ap.add_argument("overrides", nargs="*", help="mpifl section.key=value (both sides get the mapped ones)")
    a = ap.parse_args(argv)
    if a.only != "mpifl" and (a.fedem is None or not (a.fedem / "run_experiment.py").is_file()):
        ap.error("--fedem must name a FedEM checkout (with run_experiment.py)")
    overrides = [*(f"{k}={v}" for k, v in FEDEM_DEFAULTS.items()), f"run.rounds={a.rounds}", *a.overrides]
    rows = []
    for seed in a.seeds:
        cfg = mpifl_config("fedem", seed, overrides)
        row = {"seed": seed}
        with tempfile.TemporaryDirectory(prefix="mpifl-peer-fedem-") as tmp:
            if a.only != "fedem":
                row["mpifl"] = run_mpifl("fedem", cfg, overrides, Path(tmp) / "m", 1)
            if a.only != "mpifl":
                row["fedem"] = run_fedem(a.fedem.resolve(), cfg, Path(tmp) / "f")
        rows.append(row)
        print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "pi"} if isinstance(v, dict) else v)
                          for k, v in row.items()}), flush=True)
    print(f"\nfedem: final test accuracy after {a.rounds} rounds (mean over clients / "
          f"sum(correct)/sum(samples)), wall s")
    for side in ("mpifl", "fedem"):
        got = [r[side] for r in rows if side in r]
        if got:
            m = np.array([g["acc_mean"] for g in got])
            w = np.array([g["acc_weighted"] for g in got])
            t = np.array([g["wall_s"] for g in got])
            print(f"  {side:7s} " + "  ".join(f"{x:.4f}/{y:.4f}" for x, y in zip(m, w))
                  + f"   mean {m.mean():.4f}/{w.mean():.4f}   wall {t.mean():.1f}s")
    if all("mpifl" in r and "fedem" in r for r in rows):
        gap = np.mean([r["mpifl"]["acc_weighted"] - r["fedem"]["acc_weighted"] for r in rows])
        print(f"  gap (mpifl - FedEM, weighted): {100 * gap:+.2f} pp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
