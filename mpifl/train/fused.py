"""A conv net's convolution, its 2x2 max-pooling and ReLU as one C++ kernel for
many clients at once (``train.fused_conv``): the grouped path's layers on the CPU
where they fit (:func:`fits`: both of cnn_dpfl's, 1 -> 4 and 4 -> 12 channels,
5x5, on 28x28 images).

Forward, per client i and sample: ``relu(maxpool2x2(conv(x, W_i) + b_i))``, each
pair of output rows held in registers over the taps and pooled as it is made, so
the convolution's output never goes to memory; the index of each window's first
maximum (torch's choice on ties) is kept, one byte. Backward, from the pooled
gradient ``g``: a window passes its gradient to its first maximum only, and only
where the ReLU's output is positive, so with ``(ay, ax)`` that maximum's position

    dW_i[o, c, ky, kx] = sum over (sample, window) with y > 0 of g[o, window] * x[c, ay + ky, ax + kx]
    db_i[o]            = the same sum of g[o, window]
    dx[c, ay + ky, ax + kx] += g[o, window] * W_i[o, c, ky, kx]   (where the input needs it)

visits a quarter or less of the positions that torch's weight and input gradients
and its pooling backward go over. cnn_dpfl's step at 64 clients, batch 16, two
threads: 14.4 ms on torch's kernels, 8.4 with both its layers here (bench/README.md,
Performance IV, "A fused convolution, pooling and ReLU").

The layers in between are client-major ``[m, b, C, H, W]``, which the next fused
layer and the flatten read as they are (:func:`mpifl.train.grouped.layer` turns
them into a grouped convolution's layout where one of torch's layers follows).

Bits: each client's sums run in an order fixed by its own shapes, one thread a
client (backward) or a client's sample (forward), so a client's results are the
same whatever clients share the call and on any number of threads
(tests/test_train_fused.py), as the grouped path promises. They are not torch's
(other sums; the compiler's fused multiply-adds for ``-march=native``): a run
logs which kernel it took (``conv_kernel``) and a resume keeps it.

The kernel compiles on first use with ``torch.utils.cpp_extension`` (a C++17
compiler and ninja; 25-35 s) into torch's extension cache (``TORCH_EXTENSIONS_DIR``,
default ``~/.cache/torch_extensions``), named by a hash of the source, the flags,
torch's version and this CPU's instruction set, so nodes of another CPU on a
shared home build their own. Ranks that start together wait on one build.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

SOURCE = Path(__file__).with_name("conv_pool_relu.cpp")
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fopenmp")
# what the kernel is built for: output channels a client, kernel width (one vector
# of 8 a patch row), patch rows (input channels x kernel size, in registers in the
# backward), convolution output columns (four vectors of 8)
MAX_OUT, MAX_K, MAX_ROWS, MAX_WIDTH = 16, 8, 32, 32


class FusedUnavailable(RuntimeError):
    """The kernel could not be built here (no compiler, no ninja, a failed build)."""


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    m = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    return m.group(1) if m else ""


@functools.cache
def _build() -> ModuleType | str:
    # its import warns where no CUDA runtime is found: nothing here needs one
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils import cpp_extension

    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), " ".join(FLAGS).encode(), torch.__version__.encode(),
                                     _cpu_flags().encode()])).hexdigest()[:16]
    path = os.environ.get("PATH", "")
    if shutil.which("ninja") is None:  # pip's ninja, beside this interpreter where no venv is activated
        os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), path])
    try:
        return cpp_extension.load(name=f"mpifl_conv_pool_relu_{key}", sources=[str(SOURCE)],
                                  extra_cflags=list(FLAGS), extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # noqa: BLE001 - any failed build means: torch's kernels instead
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]
    finally:
        os.environ["PATH"] = path


def kernels() -> ModuleType:
    """The compiled kernel (built on first call, then cached); raises
    :class:`FusedUnavailable` with the build's first error line where it cannot be built."""
    built = _build()
    if isinstance(built, str):
        raise FusedUnavailable(built)
    return built


def asked(fused_conv: str, batched: str, device: str) -> bool:
    """Whether a run with ``train.fused_conv``, ``train.batched`` on ``device`` (its
    type: cpu, cuda) may take the kernel: not turned off, on the batched path (the
    loop has no grouped layers), on the CPU."""
    return fused_conv != "off" and batched != "off" and device == "cpu"


def fits(conv: nn.Conv2d, pool: tuple, in_shape: tuple[int, ...]) -> bool:
    """Whether the kernel computes ``conv`` followed by the max-pooling of ``pool``
    (:func:`~mpifl.train.grouped.pool_args`) and a ReLU, on a client's inputs of
    ``in_shape`` ``(C, H, W)``."""
    k = conv.kernel_size[0]
    if len(in_shape) != 3 or conv.kernel_size != (k, k) or k > MAX_K or conv.in_channels * k > MAX_ROWS:
        return False
    if conv.stride != (1, 1) or conv.padding != (0, 0) or conv.dilation != (1, 1) or conv.groups != 1:
        return False
    c, h, w = in_shape
    return (c == conv.in_channels and conv.out_channels <= MAX_OUT and h - k + 1 >= 2
            and 2 <= w - k + 1 <= MAX_WIDTH and pool == ((2, 2), (2, 2), (0, 0), (1, 1), False))


class ConvPoolReLU(torch.autograd.Function):
    """``x [m, b, CI, H, W]``, ``w [m, C, CI, K, K]``, ``bias [m, C]`` -> ``[m, b, C,
    H', W']``: every client's ``relu(maxpool2x2(conv(x_i, w_i) + bias_i))``, both
    ends client-major (the next fused layer and the flatten read it so)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:  # noqa: ANN001 - ctx
        m, b, _, h, wd = x.shape
        c, k = w.shape[1], w.shape[3]
        ph, pw = (h - k + 1) // 2, (wd - k + 1) // 2
        x, w, bias = x.contiguous(), w.contiguous(), bias.contiguous()
        out = x.new_empty(m, b, c, ph, pw)
        arg = torch.empty(m, b, ph, pw, c, dtype=torch.uint8)
        kernels().forward(x, w, bias, out, arg)
        ctx.save_for_backward(x, w, out, arg)
        ctx.bias_shape = bias.shape
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple:  # noqa: ANN001
        x, w, out, arg = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        if not (need_x or need_w or need_b):
            return None, None, None
        dx = torch.empty_like(x) if need_x else None
        dw, db = torch.empty_like(w), x.new_empty(ctx.bias_shape)
        kernels().backward(x, w, g.contiguous(), out, arg, dx, dw, db)
        return dx, dw if need_w else None, db if need_b else None
