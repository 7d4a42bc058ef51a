"""Time of one Adam step of stacked client rows: the row optimizer's update
(``mpifl.train.optimizer``: torch's fused kernel, one tensor per row and block)
against the nine elementwise kernels it replaced, written out here.

    python bench/adam_step.py                      # 5 rows of the FedC2I table's MLP
    python bench/adam_step.py --rows 45 --hidden 128 128 --inputs 40 --classes 4

Both sides get the same gradients; the script prints the median time of a step over
--steps steps (after a warm-up) for each, and how far apart the rows end up (the two
round differently, so they differ in the last bits).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mpifl import config
from mpifl.train.optimizer import RowOptimizer


def shapes(inputs: int, hidden: list[int], classes: int) -> list[tuple[int, ...]]:
    dims = [inputs, *hidden, classes]
    out: list[tuple[int, ...]] = []
    for a, b in zip(dims[:-1], dims[1:]):
        out += [(b, a), (b,)]
    return out


def nine_kernels(p, m, v, t, blocks, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """The update before: per block, torch.optim's unfused kernels with per-row bias corrections."""
    t.add_(1)
    c1, c2 = 1 - b1 ** t, 1 - b2 ** t
    n = p.shape[0]
    for cols, gb in blocks:
        pb, mb, vb = p[:, cols].view(gb.shape), m[:, cols].view(gb.shape), v[:, cols].view(gb.shape)
        mb.mul_(b1).add_(gb, alpha=1 - b1)
        vb.mul_(b2).addcmul_(gb, gb, value=1 - b2)
        ones = (1,) * (gb.dim() - 1)
        pb.addcdiv_(mb / c1.view(n, *ones), (vb / c2.view(n, *ones)).sqrt_().add_(eps), value=-lr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=5)
    ap.add_argument("--inputs", type=int, default=784)
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 128])
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sh = shapes(a.inputs, a.hidden, a.classes)
    cols, o = [], 0
    for s in sh:
        k = torch.Size(s).numel()
        cols.append(slice(o, o + k))
        o += k
    P, n = o, a.rows
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(n, P, generator=gen)
    grads = [[torch.randn(n, *s, generator=gen) for s in sh] for _ in range(4)]
    cfg = config.load(None, ["train.optimizer=adam", "train.lr=1e-3"]).train

    def run(side: str) -> tuple[float, torch.Tensor]:
        p = init.clone()
        opt = RowOptimizer(cfg, n, P, torch.device("cpu"), cols)
        m, v, t = (torch.zeros(n, P), torch.zeros(n, P), torch.zeros(n, 1))
        times = []
        for s in range(a.steps + 20):
            g = [x.clone() for x in grads[s % len(grads)]]
            t0 = time.perf_counter()
            if side == "fused":
                opt.step_(slice(None), p, g)
            else:
                nine_kernels(p, m, v, t, list(zip(cols, g)))
            if s >= 20:
                times.append(time.perf_counter() - t0)
        return statistics.median(times), p

    print(f"{n} rows x {P} parameters, {a.threads} thread(s), median of {a.steps} steps")
    for _ in range(2):  # alternated, twice
        tf, pf = run("fused")
        tn, pn = run("nine")
        print(f"  fused (mpifl) {tf * 1e3:.3f} ms   nine kernels {tn * 1e3:.3f} ms   "
              f"ratio {tn / tf:.2f}x   max |difference| of the rows {float((pf - pn).abs().max()):.2e}")


if __name__ == "__main__":
    main()
