"""Conv nets (``nn.Sequential`` of Conv2d / ReLU / MaxPool2d / Flatten / Linear) of
many clients at once: every convolution as one grouped convolution over the
clients' channels, the forward written out and its backward left to autograd.

The convolutional part runs in the ``[batch, client x channel, H, W]`` layout that
a grouped convolution reads and writes, in which ReLU and pooling act on
channels alike, stored channels-last on the CPU (:func:`_layout`); only the
flattened features turn to ``[client, batch, features]`` for the linear layers'
``bmm``. ``torch.func.vmap`` computes the same function but moves its batch
dimension around every layer (a copy before each pooling, its indices and its
backward on a strided tensor): 20-25% of a training step of ``cnn_dpfl`` at 27
clients on one thread (bench/README.md, Performance III); channels-last took
another quarter off cnn_dpfl's step and half off LeNet's (Performance IV).

The results are vmap's up to the order of the kernels' sums (float32 rounding;
tests/train/test_train_grouped.py). What must not move is a client's bits when other
clients share its call (another rank count puts other clients beside it): the
convolutions' bias gradients are therefore summed by :func:`column_sums`, in an
order fixed by the batch alone, and a lone client runs beside a zero one
(:func:`grouped_forward`); the tests check every width from 1 to 30 clients on
one and two threads. :class:`GroupedConv` is the engine
(:class:`~mpifl.train.engine.Engine`) that runs them.

A convolution that a 2x2 max-pooling and ReLU follow may run, with them, in
:mod:`mpifl.train.fused`'s kernel instead (:func:`fuse`; ``train.fused_conv``),
reading and writing the clients' samples client-major ``[m, b, C, H, W]``.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import torch
from torch import nn

from mpifl.train import fused
from mpifl.train.layout import Layout
from mpifl.train.loss import cross_entropy
from mpifl.train.rowmodel import autograd_blocks

F = torch.nn.functional

# (kind, *parameter names, the Conv2d or the pooling's arguments) per layer
Op = tuple


def grouped_convnet(model: nn.Module) -> list[Op] | None:
    """The layers of an ``nn.Sequential`` conv net this module runs, or None.

    Conv2d (zero padding, ``groups=1``), ReLU and MaxPool2d before one Flatten,
    then Linear and ReLU; at least one convolution (a plain MLP takes
    :mod:`mpifl.train.mlp`)."""
    if not isinstance(model, nn.Sequential):
        return None
    ops: list[Op] = []
    flat = False
    for name, mod in model.named_children():
        if isinstance(mod, nn.Conv2d) and not flat and mod.groups == 1 and mod.padding_mode == "zeros" \
                and not isinstance(mod.padding, str):
            ops.append(("conv", f"{name}.weight", f"{name}.bias" if mod.bias is not None else "", mod))
        elif isinstance(mod, nn.MaxPool2d) and not flat and not mod.return_indices:
            ops.append(("pool", pool_args(mod)))
        elif isinstance(mod, nn.ReLU):
            ops.append(("relu",))
        elif isinstance(mod, nn.Flatten) and not flat and mod.start_dim == 1 and mod.end_dim == -1:
            ops.append(("flatten",))
            flat = True
        elif isinstance(mod, nn.Linear) and flat:
            ops.append(("linear", f"{name}.weight", f"{name}.bias" if mod.bias is not None else ""))
        else:
            return None
    if not (flat and any(op[0] == "conv" for op in ops)):
        return None
    return _pool_before_relu(ops)


def fuse(ops: list[Op], in_shape: tuple[int, ...]) -> list[Op] | None:
    """``ops`` with every convolution that a max-pooling and ReLU follow, where
    :mod:`mpifl.train.fused`'s kernel computes them (:func:`~mpifl.train.fused.fits`
    on its input's shape), as one layer ``("fused", conv, pool, relu)``; None where
    none fits."""
    out: list[Op] = []
    shape = torch.Size([1, *in_shape])
    i = 0
    while i < len(ops):
        op = ops[i]
        if op[0] == "flatten":
            return out + ops[i:] if any(o[0] == "fused" for o in out) else None
        if [o[0] for o in ops[i:i + 3]] == ["conv", "pool", "relu"] and fused.fits(op[3], ops[i + 1][1], shape[1:]):
            out.append(("fused", *ops[i:i + 3]))
            step = ops[i:i + 3]
            i += 3
        else:
            out.append(op)
            step = [op]
            i += 1
        for o in step:  # the next layer's input shape
            shape = _shape_after(o, shape)
    return None


def _shape_after(op: Op, shape: torch.Size) -> torch.Size:
    with torch.no_grad():
        h = torch.zeros(shape)
        if op[0] == "conv":
            mod: nn.Conv2d = op[3]
            w = mod.weight.new_zeros(mod.weight.shape)
            return F.conv2d(h, w, None, mod.stride, mod.padding, mod.dilation).shape
        return F.max_pool2d(h, *op[1]).shape if op[0] == "pool" else shape


def unfused(ops: list[Op]) -> list[Op]:
    """``ops`` with each fused layer (:func:`fuse`) as its three layers again."""
    return [part for op in ops for part in (op[1:] if op[0] == "fused" else [op])]


def _pool_before_relu(ops: list[Op]) -> list[Op]:
    """``ops`` with every ReLU that a max-pooling follows moved after it.

    max(relu(a), relu(b), ...) is relu(max(a, b, ...)) in floats, and so are the
    gradients: where a window's maximum is positive both orders pass the gradient
    to its first maximal entry, where it is not both pass zero. After the pooling
    the ReLU and its backward touch a quarter of the entries (2x2 windows), which
    was 9% of a LeNet step in ReLU's backward alone (bench/README.md,
    Performance IV); tests/train/test_train_grouped.py checks pooling with ties."""
    out = list(ops)
    for i in range(len(out) - 1):
        if out[i][0] == "relu" and out[i + 1][0] == "pool":
            out[i], out[i + 1] = out[i + 1], out[i]
    return out


def grouped_forward(ops: list[Op], p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``[m, b, C]`` logits of m conv nets (per-parameter tensors ``[m, *shape]``) on
    ``x [m, b, channels, H, W]``.

    One client runs beside a zero second one: a convolution of one group is torch's
    ungrouped kernel, whose sums (weight and input gradients; some forwards) run in
    another order than the grouped kernel's, so a client's bits would depend on
    whether it steps alone (alone on its rank, or the only one with a batch left) or
    with others (tests/train/test_train_grouped.py). With two or more groups each group's
    results are the same whatever the others hold, on one thread or several."""
    if x.shape[0] == 1:
        p = {k: torch.cat([v, torch.zeros_like(v)]) for k, v in p.items()}
        return _forward(ops, p, torch.cat([x, torch.zeros_like(x)]))[:1]
    return _forward(ops, p, x)


def _forward(ops: list[Op], p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    h = x
    for op in ops:
        h = layer(op, p, h, x.shape[0])
    return h


def _grouped(h: torch.Tensor, m: int) -> torch.Tensor:
    """The clients' samples ``[m, b, C, H, W]`` as ``[b, m x C, H, W]`` (a grouped
    convolution's layout, :func:`_layout`); that layout as it is."""
    if h.dim() == 4:
        return h
    b = h.shape[1]
    return h.transpose(0, 1).reshape(b, m * h.shape[2], *h.shape[3:]).contiguous(memory_format=_layout(h.device))


def layer(op: Op, p: dict[str, torch.Tensor], h: torch.Tensor, m: int) -> torch.Tensor:
    """One layer of :func:`_forward` for ``m`` clients. Before the flatten ``h`` is the
    clients' samples ``[m, b, channels, H, W]`` (the input, and what a fused layer,
    :func:`fuse`, reads and writes) or ``[b, m x channels, H, W]`` (what torch's
    grouped convolutions and pooling read and write), each turned into the other
    where a layer needs it; after the flatten ``[m, b, features]``."""
    kind = op[0]
    if kind == "fused":
        if h.dim() == 4:
            h = h.unflatten(1, (m, -1)).transpose(0, 1).contiguous()
        conv = op[1]
        bias = p[conv[2]] if conv[2] else h.new_zeros(m, conv[3].out_channels)
        return fused.ConvPoolReLU.apply(h, p[conv[1]], bias)
    if kind in ("conv", "pool"):
        h = _grouped(h, m)
    if kind == "conv":
        mod: nn.Conv2d = op[3]
        wt = p[op[1]]
        bias = p[op[2]].reshape(-1) if op[2] else None
        # the bias rides in the convolution's forward; its gradient is ours
        # (:class:`_BiasGrad`): the kernels' own sums run in an order that depends
        # on how many clients share the call
        args = (None if bias is None else bias.detach(), mod.stride, mod.padding, mod.dilation, m)
        if _runs_depthwise(wt.shape[2], wt.shape[1], h.device):
            h = _DepthwiseForward.apply(h, wt.reshape(-1, *wt.shape[2:]), *args)
        else:
            h = F.conv2d(h, wt.reshape(-1, *wt.shape[2:]), *args)
        if bias is not None and bias.requires_grad:
            h = _BiasGrad.apply(h, bias)
        return h
    if kind == "pool":
        return F.max_pool2d(h, *op[1])
    if kind == "relu":
        return F.relu(h)
    if kind == "flatten":
        if h.dim() == 5:  # already in the modules' (C, H, W) order, contiguous
            return h.reshape(m, h.shape[1], -1)
        # [m, b, C*H*W] in the modules' (C, H, W) order, contiguous: bmm of a
        # strided batch may take another kernel, with other bits
        return h.unflatten(1, (m, -1)).transpose(0, 1).reshape(m, h.shape[0], -1).contiguous()
    h = _Linear.apply(h, p[op[1]])  # linear on [m, b, in]
    if op[2]:  # apart, as vmap's linear adds it (its gradient: a sum over the batch, per client)
        h = h + p[op[2]].unsqueeze(1)
    return h


class _Linear(torch.autograd.Function):
    """Every client's ``h [b, in] @ W.T`` (``bmm``), whose weight gradient
    ``g.T @ h`` comes out in the weight's own layout ``[m, out, in]``. Autograd's
    ``bmm`` backward computes it as ``(h.T @ g).T``, a transposed view, and the
    optimizer's update of the rows then walks one of its operands across the rows:
    with cnn_dpfl's two wide layers (94% of its parameters) that update took 2 of a
    15 ms step at 50 clients (bench/README.md, Performance IV). The input gradient
    is autograd's own call (``g @ W``)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # noqa: ANN001 - autograd's ctx
        ctx.save_for_backward(h, w)
        return torch.bmm(h, w.transpose(1, 2))

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:  # noqa: ANN001
        h, w = ctx.saved_tensors
        gh = torch.bmm(g, w) if ctx.needs_input_grad[0] else None
        gw = torch.bmm(g.transpose(1, 2), h) if ctx.needs_input_grad[1] else None
        return gh, gw


def _layout(device: torch.device) -> torch.memory_format:
    """The convolutions' layout: channels-last on the CPU, where oneDNN's grouped
    kernels, the pooling and ReLU all run on it without a copy between layers
    (bench/README.md, Performance IV), torch's default elsewhere."""
    return torch.channels_last if device.type == "cpu" else torch.contiguous_format


def column_sums(g: torch.Tensor) -> torch.Tensor:
    """Sums over the rows of ``g [R, K]`` by halving: each step adds the second half
    of the rows to the first (an odd row left over joins the first row). Only
    elementwise additions, in an order fixed by R alone: column k's sum has the
    same bits whatever K is, on any number of threads, where torch's reductions
    (and oneDNN's bias gradient) choose their order by the tensor's width."""
    while g.shape[0] > 1:
        n = g.shape[0] // 2
        s = g[:n] + g[n:2 * n]
        if g.shape[0] % 2:
            s[0] += g[2 * n]
        g = s
    return g[0]


# Output channels per client up to which a one-channel convolution's forward runs
# depthwise (:class:`_DepthwiseForward`): at 16 and 64 clients (5x5 on 28x28, batch
# 16, 2 threads) 2.4-2.8x the grouped kernel's speed at 2 outputs, 1.6x at 4, 0.9-1.1x
# at 6, 0.7-0.9x at 8 (bench/README.md, Performance IV).
DEPTHWISE_MAX_OUT = 4


def _runs_depthwise(c_in: int, c_out: int, device: torch.device) -> bool:
    """Whether a convolution of ``c_in`` -> ``c_out`` channels (a client's, or the one
    model's) runs its forward by :func:`repeated_depthwise`: one input channel, a few
    outputs, on the CPU (channels-last)."""
    return c_in == 1 and c_out <= DEPTHWISE_MAX_OUT and _layout(device) == torch.channels_last


def repeated_depthwise(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: tuple, padding: tuple,
                       dilation: tuple, m: int) -> torch.Tensor:
    """The grouped convolution of ``h [N, m, H, W]`` (one channel a group) with ``w
    [m * c, 1, k, k]``, computed as the depthwise convolution of each channel repeated
    c times (channels-last; :class:`_DepthwiseForward`)."""
    n, _, hh, ww = h.shape
    c = w.shape[0] // m
    rep = h.permute(0, 2, 3, 1)[..., None].expand(n, hh, ww, m, c).reshape(n, hh, ww, m * c).permute(0, 3, 1, 2)
    # one client: the reshape keeps the repeat a stride-0 view, which oneDNN reads 9x slower than a copy
    rep = rep.contiguous(memory_format=torch.channels_last)
    return F.conv2d(rep, w, bias, stride, padding, dilation, m * c)


class _DepthwiseForward(torch.autograd.Function):
    """A grouped convolution of one input channel per client (a first layer on
    one-channel images) whose forward runs as a depthwise convolution of each
    client's channel repeated once per output channel: oneDNN's depthwise kernel
    vectorises over channels where the grouped one loops over groups of 1 x c_out,
    and with the repeat it is faster for a few output channels (cnn_dpfl's 4: 1.03
    against 1.61 ms at 64 clients). Each output is the same sum in the same order,
    to the bit (tests/train/test_train_grouped.py). The backward is the grouped
    convolution's own."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,  # noqa: ANN001 - autograd's ctx
                stride: tuple, padding: tuple, dilation: tuple, m: int) -> torch.Tensor:
        ctx.save_for_backward(h, w)
        ctx.conv = (stride, padding, dilation, m)
        return repeated_depthwise(h, w, bias, stride, padding, dilation, m)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple:  # noqa: ANN001
        h, w = ctx.saved_tensors
        stride, padding, dilation, m = ctx.conv
        pair = nn.modules.utils._pair
        want = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], False]
        gh, gw, _ = torch.ops.aten.convolution_backward(
            g, h, w, None, list(pair(stride)), list(pair(padding)), list(pair(dilation)), False, [0, 0], m, want)
        return gh, gw, None, None, None, None, None


class _BiasGrad(torch.autograd.Function):
    """Identity on a convolution's output ``h [N, m*C, H, W]``; passes back the
    gradient of the bias ``[m*C]`` (added in the forward) as :func:`column_sums`."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:  # noqa: ANN001 - autograd's ctx
        return h.view_as(h)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        return g, column_sums(g.permute(0, 2, 3, 1).reshape(-1, g.shape[1]))


def shared_forward(ops: list[Op], p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``[B, C]`` logits of one conv net (per-parameter tensors ``p``) on ``x [B, ...]``:
    the calls its modules make, to their bits, with the pooling of
    :func:`_max_pool` and without ``functional_call``'s swap of the parameters; but a
    one-channel convolution of up to ``DEPTHWISE_MAX_OUT`` outputs runs as in
    training, samples in the place of clients (:func:`_folded_depthwise`; the
    modules' result up to rounding): cnn_dpfl's evaluation of 850 samples on one
    thread took 5.9 ms so, 9.5 as one model's depthwise convolution, 16.3 in its
    modules (bench/README.md, Performance IV). A fused layer (:func:`fuse`) runs
    as its three layers."""
    ops = unfused(ops)
    h = x
    skip = False
    for i, op in enumerate(ops):
        if skip:  # a pooling :func:`_folded_depthwise` ran
            skip = False
            continue
        kind = op[0]
        if kind == "conv":
            mod: nn.Conv2d = op[3]
            wt, bias = p[op[1]], p[op[2]] if op[2] else None
            if _runs_depthwise(wt.shape[1], wt.shape[0], h.device):
                skip = i + 1 < len(ops) and ops[i + 1][0] == "pool"
                h = _folded_depthwise(h, wt, bias, mod, ops[i + 1][1] if skip else None)
            else:
                h = F.conv2d(h, wt, bias, mod.stride, mod.padding, mod.dilation)
        elif kind == "pool":
            h = _max_pool(h, op[1])
        elif kind == "relu":
            h = F.relu(h)
        elif kind == "flatten":
            h = h.reshape(h.shape[0], -1)
        else:
            h = F.linear(h, p[op[1]], p[op[2]] if op[2] else None)
    return h


# Channels of the depthwise convolution :func:`_folded_depthwise` makes of one
# model's samples: oneDNN's depthwise kernel vectorises over channels, and a lone
# model's 4 (cnn_dpfl) fill a quarter of an AVX-512 register
FOLD_CHANNELS = 64


def _folded_depthwise(h: torch.Tensor, wt: torch.Tensor, bias: torch.Tensor | None, mod: nn.Conv2d,
                      pool: tuple | None) -> torch.Tensor:
    """One model's one-channel convolution (and the max-pooling ``pool`` after it) on
    ``h [N, 1, H, W]``, NCHW ``[N, c, H', W']`` out: k samples side by side as the
    channels of one image, each convolved as a client of :func:`repeated_depthwise`
    with the model's filters, so the kernel runs on k x c channels. A sample's
    outputs are the same sums in the same order whatever stands beside it (the
    depthwise kernel's bits do not depend on the channel count:
    tests/train/test_train_grouped.py), so its logits are those of the sample alone; the
    last image is filled up with zero samples, computed and dropped."""
    n, c = h.shape[0], wt.shape[0]
    k = max(1, FOLD_CHANNELS // c)
    if n % k:
        h = torch.cat([h, h.new_zeros(k - n % k, *h.shape[1:])])
    folded = h.reshape(-1, k, *h.shape[2:]).contiguous(memory_format=torch.channels_last)
    out = repeated_depthwise(folded, wt.repeat(k, 1, 1, 1), None if bias is None else bias.repeat(k), mod.stride,
                             mod.padding, mod.dilation, k)
    if pool is not None:
        out = F.max_pool2d(out, *pool)  # channels-last in and out: every channel alike
    nb, _, oh, ow = out.shape
    out = out.permute(0, 2, 3, 1).reshape(nb, oh, ow, k, c).permute(0, 3, 4, 1, 2).reshape(nb * k, c, oh, ow)
    # with one image the reshape may stay a strided view, which the next layer's
    # kernels would read in another order
    return out[:n].contiguous()


def pool_args(mp: nn.MaxPool2d) -> tuple:
    """``(kernel_size, stride, padding, dilation, ceil_mode)`` of ``mp``, as
    ``F.max_pool2d`` and its aten kernels take them."""
    return (*(nn.modules.utils._pair(v) for v in (mp.kernel_size, mp.stride, mp.padding, mp.dilation)), mp.ceil_mode)


def _max_pool(h: torch.Tensor, args: tuple) -> torch.Tensor:
    """Max-pooling (:func:`pool_args`) of ``h [N, C, H, W]``, on the CPU by
    :class:`_ChannelsLastPool`."""
    if h.device.type != "cpu":
        return F.max_pool2d(h, *args)
    return _ChannelsLastPool.apply(h, args)


class _ChannelsLastPool(torch.autograd.Function):
    """Max-pooling whose forward runs torch's channels-last kernel on a
    channels-last copy, and whose backward is max-pooling's own on the NCHW
    tensors. The channels-last kernel vectorises over channels where the NCHW
    one walks window by window (2.3 against 0.3 ms on ``[10, 108, 24, 24]`` on one
    thread, 0.8 ms more for the copy), and finds the same maxima at the same
    (first) positions, so values and gradients keep their bits. Autograd
    through ``contiguous(memory_format=...)`` instead would copy the gradient
    back too and leave it channels-last for the layers below, whose kernels
    are slower on the mixed layouts than the pooling gained (bench/README.md)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, args: tuple) -> torch.Tensor:  # noqa: ANN001 - autograd's ctx
        out, idx = torch.ops.aten.max_pool2d_with_indices(h.contiguous(memory_format=torch.channels_last), *args)
        idx = idx.contiguous()
        ctx.save_for_backward(h, idx)
        ctx.args = args
        return out.contiguous()

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        h, idx = ctx.saved_tensors
        return torch.ops.aten.max_pool2d_with_indices_backward(g.contiguous(), h, *ctx.args, idx), None


def grouped_loss(ops: list[Op], p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """Per-client weighted loss ``[m]`` (:func:`~mpifl.train.loss.cross_entropy`) of
    :func:`grouped_forward`'s logits; ``bias [m, C]`` is added to client i's logits."""
    return cross_entropy(grouped_forward(ops, p, x), y, w, bias=bias)


class GroupedConv:
    """The batched engine of a plain conv net (:func:`grouped_convnet`'s layers; no
    BatchNorm, so no buffers): :func:`grouped_forward`, its backward by autograd."""

    batched = True

    def __init__(self, model: nn.Module, layout: Layout, ops: list[Op]):
        self.model, self.layout, self.ops = model, layout, ops

    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              buffers: torch.Tensor, local: np.ndarray | None = None, bias: torch.Tensor | None = None,
              valid: torch.Tensor | None = None,
              frozen: Collection[str] = ()) -> tuple[list[torch.Tensor | None], torch.Tensor]:
        self.model.train()
        with torch.enable_grad():
            return autograd_blocks(self.layout, params, frozen, lambda p: grouped_loss(self.ops, p, x, y, w, bias))

    @torch.no_grad()
    def logits(self, params: torch.Tensor, x: torch.Tensor, buffers: torch.Tensor,
               local: np.ndarray | None = None) -> torch.Tensor:
        self.model.eval()
        return grouped_forward(self.ops, self.layout.parts(params), x)
