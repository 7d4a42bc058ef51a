"""A conv net's convolution, its 2x2 max-pooling and ReLU as one C++ kernel for
many clients at once (``train.fused_conv``): the grouped path's layers on the CPU
where they fit (:func:`fits`: both of cnn_dpfl's, 1 -> 4 and 4 -> 12 channels,
5x5, on 28x28 images).

Forward, per client i and sample: ``relu(maxpool2x2(conv(x, W_i) + b_i))``, each
pair of output rows held in registers over the taps and pooled as it is made, so
the convolution's output never goes to memory; the index of each window's first
maximum (torch's choice on ties) is kept, one byte. Backward, from the pooled
gradient ``g``: a window passes its gradient to its first maximum only, and only
where the ReLU's output is not ``<= 0`` (positive, or NaN: a window whose maximum
is NaN passes its gradient on, as torch's ReLU does), so with ``(ay, ax)`` that
maximum's position

    dW_i[o, c, ky, kx] = sum over (sample, window) with not y <= 0 of g[o, window] * x[c, ay + ky, ax + kx]
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
(tests/train/test_train_fused.py), as the grouped path promises. They are not torch's
(other sums; the compiler's fused multiply-adds for ``-march=native``): a run
logs which kernel it took (``conv_kernel``) and a resume keeps it.

The kernel compiles on first use with ``torch.utils.cpp_extension`` (a C++17
compiler and ninja; 25-35 s) into torch's extension cache (``TORCH_EXTENSIONS_DIR``,
default ``~/.cache/torch_extensions``), named by a hash of the source, the flags,
torch's version and this CPU's instruction set, so nodes of another CPU on a
shared home build their own. Ranks that start together wait on one build.

A build is trusted only as far as its digest (:data:`DIGEST`, each output's sha256,
written once a build has loaded): a library the digest does not vouch for (cut
short by a full disk or a killed copy, empty, another machine's, from before
digests) is never loaded, since loading a damaged one can kill the process with
SIGBUS; its outputs are made again (the library alone where the object file is
intact: a link, a second or so), or, in a cache that cannot be written, refused
in one line naming the folder (:func:`damaged`; ``tests/train/test_fused_cache.py``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
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


DIGEST = "mpifl-digest.json"  # beside the build: each output's sha256, written after a complete build
TIMES = "mpifl-times.json"  # beside the build: train.fused_conv=auto's timings, by layer shapes (:func:`timed`)
LOCK = "mpifl.lock"  # held while a build is checked, made and its digest written (torch's own "lock" is torch's)


def _name() -> str:
    """The extension's name: a hash of the source, the flags, torch's version and this CPU's instruction set."""
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), " ".join(FLAGS).encode(), torch.__version__.encode(),
                                     _cpu_flags().encode()])).hexdigest()[:16]
    return f"mpifl_conv_pool_relu_{key}"


def _outputs(folder: Path, name: str) -> list[Path]:
    """What a build leaves that a later load reads: the library and its object file."""
    return [folder / f"{name}.so", folder / f"{SOURCE.stem}.o"]


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def damaged(folder: Path, name: str) -> list[Path]:
    """The outputs of the build in ``folder`` that its digest does not vouch for
    (all of them where the digest is missing or unreadable: a build cut short, a
    cache copied in part, one from before digests); [] for a complete build."""
    try:
        digest = json.loads((folder / DIGEST).read_text())
    except (OSError, ValueError):
        digest = None
    outs = _outputs(folder, name)
    if not isinstance(digest, dict):
        return [p for p in outs if p.exists()] or outs
    return [p for p in outs if digest.get(p.name) is None or _sha256(p) != digest.get(p.name)]


@contextlib.contextmanager
def _held(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder``'s :data:`LOCK` (a second process waits,
    then finds the build complete); nothing where the file system has no flock."""
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
        yield
    finally:
        os.close(fd)  # drops the lock


def _import(folder: Path, name: str) -> ModuleType:
    """The library of a build its digest vouches for, without torch's build step
    (which would write in ``folder``: a read-only cache loads too)."""
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(folder: Path, name: str) -> ModuleType:
    """Build with ``torch.utils.cpp_extension`` in ``folder`` (what ninja finds done is
    kept) and write the digest of what it made."""
    from torch.utils import cpp_extension

    bad = damaged(folder, name)
    for p in bad:  # ninja would take a damaged output for a finished one; it makes these again
        p.unlink(missing_ok=True)
    path = os.environ.get("PATH", "")
    if shutil.which("ninja") is None:  # pip's ninja, beside this interpreter where no venv is activated
        os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), path])
    try:
        module = cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=list(FLAGS),
                                    extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)
    finally:
        os.environ["PATH"] = path
    from mpifl.paths import atomic_write_text

    # loaded, so complete: vouched for from now on (a digest that cannot be written costs the next run a link)
    with contextlib.suppress(OSError):
        atomic_write_text(folder / DIGEST, json.dumps({p.name: _sha256(p) for p in _outputs(folder, name)}))
    return module


def _one_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


@functools.cache
def _folder() -> Path | str:
    """The build's folder (torch's choice, made if missing), or why it cannot be made."""
    # its import warns where no CUDA runtime is found: nothing here needs one
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils import cpp_extension

    try:
        return Path(cpp_extension._get_build_directory(_name(), verbose=False))
    except OSError as e:
        return f"its cache folder cannot be made ({_one_line(e)}): set TORCH_EXTENSIONS_DIR to a folder you can write"


@functools.cache
def _build() -> ModuleType | str:
    name = _name()
    folder = _folder()
    if isinstance(folder, str):
        return folder
    try:
        if not damaged(folder, name):
            return _import(folder, name)
        with _held(folder):
            if not damaged(folder, name):  # another process built it while this one waited
                return _import(folder, name)
            return _compile(folder, name)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return (f"its cache {str(folder)!r} holds no complete build and cannot be written ({e.strerror}): "
                    f"delete that folder where you can, or set TORCH_EXTENSIONS_DIR to a folder you can write")
        return f"the build in {str(folder)!r} failed ({_one_line(e)})"
    except Exception as e:  # noqa: BLE001 - any failed build means: torch's kernels instead
        return f"the build in {str(folder)!r} failed ({_one_line(e)})"


@functools.cache
def compiler() -> str:
    """The first line of ``--version`` of the compiler torch builds with (``CXX``,
    else ``c++``): its code generation is part of the kernel's bits."""
    import subprocess

    cxx = os.environ.get("CXX", "c++")
    try:
        res = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return f"{cxx} (no version)"
    lines = res.stdout.strip().splitlines()
    return lines[0][:120] if res.returncode == 0 and lines else f"{cxx} (no version)"


def timed(key: str, measure: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """``(fused, torch)`` seconds of the layers ``key`` names (their shapes, batch,
    clients, threads), as ``measure`` times them: once per build, which is once per
    source, flags, torch and CPU kind, then read from :data:`TIMES` beside the build,
    so every run of one machine kind takes the same kernel under
    ``train.fused_conv=auto`` whatever the load when it starts (a timing near a tie
    would otherwise flip from launch to launch, and the kernel moves the bits). A
    cache that cannot be written costs a timing a run."""
    folder = _folder()
    if isinstance(folder, str):
        return measure()
    path = folder / TIMES

    def cached() -> tuple[dict, tuple[float, float] | None]:
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        got = table.get(key) if isinstance(table, dict) else None
        ok = isinstance(got, list) and len(got) == 2 and all(isinstance(v, float) and v >= 0 for v in got)
        return (table if isinstance(table, dict) else {}), ((got[0], got[1]) if ok else None)

    _, got = cached()
    if got is not None:
        return got
    from mpifl.paths import atomic_write_text

    try:
        with _held(folder):  # the ranks of a node time one after another, the first for all
            table, got = cached()
            if got is not None:
                return got
            got = measure()
            table[key] = [float(got[0]), float(got[1])]
            with contextlib.suppress(OSError):
                atomic_write_text(path, json.dumps(table, indent=1, sort_keys=True) + "\n")
            return got
    except OSError:  # no lock file there (a read-only cache)
        return measure()


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
