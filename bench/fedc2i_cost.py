"""Cost of FedC2I's class-level step against one local batch forward.

The class-level step is everything FedC2I adds for the class matrix on a rank:
one feature pass of the local batch, the N x C leave-one-out losses (one einsum
and a log-sum-exp), the softmax over j and the classifier aggregation. It is
timed against one forward pass of the same clients' models on the same batch.

    python bench/fedc2i_cost.py                       # N=20, C=10, batch 32, CPU, 1 thread
    python bench/fedc2i_cost.py --device cuda --threads 0

Two layouts: one client per rank (m=1) and all N clients on one rank (m=N,
vmapped). Models: the MLP used by the built-in benchmark (digits, 8x8) and a
LeNet (conv5-pool-conv5-pool-120-84-C on 1x28x28; ``models.lenet`` when the
models module has it, else the same layers defined here).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpifl import config, models
from mpifl.algorithms import fedc2i
from mpifl.data import FederatedData
from mpifl.train import Clients, stacked_forward
from mpifl.train.head import find_head


def lenet(n_classes: int) -> tuple[nn.Module, str]:
    try:
        return models.build(config.ModelConfig(name="lenet"), (1, 28, 28), n_classes, 0), "models.lenet"
    except (ValueError, KeyError, TypeError, AttributeError):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 4 * 4, 120), nn.ReLU(),
                            nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_classes))
        return net, "LeNet defined in this script"


def make_clients(model: nn.Module, in_shape: tuple[int, ...], m: int, bs: int, C: int,
                 device: torch.device) -> Clients:
    g = np.random.default_rng(0)
    n = m * bs
    x = g.normal(size=(n, *in_shape)).astype(np.float32)
    y = g.integers(0, C, n).astype(np.int64)
    sizes = np.tile([bs, 0, 0], (m, 1))
    offsets = np.stack([np.arange(m) * bs, np.arange(m) * bs + bs, np.arange(m) * bs + bs], 1)
    data = FederatedData(C, in_shape, np.zeros(m, np.int64), sizes, np.zeros((m, C)), x, y, offsets, np.arange(m))
    return Clients(model, data, config.TrainConfig(), device, seed=0)


def measure(name: str, model: nn.Module, in_shape, N: int, m: int, bs: int, C: int, device, min_time: float):
    c = make_clients(model, in_shape, m, bs, C, device)
    head = find_head(c, name, "fedc2i")
    gen = torch.Generator().manual_seed(1)
    rows = (c.init[None].cpu() + 0.05 * torch.randn(m, c.P, generator=gen)).to(device)
    v_all = head.rows((c.init[None].cpu() + 0.05 * torch.randn(N, c.P, generator=gen)).to(device))
    x, y, w = c.batch(np.arange(m * bs).reshape(m, bs))
    alpha = 5.0
    scratch = rows.clone()  # FedC2I writes the classifier into the freshly aggregated rows

    def forward():
        return c.logits(rows, x)

    def mm_forward():  # the MLP as m-batched matmuls, the path FedC2I's features take (MLPs only)
        return stacked_forward(c.stacked, c.parts(rows), x)

    @torch.no_grad()
    def class_step():
        h = head.features_of(c, rows, x)
        mat = torch.softmax(alpha * fedc2i.class_losses(h, y, w, v_all, head.bias is not None), dim=1)
        return head.put(scratch, torch.einsum("mjc,jcd->mcd", mat, v_all))

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    # on CPU with one torch thread the call runs on this thread, so its thread
    # CPU time is its cost even when the machine is shared and we get preempted;
    # on a GPU, wall time after a synchronize
    clock = time.perf_counter if cuda else time.thread_time
    fns = {"forward": forward, "class_step": class_step}
    if head.body is not None:
        assert torch.allclose(mm_forward(), forward(), atol=1e-5, rtol=1e-4)
        fns["mm_forward"] = mm_forward
    for fn in fns.values():
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    t_end = time.perf_counter() + min_time
    while time.perf_counter() < t_end or len(samples["forward"]) < 20:
        for k, fn in fns.items():  # interleaved, so both see the same machine state
            sync()
            t0 = clock()
            fn()
            sync()
            samples[k].append(clock() - t0)
    return {k: float(np.median(v)) for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads; 0 = torch's default")
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds of timing per measurement")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device == "cpu" and torch.get_num_threads() != 1:
        print("note: with several torch threads the CPU times below add up all threads' work")
    device = torch.device(a.device)
    N, C, bs = a.clients, a.classes, a.batch
    net, source = lenet(C)
    cases = [("mlp", models.mlp((1, 8, 8), C, [128, 128]), (1, 8, 8), "MLP 64-128-128-C"),
             ("lenet", net, (1, 28, 28), source)]
    print(f"N={N} C={C} batch={bs} device={device} threads={torch.get_num_threads()} torch={torch.__version__}")
    print(f"{'model':<8}{'clients/rank':>13}{'forward ms':>12}{'class step ms':>15}{'ratio':>8}"
          f"{'mm forward ms':>15}{'ratio to mm':>13}")
    worst = worst_mm = 0.0
    for name, model, shape, desc in cases:
        for m in (1, N):
            r = measure(name, model, shape, N, m, bs, C, device, a.min_time)
            ratio = r["class_step"] / r["forward"]
            worst = max(worst, ratio)
            line = f"{name:<8}{m:>13}{r['forward'] * 1e3:>12.3f}{r['class_step'] * 1e3:>15.3f}{ratio:>8.2f}"
            if "mm_forward" in r:
                mm = r["class_step"] / r["mm_forward"]
                worst_mm = max(worst_mm, mm)
                line += f"{r['mm_forward'] * 1e3:>15.3f}{mm:>13.2f}"
            print(line)
        print(f"  ({name}: {desc})")
    print(f"worst ratio {worst:.2f} to Clients.logits, {worst_mm:.2f} to the MLP's batched-matmul forward "
          "(target <= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
