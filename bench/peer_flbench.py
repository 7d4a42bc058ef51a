"""Side by side with FL-bench (KarhouTam/FL-bench, the framework pFedLIA ran its
baselines in): Local-only and FedAvg on mpifl's own Fashion-MNIST partition of a
pFedLIA Table I setting, read from a local FL-bench checkout.

    python bench/peer_flbench.py --flbench /path/to/FL-bench --flbench-python /path/to/venv/bin/python \\
        --job jobs/pfedlia-fashionmnist-patho.yaml --methods local fedavg --seeds 0 1
    python bench/peer_flbench.py ... --only flbench run.rounds=20     # one side, a shorter setting

For each seed mpifl builds the job's partition (``mpifl.data.build``: every
client's train/val/test indices into Fashion-MNIST's 70,000 images, training set
first, as FL-bench's ``FashionMNIST`` concatenates them), and this script writes
it in FL-bench's dataset format into a scratch copy of the checkout (the
checkout itself is never written to): ``data/fmnist/partition.pkl``
(``{"separation": {"train", "val", "test": every client, "total": N},
"data_indices": [{"train", "val", "test"} per client]}``, FL-bench's
``split: sample``), ``data/fmnist/args.json`` and the four IDX files under
``data/fmnist/FashionMNIST/raw/`` (from Debian's dataset-fashion-mnist, so
torchvision downloads nothing). FL-bench's ``main.py`` then runs in its own
Python (``--flbench-python``: a venv with FL-bench's dependencies; FL-bench's
pixel scaling and normalisation are its own) with

- its ``local`` (Local-only) or ``fedavg`` server, serial mode, on the CPU;
- the job's model, mpifl's MLP, with mpifl's initial weights of the same seed
  (registered in FL-bench's ``MODELS`` as ``mpifl_mlp``: ``base`` = the hidden
  layers, ``classifier`` = the last ``Linear``);
- the job's hyper-parameters: ``common.join_ratio`` = ``algorithm.fraction``,
  ``common.global_epoch`` = ``run.rounds``, ``common.local_epoch`` =
  ``train.local_epochs``, ``common.batch_size`` = ``train.batch_size``,
  ``optimizer`` SGD with ``train.lr``, ``train.momentum``,
  ``train.weight_decay``; its seed = mpifl's;
- every client's own model tested on its test split after the last round
  (``common.test.client.interval`` = rounds).

mpifl runs ``python -m mpifl.main JOB`` with the same seed and overrides (its
``local`` trains every client every round unless ``local.sampled_only=true``).
Reported per side, method and seed: final test accuracy as the mean over
clients of each client's accuracy (mpifl's tables) and pooled,
``sum(correct) / sum(samples)`` (FL-bench's own figure), and the process's
wall time. FL-bench is never imported by mpifl: it runs only here.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FLBENCH_METHODS = {"local": "local", "fedavg": "fedavg"}
IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def mpifl_config(job: Path, method: str, seed: int, overrides: list[str]):
    from mpifl import config

    return config.load(str(job), [f"algorithm.name={method}", f"run.seed={seed}", *overrides])


def write_dataset(cfg, root: Path) -> None:
    """mpifl's partition of Fashion-MNIST in FL-bench's format under ``root``
    (``data/fmnist`` of a scratch copy), and mpifl's initial weights."""
    from mpifl import models
    from mpifl.data import datasets, federate

    if cfg.data.name != "fashionmnist" or cfg.data.subsample != 1.0 or cfg.data.per_class:
        raise SystemExit("peer_flbench: the job must use the whole of Fashion-MNIST (data.name=fashionmnist, "
                         "no subsample or per_class): FL-bench indexes its 70,000 images")
    pool = datasets.load(cfg.data, cfg.run.seed)
    part, splits = federate(pool, cfg.data, cfg.run.seed)
    if part.x_fn is not None or part.y_fn is not None:
        raise SystemExit("peer_flbench: partitions that transform inputs or labels have no FL-bench counterpart")
    d = root / "data" / "fmnist"
    raw = d / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    src = datasets.DEBIAN_FASHION_MNIST
    for name in IDX:
        with gzip.open(src / f"{name}.gz", "rb") as f_in, open(raw / name, "wb") as f_out:
            shutil.copyfileobj(f_in, f_out)
    y = np.concatenate([_idx_labels(raw / IDX[1]), _idx_labels(raw / IDX[3])])
    if len(y) != len(pool.y) or not np.array_equal(y, pool.y):
        raise SystemExit("peer_flbench: mpifl's Fashion-MNIST pool is not in the IDX files' order")
    n = cfg.data.n_clients
    indices = [{k: np.asarray(s, np.int64) for k, s in zip(("train", "val", "test"), sp)} for sp in splits]
    everyone = list(range(n))
    with open(d / "partition.pkl", "wb") as f:
        pickle.dump({"separation": {"train": everyone, "val": everyone, "test": everyone, "total": n},
                     "data_indices": indices}, f)
    (d / "args.json").write_text(json.dumps({
        "client_num": n, "test_ratio": cfg.data.test_frac, "val_ratio": cfg.data.val_frac, "seed": cfg.run.seed,
        "split": "sample", "IID_ratio": 0.0, "monitor_window_name_suffix": f"fmnist-{n}clients-mpifl"}))
    pool_shape = pool.shape
    model = models.build(cfg.model, pool_shape, pool.n_classes, cfg.run.seed)
    linear = [m for m in model.modules() if type(m).__name__ == "Linear"]
    np.savez(root / "mpifl_init.npz", **{f"w{i}": m.weight.detach().cpu().numpy() for i, m in enumerate(linear)},
             **{f"b{i}": m.bias.detach().cpu().numpy() for i, m in enumerate(linear)})


def _idx_labels(path: Path) -> np.ndarray:
    return np.frombuffer(path.read_bytes()[8:], np.uint8).astype(np.int64)


def flbench_overrides(method: str, cfg) -> list[str]:
    t = cfg.train
    if t.optimizer != "sgd":
        raise SystemExit(f"peer_flbench: train.optimizer={t.optimizer} is not mapped; use sgd")
    return [f"method={FLBENCH_METHODS[method]}", "dataset.name=fmnist", "model.name=mpifl_mlp",
            "model.use_torchvision_pretrained_weights=false", f"common.seed={cfg.run.seed}",
            f"common.join_ratio={cfg.algorithm.fraction}", f"common.global_epoch={cfg.run.rounds}",
            f"common.local_epoch={t.local_epochs}", f"common.batch_size={t.batch_size}", "optimizer.name=sgd",
            f"optimizer.lr={t.lr}", f"optimizer.momentum={t.momentum}", f"optimizer.weight_decay={t.weight_decay}",
            "common.use_cuda=false", "common.client_side_evaluation=false",
            f"common.test.client.interval={cfg.run.rounds}", "common.test.client.test=true",
            "common.save_log=false", "common.save_learning_curve_plot=false", "common.save_metrics=false",
            "common.monitor=null", "mode=serial"]


def run_flbench(flbench: Path, python: str, method: str, cfg, work: Path, threads: int = 1) -> dict:
    ignore = shutil.ignore_patterns(".git", ".github", "out", "__pycache__")
    shutil.copytree(flbench, work / "flbench", ignore=ignore)
    write_dataset(cfg, work / "flbench")
    out = work / "stats.json"
    cmd = [python, str(Path(__file__).resolve()), "--child", str(work / "flbench"), str(out), "--",
           *flbench_overrides(method, cfg)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=work / "flbench", capture_output=True, text=True, check=False,
                       env={**os.environ, "PYTHONPATH": str(work / "flbench"), "PEER_THREADS": str(threads),
                            "CUDA_VISIBLE_DEVICES": ""})
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"FL-bench failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return {**json.loads(out.read_text()), "wall_s": wall}


def child(root: str, out: str, argv: list[str]) -> None:
    """Inside FL-bench's Python: mpifl's MLP with mpifl's initial weights becomes
    FL-bench's model ``mpifl_mlp``; each client's final test is recorded; then
    FL-bench's main.py runs as it would from the shell."""
    import runpy

    import torch
    from torch import nn

    os.chdir(root)
    sys.path.insert(0, root)
    torch.set_num_threads(max(1, int(os.environ.get("PEER_THREADS", "1"))))
    init = np.load(Path(root) / "mpifl_init.npz")
    n_linear = len([k for k in init.files if k.startswith("w")])

    from src.client.fedavg import FedAvgClient
    from src.utils.models import MODELS, DecoupledModel

    class MpiflMLP(DecoupledModel):
        def __init__(self, dataset: str, pretrained: bool):
            super().__init__()
            layers: list[nn.Module] = [nn.Flatten()]
            for i in range(n_linear):
                w, b = torch.from_numpy(init[f"w{i}"]), torch.from_numpy(init[f"b{i}"])
                lin = nn.Linear(w.shape[1], w.shape[0])
                with torch.no_grad():
                    lin.weight.copy_(w)
                    lin.bias.copy_(b)
                layers += [lin] if i == n_linear - 1 else [lin, nn.ReLU()]
            self.base = nn.Sequential(*layers[:-1])
            self.classifier = layers[-1]

    MODELS["mpifl_mlp"] = MpiflMLP
    tested: dict[int, tuple[int, int]] = {}
    plain_test = FedAvgClient.test

    def test(self, package):
        res = plain_test(self, package)
        m = res["before"]["test"]
        tested[int(self.client_id)] = (int(m.corrects), int(m.size))
        return res

    FedAvgClient.test = test
    sys.argv = ["main.py", *argv]
    runpy.run_path("main.py", run_name="__main__")
    correct = np.array([c for c, _ in tested.values()], float)
    size = np.array([s for _, s in tested.values()], float)
    Path(out).write_text(json.dumps({"acc_mean": float(np.mean(correct / np.maximum(size, 1))),
                                     "acc_pooled": float(correct.sum() / size.sum()), "clients": len(tested)}))


def run_mpifl(job: Path, method: str, seed: int, overrides: list[str], work: Path, threads: int = 1) -> dict:
    from mpifl.logging.h5 import open_run

    args = [str(job), f"algorithm.name={method}", f"run.seed={seed}", *overrides, f"run.out_dir={work}",
            "run.name=mpifl", f"run.threads={threads}", "run.checkpoint_every=0"]
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "mpifl.main", *args], cwd=REPO, capture_output=True, text=True,
                       check=False, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"mpifl failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    run = open_run(work / "mpifl")
    acc, n_test = run.metric("test_acc")[-1], run.get("clients/n_test")
    return {"acc_mean": float(np.nanmean(acc)), "acc_pooled": float(np.nansum(acc * n_test) / n_test.sum()),
            "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        root, out, _, *rest = argv[1:]
        child(root, out, rest)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flbench", type=Path, help="an FL-bench checkout (main.py, src/, config/)")
    ap.add_argument("--flbench-python", default=sys.executable,
                    help="the Python that has FL-bench's dependencies (torch, torchvision, hydra-core, ray, ...)")
    ap.add_argument("--job", type=Path, default=REPO / "jobs" / "pfedlia-fashionmnist-patho.yaml")
    ap.add_argument("--methods", nargs="+", choices=sorted(FLBENCH_METHODS), default=["local", "fedavg"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each side")
    ap.add_argument("--only", choices=["mpifl", "flbench"], help="run one side only")
    ap.add_argument("overrides", nargs="*", help="mpifl section.key=value (both sides get the mapped ones)")
    a = ap.parse_args(argv)
    if a.only != "mpifl" and (a.flbench is None or not (a.flbench / "main.py").is_file()):
        ap.error("--flbench must name an FL-bench checkout (with main.py)")
    rows = []
    for method in a.methods:
        for seed in a.seeds:
            cfg = mpifl_config(a.job, method, seed, a.overrides)
            row = {"method": method, "seed": seed}
            with tempfile.TemporaryDirectory(prefix="mpifl-peer-") as tmp:
                if a.only != "flbench":
                    row["mpifl"] = run_mpifl(a.job, method, seed, a.overrides, Path(tmp) / "m", a.threads)
                if a.only != "mpifl":
                    row["flbench"] = run_flbench(a.flbench.resolve(), a.flbench_python, method, cfg, Path(tmp) / "f",
                                                 a.threads)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{a.job.name} {' '.join(a.overrides)}: final test accuracy after {cfg.run.rounds} rounds, % "
          "(mean over clients / pooled), mean over seeds; whole-process wall s")
    for method in a.methods:
        for side in ("mpifl", "flbench"):
            got = [r[side] for r in rows if r["method"] == method and side in r]
            if got:
                m = 100 * np.array([g["acc_mean"] for g in got])
                w = 100 * np.array([g["acc_pooled"] for g in got])
                t = np.array([g["wall_s"] for g in got])
                sd = f" ± {m.std(ddof=1):.2f}" if len(m) > 1 else ""
                print(f"  {method:7s} {side:8s} " + "  ".join(f"{x:.2f}/{y:.2f}" for x, y in zip(m, w))
                      + f"   mean {m.mean():.2f}{sd} / {w.mean():.2f}   wall {t.mean():.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
