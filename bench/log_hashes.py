"""One short run per algorithm and training path, and a hash of every dataset of
its run.h5 but the wall-clock timings: two checkouts whose hashes agree wrote the
same logs, bit for bit. For a refactor that promises to change no bit.

    python bench/log_hashes.py OUT [NAME ...]          # from the checkout under test
    python bench/log_hashes.py --compare A/hashes.json B/hashes.json
    python bench/log_hashes.py OUT --without train/steps --without train/samples  # datasets
        # a later checkout adds, left out of the hash to compare with an earlier one's

The runs use the checkout the script sits in: copy it into an older checkout to run it there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TIMINGS = {"rounds/wall_s", "rounds/comm_s", "rounds/compute_s"}
Q = ["run.rounds=3", "data.n_clients=8", "run.eval_every=1"]
CONV = ["run.rounds=2", "data.name=fashionmnist", "data.subsample=0.01", "data.n_clients=6", "model.name=lenet"]
RUNS = {
    "fedavg": [*Q, "algorithm.name=fedavg", "algorithm.fraction=0.5"],
    "apfl": [*Q, "algorithm.name=apfl", "algorithm.fraction=0.5"],
    "apfl_skip": [*Q, "algorithm.name=apfl", "train.lr=1.5", "train.on_nonfinite=skip"],
    "apfl_loop": [*Q, "algorithm.name=apfl", "train.batched=off"],
    "fedrod": [*Q, "algorithm.name=fedrod", "train.optimizer=adam", "train.lr=0.005"],
    "perfedavg": [*Q, "algorithm.name=perfedavg", "perfedavg.variant=hf", "train.momentum=0.9"],
    "federico": [*Q, "algorithm.name=federico"],
    "fedc2i": [*Q, "algorithm.name=fedc2i"],
    "fedem": [*Q, "algorithm.name=fedem"],
    "fedproto": [*Q, "algorithm.name=fedproto"],
    "fedfomo": [*Q, "algorithm.name=fedfomo"],
    "ditto_loop": [*Q, "algorithm.name=ditto", "train.batched=off"],
    "fedrep": [*Q, "algorithm.name=fedrep"],
    "fedavgm": [*Q, "algorithm.name=fedavgm", "algorithm.fraction=0.5"],
    "fedadam": [*Q, "algorithm.name=fedadam"],
    "fedyogi": [*Q, "algorithm.name=fedyogi"],
    "fedprox_ft": [*Q, "algorithm.name=fedprox_ft"],
    "fesem": [*Q, "algorithm.name=fesem", "data.partition=clusters"],
    "cfl": [*Q, "algorithm.name=cfl"],
    "pfedgraph": [*Q, "algorithm.name=pfedgraph"],
    "dpfl": [*Q, "algorithm.name=dpfl"],
    "dpfl_budget": [*Q, "algorithm.name=dpfl", "dpfl.budget=3", "dpfl.tau_init=1", "dpfl.tau_train=1"],
    "pfedlia": [*Q, "algorithm.name=pfedlia", "pfedlia.warmup_rounds=1"],
    "oracle": [*Q, "algorithm.name=oracle"],
    "fedavg_conv": [*CONV, "train.batched=on", "algorithm.name=fedavg"],
    "fedprox_conv_loop": [*CONV, "train.batched=off", "algorithm.name=fedprox"],
    "fedrod_conv": [*CONV, "train.batched=on", "algorithm.name=fedrod"],
    "scaffold": [*Q, "algorithm.name=scaffold", "algorithm.fraction=0.5"],
    "feddyn": [*Q, "algorithm.name=feddyn"],
    "moon": [*Q, "algorithm.name=moon"],
    "fedper": [*Q, "algorithm.name=fedper"],
    "lg_fedavg": [*Q, "algorithm.name=lg_fedavg"],
    "fedbabu": [*Q, "algorithm.name=fedbabu"],
    "pfedme": [*Q, "algorithm.name=pfedme"],
    "fedamp": [*Q, "algorithm.name=fedamp"],
    "fedala": [*Q, "algorithm.name=fedala", "algorithm.fraction=0.5"],
    "fedala_bn": [*Q, "algorithm.name=fedala", "model.batchnorm=true", "train.batched=on"],
    "fedbn_bn_loop": [*Q, "algorithm.name=fedbn", "model.batchnorm=true", "train.batched=off"],
    "bn_vmap": ["run.rounds=1", "data.name=fashionmnist", "data.subsample=0.005", "data.n_clients=4",
                "model.name=resnet18", "train.batched=on", "algorithm.name=apfl"],
}


def log_hash(log: Path, without: tuple[str, ...] = ()) -> str:
    from mpifl.logging.h5 import open_run

    r = open_run(log)
    h = hashlib.sha256()
    for k in sorted(set(r.keys()) - TIMINGS - set(without)):
        a = np.ascontiguousarray(r.get(k))
        for part in (k.encode(), str(a.dtype).encode(), str(a.shape).encode(), a.tobytes()):
            h.update(part)
    return h.hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    ap.add_argument("--without", action="append", default=[], metavar="DATASET",
                    help="leave this dataset out of the hash (one an earlier checkout does not write)")
    a = ap.parse_args()
    if a.compare:
        x, y = (json.loads(p.read_text()) for p in a.compare)
        differ = [k for k in x if k in y and x[k] != y[k]]
        print(f"{len([k for k in x if k in y])} runs in both, {len(differ)} differ" + (f": {differ}" if differ else ""))
        return 1 if differ else 0
    res = {}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name, args in RUNS.items():
        if a.names and name not in a.names:
            continue
        t0 = time.time()
        cmd = [sys.executable, "-m", "mpifl.main", "jobs/quickstart.yaml", *args, f"run.out_dir={a.out}",
               f"run.name={name}", "run.threads=1", "run.resume=never"]
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, check=False)
        res[name] = log_hash(a.out / name / "run.h5", tuple(a.without)) if p.returncode == 0 else "FAILED"
        print(f"{name:20s} {res[name]}  {time.time() - t0:.0f}s", flush=True)
    (a.out / "hashes.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
