"""Lazy influence (LIA) vs exact influence of one batch: the pFedLIA paper's Fig. 3a.

    PYTHONPATH=. python bench/lia_vs_exact.py --thresholds 0.6 0.4 0.25 --threads 1

Setting (as the paper): a model M0 is trained on D0 (9900 samples); the batch B
holds 100 samples; a test set of 100 IID samples scores both influences.
- LIA: ``--lia-epochs`` epochs from M0 on B alone (minibatches of ``--batch``),
  then the loss difference on the test set. Timed: that training + evaluation.
- Exact: a new model M1 from the same initialisation trained on D0 ∪ B until its
  mean training loss over an epoch falls below a threshold, then the loss
  difference on the test set. Timed: the training of M1 + evaluation (M0's
  training is not counted, as in the paper).
Same model (mpifl's MLP), data (mnist1d), optimizer and batch size for both.
Prints one line per threshold and the speed-up; results go in bench/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from mpifl import models
from mpifl.config import DataConfig, ModelConfig
from mpifl.data import datasets


def train_epochs(model, x, y, epochs, batch, lr, gen) -> float:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    last = float("nan")
    for _ in range(epochs):
        last = one_epoch(model, opt, x, y, batch, gen)
    return last


def one_epoch(model, opt, x, y, batch, gen) -> float:
    model.train()
    perm = torch.randperm(len(x), generator=gen)
    total = 0.0
    for s in range(0, len(x), batch):
        idx = perm[s:s + batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item() * len(idx)
    return total / len(x)


@torch.no_grad()
def test_loss(model, x, y) -> float:
    model.eval()
    return F.cross_entropy(model(x), y, reduction="sum").item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.6, 0.4, 0.25],
                    help="training-loss thresholds at which M1 counts as converged")
    ap.add_argument("--lia-epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--m0-epochs", type=int, default=30, help="training of M0 on D0 (not timed)")
    ap.add_argument("--max-epochs", type=int, default=400, help="give up on a threshold after this many epochs")
    ap.add_argument("--repeats", type=int, default=5, help="LIA timings (median reported)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    pool = datasets.mnist1d(DataConfig(n_samples=10100))
    perm = np.random.default_rng(a.seed).permutation(len(pool.y))
    d0, b, te = perm[:9900], perm[9900:10000], perm[10000:10100]
    assert len(te) == 100, "mnist1d pool too small"
    x, y = torch.from_numpy(pool.x), torch.from_numpy(pool.y)
    build = lambda: models.build(ModelConfig(), pool.shape, pool.n_classes, a.seed)
    gen = torch.Generator().manual_seed(a.seed)

    m0 = build()
    train_epochs(m0, x[d0], y[d0], a.m0_epochs, a.batch, a.lr, gen)
    base = test_loss(m0, x[te], y[te])

    lia_times, lia_value = [], None
    for _ in range(a.repeats):
        m = build()
        m.load_state_dict(m0.state_dict())
        t0 = time.perf_counter()
        train_epochs(m, x[b], y[b], a.lia_epochs, a.batch, a.lr, gen)
        lia_value = base - test_loss(m, x[te], y[te])
        lia_times.append(time.perf_counter() - t0)
    lia = statistics.median(lia_times)
    print(f"LIA: {a.lia_epochs} epochs on |B|={len(b)}: {lia * 1e3:.1f} ms (median of {a.repeats}), "
          f"influence on test {lia_value:+.3f}", flush=True)

    d1 = np.concatenate([d0, b])
    m1 = build()  # from scratch, the same initialisation M0 started from
    opt = torch.optim.Adam(m1.parameters(), lr=a.lr)
    # one training run serves every threshold: retraining to a looser threshold
    # is the prefix of retraining to a tighter one; only training time accumulates
    train_s, epochs, loss = 0.0, 0, float("inf")
    for thr in sorted(a.thresholds, reverse=True):
        while loss > thr and epochs < a.max_epochs:
            t0 = time.perf_counter()
            loss = one_epoch(m1, opt, x[d1], y[d1], a.batch, gen)
            train_s += time.perf_counter() - t0
            epochs += 1
        if loss > thr:
            print(f"exact, threshold {thr}: not reached in {a.max_epochs} epochs (loss {loss:.3f})", flush=True)
            continue
        t0 = time.perf_counter()
        exact = base - test_loss(m1, x[te], y[te])
        seconds = train_s + time.perf_counter() - t0
        print(f"exact, train loss <= {thr}: {epochs} epochs on |D0 u B|={len(d1)}, {seconds:.2f} s, "
              f"influence on test {exact:+.3f}; speed-up {seconds / lia:.0f}x", flush=True)

if __name__ == "__main__":
    main()
