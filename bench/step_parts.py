"""Where one training step of the batched conv-net path goes: its forward (layer by
layer), backward and optimizer update timed apart, and one model's evaluation
(``grouped.shared_forward``) against the modules' own forward. A measurement for
Performance IV (bench/README.md), not a test.

    python bench/step_parts.py --model cnn_dpfl --clients 50 --batch 10 --threads 1
    python bench/step_parts.py --model lenet --clients 64 --batch 16 --threads 2 --eval 850
    python bench/step_parts.py --model cnn_dpfl --clients 64 --batch 16 --threads 2 --fused-conv off

Data: Gaussian blobs in 1x28x28 (``make`` of bench/gpu.py's kind), the clients'
first batch of an epoch; glibc's malloc keeps freed blocks as a run has it
(``mpifl.comm.keep_freed_memory``). Each figure is the median of ``--repeats``
calls after one warm-up: ``forward`` (the loss on per-parameter leaves),
``forward+backward`` (and the gradients), ``+update`` (and ``Optimizer.step_`` on a
copy of the rows), each layer's forward (no gradient kept), and with ``--eval N``
one model on N samples: ``shared_forward`` and the plain module; with ``--compile``
the forward and backward of ``torch.compile(grouped_loss)`` (the time to compile
apart).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mpifl import config, models  # noqa: E402
from mpifl.comm import keep_freed_memory  # noqa: E402
from mpifl.data import build  # noqa: E402
from mpifl.train import Clients  # noqa: E402
from mpifl.train import grouped as G  # noqa: E402

SHAPE = (1, 28, 28)


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: kernels, allocator
    took = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(took))


def clients(model: str, n: int, batch: int, fused_conv: str = "auto") -> Clients:
    cfg = config.load(None, ["data.name=synthetic", "data.partition=iid", f"data.n_clients={n}",
                             f"data.n_samples={87 * n}", f"data.synthetic_dim={int(np.prod(SHAPE))}",
                             f"model.name={model}", "train.batched=on", f"train.batch_size={batch}",
                             "train.lr=0.05", f"train.fused_conv={fused_conv}"])
    data = build(cfg.data, 0, np.arange(n))
    data.x = data.x.reshape(-1, *SHAPE)
    data.in_shape = SHAPE
    return Clients(models.build(cfg.model, SHAPE, data.n_classes, 0), data, cfg.train, torch.device("cpu"), 0)


def layer_times(ops: list, p: dict, x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Each layer of the grouped forward (``grouped.layer``, which also turns the
    clients' samples into a grouped convolution's layout where a layer needs it)
    alone on its input."""
    m, h, out = x.shape[0], x, {}
    for i, op in enumerate(ops):
        out[f"{i}:{op[0]}"] = median_ms(lambda h=h, op=op: G.layer(op, p, h, m), repeats)
        h = G.layer(op, p, h, m)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn_dpfl")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--eval", type=int, default=0, help="also one model on this many samples")
    ap.add_argument("--compile", action="store_true", help="also forward+backward of torch.compile(grouped_loss)")
    ap.add_argument("--fused-conv", default="auto", choices=["auto", "off"], help="train.fused_conv")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    kept = keep_freed_memory()
    c = clients(a.model, a.clients, a.batch, a.fused_conv)
    assert c.convnet is not None, f"{a.model} does not take the grouped conv path"
    local = np.arange(a.clients)
    x, y, w = c.batch(c.plan(local, 1, 0).idx[:, 0])
    rows = c.params[local].clone()

    def forward(loss_of=G.grouped_loss):
        leaves = {k: v.detach().requires_grad_(True) for k, v in c.layout.parts(rows).items()}
        return leaves, loss_of(c.convnet, leaves, x, y, w)

    def backward(loss_of=G.grouped_loss):
        leaves, loss = forward(loss_of)
        return torch.autograd.grad(loss.sum(), list(leaves.values()))

    def update():
        c.opt.step_(slice(0, a.clients), rows, list(backward()))

    res = {"model": a.model, "conv_kernel": c.conv_kernel, "clients": a.clients, "batch": a.batch, "threads": a.threads,
           "malloc_keeps_freed": kept, "forward_ms": median_ms(forward, a.repeats),
           "forward_backward_ms": median_ms(backward, a.repeats), "step_ms": median_ms(update, a.repeats)}
    if a.compile:  # inductor's C++ kernels for everything but the convolutions and matmuls
        t0 = time.perf_counter()
        compiled = torch.compile(G.grouped_loss, dynamic=False)
        backward(compiled)
        res["compile_s"] = time.perf_counter() - t0
        res["compiled_forward_backward_ms"] = median_ms(lambda: backward(compiled), a.repeats)
    with torch.no_grad():
        res["layers_ms"] = layer_times(c.convnet, c.layout.parts(rows), x, a.repeats)
        if a.eval:
            one = {k: v[0] for k, v in c.layout.parts(rows).items()}
            flat = torch.randn(a.eval, *SHAPE)
            c.model.eval()
            res["eval_samples"] = a.eval
            res["eval_shared_forward_ms"] = median_ms(lambda: G.shared_forward(c.convnet, one, flat), a.repeats)
            res["eval_module_ms"] = median_ms(lambda: torch.func.functional_call(c.model, one, (flat,)), a.repeats)
    res["layers_ms"] = {k: round(v, 3) for k, v in res["layers_ms"].items()}
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()}))


if __name__ == "__main__":
    main()
