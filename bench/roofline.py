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

The memory floor: what one local epoch must move through memory at the least,
over the rate of a large streaming add (``torch.add(a, b, out=c)`` on three 128 MB
float32 tensors, best of ``--repeats``, at ``--threads``). Per optimizer step and
client it counts the parameters read by the forward, the gradient written by the
backward, and the optimizer step's reads and writes (SGD: parameter and gradient
read, parameter written; momentum adds its buffer read and written; Adam its two
moments), so 5, 7 or 9 floats a parameter; per sample, every layer's output written
by the forward and read by the backward, and its gradient written and read (4 floats
an activation, the input's included). Caches are not credited: at 16+ clients a
step's rows (clients x parameters x 3-4 floats) outgrow the last-level cache. The
roofline is the larger floor; "of roofline" is that floor over the measured epoch.
``--optimizer``, ``--batch``, ``--hidden`` and ``--samples`` (per client, 60% of
them training) set the run measured, e.g. the room's cell:

    python bench/roofline.py --models mlp --shapes 1x28x28 --clients 100 --hidden 64 \
        --optimizer adam --batch 20 --samples 667 --threads 1

Prints one JSON line per (model, shape, clients) and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
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
from mpifl.schema import ModelConfig  # noqa: E402

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


def stream_rate(repeats: int, n: int = 32 * 2 ** 20) -> float:
    """GB/s of ``torch.add(a, b, out=c)`` over n float32 entries (two read, one written)."""
    a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
    return 3 * 4 * n / best_of(lambda: torch.add(a, b, out=c), repeats) / 1e9


def model_config(name: str, hidden: list[int] | None) -> ModelConfig:
    return ModelConfig(name=name, hidden=hidden) if name == "mlp" and hidden else ModelConfig(name=name)


def flops_per_sample(name: str, shape: tuple[int, ...], batch: int = 16, hidden: list[int] | None = None) -> float:
    """Forward + backward FLOPs of one sample of the plain module, by FlopCounterMode."""
    model = models.build(model_config(name, hidden), shape, 10, 0)
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as fc:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    return fc.get_total_flops() / batch


def activations_per_sample(name: str, shape: tuple[int, ...], hidden: list[int] | None = None) -> int:
    """Floats of one sample's input and of every leaf module's output (the forward's
    activations, which the backward reads and whose gradients it writes and reads)."""
    model = models.build(model_config(name, hidden), shape, 10, 0)
    sizes = [math.prod(shape)]
    leaves = [m for m in model.modules() if not list(m.children())]
    hooks = [m.register_forward_hook(lambda m, i, o: sizes.append(o[0].numel())) for m in leaves]
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    for h in hooks:
        h.remove()
    return sum(sizes)


# floats a parameter moves per optimizer step: the forward's read, the gradient's write, and
# the step's reads and writes (parameter, gradient, then momentum's buffer or Adam's moments)
PARAM_FLOATS = {"sgd": 5, "momentum": 7, "adam": 9}


def epoch_bytes(n_params: int, acts: int, steps: int, samples: int, optimizer: str) -> int:
    """The bytes one local epoch of ``steps`` optimizer steps over ``samples`` samples must move."""
    return 4 * (PARAM_FLOATS[optimizer] * n_params * steps + 4 * acts * samples)


def measure(name: str, shape: tuple[int, ...], n: int, repeats: int, fused_conv: str = "auto",
            opt: tuple[str, ...] = (), hidden: list[int] | None = None, samples_per_client: int = 50,
            batch: int = 16) -> dict:
    over = (f"train.fused_conv={fused_conv}", f"train.batch_size={batch}", *opt,
            *([f"model.hidden=[{','.join(map(str, hidden))}]"] if hidden and name == "mlp" else []))
    c = make(name, n, "on", torch.device("cpu"), samples_per_client, shape, over)
    local = np.arange(n)
    per_client = c.data.sizes[:n, 0].astype(int)
    samples = int(per_client.sum())
    steps = int(sum(-(-k // batch) for k in per_client))
    r = iter(range(1, 10 ** 6))
    t = best_of(lambda: c.train(local, 1, next(r)), repeats)
    work = flops_per_sample(name, shape, hidden=hidden) * samples
    kind = "adam" if "train.optimizer=adam" in opt else "sgd"  # make's SGD has no momentum
    moved = epoch_bytes(models.n_params(c.model), activations_per_sample(name, shape, hidden), steps, samples, kind)
    return {"model": name, "shape": "x".join(map(str, shape)), "clients": n, "samples": samples, "steps": steps,
            "optimizer": kind, "mflop_per_sample": work / samples / 1e6, "mb_per_epoch": moved / 1e6,
            "s_per_epoch": t, "gflops": work / t / 1e9, "client_epochs_s": n / t, "conv_kernel": c.conv_kernel or "",
            "work": work, "bytes": moved}


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
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"], help="train.optimizer (lr 0.05 / 1e-3)")
    ap.add_argument("--batch", type=int, default=16, help="train.batch_size")
    ap.add_argument("--hidden", type=int, nargs="+", default=None, help="the MLP's hidden widths (model.hidden)")
    ap.add_argument("--samples", type=int, default=50, help="samples a client, 60%% of them training")
    a = ap.parse_args(argv)
    opt = ("train.optimizer=adam", "train.lr=0.001") if a.optimizer == "adam" else ()
    torch.set_num_threads(a.threads)
    kept = keep_freed_memory()  # as a run does (mpifl.run.runtime)
    peak = matmul_rate(max(a.repeats, 5))
    bw = stream_rate(max(a.repeats, 5))
    print(json.dumps({"matmul_gflops": peak, "stream_gbs": bw, "threads": a.threads,
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
                row = measure(name, SHAPES[shape], n, a.repeats, a.fused_conv, opt, a.hidden, a.samples, a.batch)
                row["of_matmul"] = row["gflops"] / peak
                row["floor_flop_s"], row["floor_mem_s"] = row.pop("work") / peak / 1e9, row.pop("bytes") / bw / 1e9
                row["of_roofline"] = max(row["floor_flop_s"], row["floor_mem_s"]) / row["s_per_epoch"]
                print(json.dumps(row), flush=True)
                rows.append(row)
    peak_after, bw_after = matmul_rate(max(a.repeats, 5)), stream_rate(max(a.repeats, 5))
    print(f"\nmatmul 2048^2, {a.threads} threads: {peak:.1f} GFLOP/s (again at the end: {peak_after:.1f}); "
          f"streaming add: {bw:.1f} GB/s (at the end: {bw_after:.1f}); optimizer {a.optimizer}, batch {a.batch}\n")
    print("| model | conv kernel | input | clients | MFLOP/sample | MB/epoch | s/epoch | floor FLOPs s "
          "| floor memory s | GFLOP/s | of matmul | of roofline | client-epochs/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['conv_kernel'] or '-'} | {r['shape']} | {r['clients']} | "
              f"{r['mflop_per_sample']:.2f} | {r['mb_per_epoch']:.0f} | "
              f"{r['s_per_epoch']:.3f} | {r['floor_flop_s']:.3f} | {r['floor_mem_s']:.3f} | "
              f"{r['gflops']:.1f} | {100 * r['of_matmul']:.0f}% | {100 * r['of_roofline']:.0f}% | "
              f"{r['client_epochs_s']:.0f} |")


if __name__ == "__main__":
    main()
