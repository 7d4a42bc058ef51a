"""A training step of the batched conv path with each convolution's three
directions (forward, weight gradient, input gradient) in a chosen memory layout,
against the path as it is.

    python bench/conv_layouts.py --model cnn_dpfl --clients 64 --layouts '[[1,1,0],[0,1,0]]'

``--layouts``: one JSON list per candidate, one ``[fw, dW, dX]`` triple per
convolution of the model, 1 = channels-last, 0 = torch's NCHW (the input gradient
of the first convolution is never computed). The candidate runs the path's own
operations (mpifl.train.grouped) but each convolution through an autograd
function that copies its operands to the chosen layout per direction, so the
copies are paid for, as a real change would pay them. Every candidate and the
path are timed in turns, ``--rounds`` times, best of ``--repeats`` steps each:
the machine's noise shows as the spread between rounds. Batch 16 a client, one
forward and backward of the per-client loss.

``--unfold`` adds a formulation without torch's convolution kernels: activations
as ``[client, channel, batch, H, W]``, each convolution as ``unfold`` of every
channel plane and one batched matrix product per client (pooling and ReLU act on
the planes alike).

`bench/roofline.py --kernels` times each direction apart; this script says what
is left of a faster kernel once its layout copies sit in the step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpifl import models  # noqa: E402
from mpifl.schema import ModelConfig  # noqa: E402
from mpifl.train import grouped  # noqa: E402
from mpifl.train.loss import cross_entropy  # noqa: E402

F = torch.nn.functional
CL = torch.channels_last


def _to(t: torch.Tensor, cl: int) -> torch.Tensor:
    return t.contiguous(memory_format=CL) if cl else t.contiguous()


class _Conv(torch.autograd.Function):
    """Grouped conv2d, each direction in its own layout (``lay = (fw, dW, dX)``)."""

    @staticmethod
    def forward(ctx, x, w, args, m, lay):  # noqa: ANN001 - autograd's signature
        ctx.save_for_backward(x, w)
        ctx.args, ctx.m, ctx.lay = args, m, lay
        return F.conv2d(_to(x, lay[0]), _to(w, lay[0]), None, *args, m).contiguous()

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001
        x, w = ctx.saved_tensors
        st, pd, dl = ctx.args
        out = [None, None]
        for i, need in ((1, ctx.needs_input_grad[1]), (0, ctx.needs_input_grad[0])):
            if need:
                cl = ctx.lay[2 - i]
                mask = [i == 0, i == 1, False]
                r = torch.ops.aten.convolution_backward(_to(g, cl), _to(x, cl), _to(w, cl), None, st, pd, dl,
                                                        False, [0, 0], ctx.m, mask)
                out[i] = r[i].contiguous()
        return out[0], out[1], None, None, None


def forward(ops: list, p: dict[str, torch.Tensor], x: torch.Tensor, lays: list) -> torch.Tensor:
    """grouped._forward with each convolution through :class:`_Conv`."""
    m, b = x.shape[:2]
    h = x.transpose(0, 1).reshape(b, m * x.shape[2], *x.shape[3:])
    convs = iter(lays)
    for op in ops:
        if op[0] == "conv":
            mod, wt = op[3], p[op[1]]
            h = _Conv.apply(h, wt.reshape(-1, *wt.shape[2:]), (mod.stride, mod.padding, mod.dilation), m,
                            next(convs))
            if op[2]:
                h = h + p[op[2]].reshape(1, -1, 1, 1)
        elif op[0] == "pool":
            h = grouped._max_pool(h, op[1])
        elif op[0] == "relu":
            h = F.relu(h)
        elif op[0] == "flatten":
            h = h.reshape(b, m, -1).transpose(0, 1).contiguous()
        else:
            h = torch.bmm(h, p[op[1]].transpose(1, 2))
            if op[2]:
                h = h + p[op[2]].unsqueeze(1)
    return h


def unfold_forward(ops: list, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The same net with each convolution as unfold + ``bmm`` (``--unfold``)."""
    m, b = x.shape[:2]
    h = x.transpose(1, 2)  # [m, C, b, H, W]
    for op in ops:
        if op[0] == "conv":
            mod, wt = op[3], p[op[1]]
            k, pd, cin, hh, ww = mod.kernel_size[0], mod.padding[0], h.shape[1], h.shape[3], h.shape[4]
            ho, wo = hh + 2 * pd - k + 1, ww + 2 * pd - k + 1
            cols = F.unfold(h.reshape(m * cin * b, 1, hh, ww), k, padding=pd)
            cols = cols.view(m, cin, b, k * k, ho * wo).transpose(2, 3).reshape(m, cin * k * k, b * ho * wo)
            h = torch.bmm(wt.reshape(m, wt.shape[1], -1), cols)
            if op[2]:
                h = h + p[op[2]].reshape(m, -1, 1)
            h = h.view(m, -1, b, ho, wo)
        elif op[0] == "pool":
            s = h.shape
            h = F.max_pool2d(h.reshape(s[0] * s[1], s[2], s[3], s[4]), *op[1][:2])
            h = h.view(s[0], s[1], s[2], *h.shape[-2:])
        elif op[0] == "relu":
            h = F.relu(h)
        elif op[0] == "flatten":
            h = h.transpose(1, 2).reshape(m, b, -1)
        else:
            h = torch.bmm(h, p[op[1]].transpose(1, 2))
            if op[2]:
                h = h + p[op[2]].unsqueeze(1)
    return h


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn_dpfl")
    ap.add_argument("--shape", default="1x28x28")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layouts", nargs="+", default=[])
    ap.add_argument("--unfold", action="store_true", help="also the unfold + bmm formulation (see above)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    shape = tuple(int(v) for v in a.shape.split("x"))
    model = models.build(ModelConfig(name=a.model), shape, 10, 0)
    ops = grouped.grouped_convnet(model)
    m, b = a.clients, 16
    p = {k: v.detach().expand(m, *v.shape).clone().requires_grad_(True) for k, v in model.named_parameters()}
    x, y, w = torch.randn(m, b, *shape), torch.randint(0, 10, (m, b)), torch.full((m, b), 1 / b)
    fwds = {"path": lambda: grouped.grouped_forward(ops, p, x)}
    for s in a.layouts:
        fwds[s] = (lambda lays: lambda: forward(ops, p, x, lays))(json.loads(s))

    if a.unfold:
        fwds["unfold"] = lambda: unfold_forward(ops, p, x)

    def step(f) -> float:  # noqa: ANN001
        t0 = time.perf_counter()
        torch.autograd.grad(cross_entropy(f(), y, w).sum(), list(p.values()))
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {k: [] for k in fwds}
    for f in fwds.values():
        step(f)
    for _ in range(a.rounds):
        for k, f in fwds.items():
            times[k].append(min(step(f) for _ in range(a.repeats)) * 1e3)
    for k, ts in times.items():
        print(json.dumps({"model": a.model, "shape": a.shape, "clients": m, "layouts": k,
                          "step_ms": [round(t, 2) for t in ts],
                          "vs_path": [round(t / p0, 3) for t, p0 in zip(ts, times["path"])]}))


if __name__ == "__main__":
    main()
