"""How close the batched training path runs to the machine: the float32 matrix
product's rate, and each model's training FLOP rate as a fraction of it.

    python bench/roofline.py                                  # 2 threads, as bench/README.md records
    python bench/roofline.py --models cnn_dpfl lenet --clients 64 --threads 1

The machine's rate is ``torch.mm`` of two 2048 x 2048 float32 matrices (best of
``--repeats``). A model's training work per sample is what torch's
``FlopCounterMode`` counts for one forward and backward of the plain module on a
batch (every matrix product and convolution, forward and backward, the input
needing no gradient), over the batch; its rate is that work times the samples
``Clients.train`` went through in one local epoch of every client, over the
call's best time, with glibc's malloc keeping freed blocks as a run has it
(``mpifl.comm.keep_freed_memory``). Padding, the optimizer step, the loss, ReLU and pooling are
not counted as work: they are what the path spends beside the FLOPs. Data:
Gaussian blobs (bench/gpu.py's ``make``: 30 training samples a client, batch 16)
in each shape the model takes, ``1x28x28`` and ``3x32x32``.

``--kernels``: instead, each convolution of each model as the batched path runs it
(one grouped ``conv2d`` over ``--clients`` clients' channels, batch 16), its
forward, weight gradient and input gradient timed apart in torch's default
(NCHW) layout and channels-last, each as a fraction of the matrix product: the
ceiling a path made of torch's convolution kernels can reach.

``--fused-conv off``: every conv net on torch's kernels (``train.fused_conv=off``;
by default cnn_dpfl's layers run in mpifl/train/fused.py's kernel, the table's
"conv kernel" column).

Prints one JSON line per (model, shape, clients) and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu import make  # noqa: E402 - bench/ is not a package

from mpifl import models  # noqa: E402
from mpifl.comm import keep_freed_memory  # noqa: E402
from mpifl.config.sections import ModelConfig  # noqa: E402

SHAPES = {"1x28x28": (1, 28, 28), "3x32x32": (3, 32, 32)}


def best_of(fn, repeats: int) -> float:
    fn()  # warm-up: kernels, allocator
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_rate(repeats: int, n: int = 2048) -> float:
    """GFLOP/s of ``torch.mm`` of two n x n float32 matrices."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n ** 3 / best_of(lambda: torch.mm(a, b), repeats) / 1e9


def flops_per_sample(name: str, shape: tuple[int, ...], batch: int = 16) -> float:
    """Forward + backward FLOPs of one sample of the plain module, by FlopCounterMode."""
    model = models.build(ModelConfig(name=name), shape, 10, 0)
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as fc:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    return fc.get_total_flops() / batch


def measure(name: str, shape: tuple[int, ...], n: int, repeats: int, fused_conv: str = "auto") -> dict:
    c = make(name, n, "on", torch.device("cpu"), 50, shape, (f"train.fused_conv={fused_conv}",))
    local = np.arange(n)
    samples = int(c.data.sizes[:n, 0].sum())
    r = iter(range(1, 10 ** 6))
    t = best_of(lambda: c.train(local, 1, next(r)), repeats)
    work = flops_per_sample(name, shape) * samples
    return {"model": name, "shape": "x".join(map(str, shape)), "clients": n, "samples": samples,
            "mflop_per_sample": work / samples / 1e6, "s_per_epoch": t, "gflops": work / t / 1e9,
            "client_epochs_s": n / t, "conv_kernel": c.conv_kernel or ""}


def conv_layers(name: str, shape: tuple[int, ...]) -> list[tuple[torch.nn.Conv2d, tuple[int, ...]]]:
    """Each Conv2d of the model with the shape of one sample's input to it."""
    model = models.build(ModelConfig(name=name), shape, 10, 0)
    seen: list[tuple[torch.nn.Conv2d, tuple[int, ...]]] = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append((m, tuple(i[0].shape[1:]))))
             for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    for h in hooks:
        h.remove()
    return seen


def _directions(x: torch.Tensor, wt: torch.Tensor, g: torch.Tensor, st: list[int], pad: list[int],
                dil: list[int], m: int, repeats: int) -> dict[str, float]:
    """Best seconds of a grouped convolution's forward, weight gradient and input gradient."""
    aten = torch.ops.aten

    def backward(mask: list[bool]):
        return lambda: aten.convolution_backward(g, x, wt, None, st, pad, dil, False, [0, 0], m, mask)

    return {"fw": best_of(lambda: torch.nn.functional.conv2d(x, wt, None, st, pad, dil, m), repeats),
            "dW": best_of(backward([False, True, False]), repeats),
            "dX": best_of(backward([True, False, False]), repeats)}


def kernels(name: str, shape: tuple[int, ...], m: int, repeats: int, peak: float, batch: int = 16) -> list[dict]:
    """Forward, weight- and input-gradient rates of each grouped convolution of ``m`` clients."""
    out = []
    for conv, (c, h, w) in conv_layers(name, shape):
        st, pad, dil = (list(torch.nn.modules.utils._pair(v)) for v in (conv.stride, conv.padding, conv.dilation))
        row = {"model": name, "shape": "x".join(map(str, shape)), "clients": m,
               "layer": f"{c}->{conv.out_channels} k{conv.kernel_size[0]} on {h}x{w}"}
        for fmt, mf in (("nchw", torch.contiguous_format), ("cl", torch.channels_last)):
            x = torch.randn(batch, m * c, h, w).contiguous(memory_format=mf)
            wt = torch.randn(m * conv.out_channels, c, *conv.kernel_size).contiguous(memory_format=mf)
            y = torch.nn.functional.conv2d(x, wt, None, st, pad, dil, m)
            g = torch.randn_like(y).contiguous(memory_format=mf)
            flops = 2 * y.numel() * c * wt.shape[2] * wt.shape[3]
            for k, secs in _directions(x, wt, g, st, pad, dil, m, repeats).items():
                row[f"{k}_{fmt}"] = flops / secs / 1e9 / peak
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn_dpfl", "lenet", "cnn2"])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--clients", nargs="+", type=int, default=[16, 64, 256])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kernels", action="store_true", help="each convolution's kernels apart (see above)")
    ap.add_argument("--fused-conv", default="auto", choices=["auto", "off"],
                    help="train.fused_conv: off = torch's kernels for every conv net (mpifl/train/fused.py)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    kept = keep_freed_memory()  # as a run does (mpifl.run.runtime)
    peak = matmul_rate(max(a.repeats, 5))
    print(json.dumps({"matmul_gflops": peak, "threads": a.threads,
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                      "malloc_keeps_freed": kept}),
          flush=True)
    if a.kernels:
        rows = [r for name in a.models if name != "mlp" for shape in a.shapes for n in a.clients
                for r in kernels(name, SHAPES[shape], n, a.repeats, peak)]
        print("| model | input | clients | convolution | forward NCHW / CL | weight grad NCHW / CL "
              "| input grad NCHW / CL |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['model']} | {r['shape']} | {r['clients']} | {r['layer']} | " + " | ".join(
                f"{100 * r[k + '_nchw']:.0f}% / {100 * r[k + '_cl']:.0f}%" for k in ("fw", "dW", "dX")) + " |")
        return
    rows = []
    for name in a.models:
        for shape in a.shapes:
            for n in a.clients:
                row = measure(name, SHAPES[shape], n, a.repeats, a.fused_conv)
                row["of_matmul"] = row["gflops"] / peak
                print(json.dumps(row), flush=True)
                rows.append(row)
    peak_after = matmul_rate(max(a.repeats, 5))
    print(f"\nmatmul 2048^2, {a.threads} threads: {peak:.1f} GFLOP/s (again at the end: {peak_after:.1f})\n")
    print("| model | conv kernel | input | clients | MFLOP/sample | s/epoch | GFLOP/s | of matmul | client-epochs/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['conv_kernel'] or '-'} | {r['shape']} | {r['clients']} | "
              f"{r['mflop_per_sample']:.2f} | "
              f"{r['s_per_epoch']:.3f} | {r['gflops']:.1f} | {100 * r['of_matmul']:.0f}% | "
              f"{r['client_epochs_s']:.0f} |")


if __name__ == "__main__":
    main()
