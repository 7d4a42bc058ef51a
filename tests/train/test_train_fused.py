"""The fused first layer (mpifl.train.fused): torch's convolution, max-pooling and
ReLU to the bit where every sum is exact, up to rounding elsewhere, and a client's
bits whatever clients share its call. The kernel is built by the ``fused_kernel``
fixture (tests/conftest.py), not at import: collecting compiles nothing.

Bits: every bitwise comparison is of two calls in one process on one CPU, at the
thread counts each test names: the kernel against torch's where every sum is exact
(small integers in floats, the same on any CPU), a client alone against in company
and on 1 against 2 threads (the kernel's own order of sums), a kernel kept on resume
against a straight run. The kernel is compiled for the CPU it runs on
(``-march=native``): its bits are that x86 kind's (AVX2, AVX-512), not another's."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_clients import make_conv
from torch import nn

from mpifl import models
from mpifl.errors import ConfigError
from mpifl.train import fused
from mpifl.train.grouped import _forward, fuse, grouped_convnet, grouped_loss, pool_args, unfused

TIMED = fused.timed  # the real timing: the fused_kernel fixture times the fused kernel the faster


def _reference(x, w, b, g):
    """Per client, torch's modules: relu(max_pool(conv(x) + b)), and the input,
    weight and bias gradients of <out, g>."""
    res = []
    for i in range(x.shape[0]):
        xi, wi, bi = (v[i].clone().requires_grad_(True) for v in (x, w, b))
        out = F.relu(F.max_pool2d(F.conv2d(xi, wi, bi), 2))
        res.append([out.detach(), *torch.autograd.grad((out * g[i]).sum(), [xi, wi, bi])])
    return [torch.stack(r) for r in zip(*res)]


def _fused(x, w, b, g, need_x=True):
    xl, wl, bl = x.clone().requires_grad_(need_x), w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    out = fused.ConvPoolReLU.apply(xl, wl, bl)
    grads = torch.autograd.grad((out * g).sum(), [xl, wl, bl] if need_x else [wl, bl])
    return [out.detach(), *([] if need_x else [None]), *grads]


CASES = [(1, 4, 5, 28), (4, 12, 5, 12), (1, 8, 3, 10), (3, 6, 5, 32), (6, 16, 5, 14), (1, 1, 5, 13), (3, 2, 3, 34)]


@pytest.mark.usefixtures("fused_kernel")
@pytest.mark.parametrize("ci,c,k,hw", CASES)
def test_exact_sums_give_torchs_bits_ties_included(ci, c, k, hw):
    """Small integers make every sum exact in float32, in any order: the kernel's
    outputs and gradients must then be torch's exactly, and its pooling must pass
    each window's gradient to the same (first) of several equal maxima."""
    gen = torch.Generator().manual_seed(ci * 100 + c * 10 + k)
    m, b = 3, 4

    def ints(*shape):
        return torch.randint(-2, 3, shape, generator=gen).float()

    x, w, bias = ints(m, b, ci, hw, hw), ints(m, c, ci, k, k), ints(m, c)
    ph = (hw - k + 1) // 2
    g = ints(m, b, c, ph, ph)
    got, ref = _fused(x, w, bias, g), _reference(x, w, bias, g)
    assert (ref[0] == 0).float().mean() < 0.9, "a case where the ReLU passes too little to test the gradients"
    for name, a, r in zip(["out", "dx", "dw", "db"], got, ref):
        assert torch.equal(a, r), (name, (a - r).abs().max().item())
    for a, r in zip(_fused(x, w, bias, g, need_x=False)[2:], ref[2:]):  # a first layer's: no input gradient
        assert torch.equal(a, r)


@pytest.mark.usefixtures("fused_kernel")
def test_a_nan_passes_through_the_pooling_and_relu_as_in_torch():
    """torch's max-pooling takes a NaN as the window's maximum and its ReLU keeps it:
    a diverged client must show NaN in its logits, not zeros."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randint(-2, 3, (2, 3, 1, 12, 12), generator=gen).float()
    x[0, 1, 0, 4, 4] = float("nan")
    x[1, 2, 0, 0, 0] = float("inf")
    w, bias = torch.randint(-2, 3, (2, 4, 1, 3, 3), generator=gen).float(), torch.zeros(2, 4)
    g = torch.ones(2, 3, 4, 5, 5)
    got, ref = _fused(x, w, bias, g, need_x=False), _reference(x, w, bias, g)
    assert got[0].isnan().any() and torch.equal(got[0].isnan(), ref[0].isnan())
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=0, equal_nan=True)


@pytest.mark.usefixtures("fused_kernel")
@pytest.mark.parametrize("ci,c,k,hw", CASES[:2])
def test_random_floats_agree_with_torch_up_to_rounding(ci, c, k, hw):
    torch.manual_seed(0)
    m, b = 5, 7
    x, w, bias = torch.randn(m, b, ci, hw, hw), torch.randn(m, c, ci, k, k) * 0.2, torch.randn(m, c) * 0.1
    ph = (hw - k + 1) // 2
    g = torch.randn(m, b, c, ph, ph)
    for name, a, r in zip(["out", "dx", "dw", "db"], _fused(x, w, bias, g), _reference(x, w, bias, g)):
        assert (a - r).abs().max() <= 1e-5 * r.abs().max(), name


@pytest.mark.usefixtures("fused_kernel")
@pytest.mark.parametrize("threads", [1, 2])
def test_a_clients_bits_do_not_depend_on_its_company_or_the_threads(threads):
    torch.manual_seed(2)
    m, b = 9, 6
    x, w, bias = torch.randn(m, b, 4, 12, 12), torch.randn(m, 12, 4, 5, 5) * 0.2, torch.randn(m, 12) * 0.1
    g = torch.randn(m, b, 12, 4, 4)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        full = _fused(x, w, bias, g)
        for k in (1, 2, 5):
            part = _fused(x[m - k:], w[m - k:], bias[m - k:], g[m - k:])
            assert all(torch.equal(a, c[m - k:]) for a, c in zip(part, full)), k
        torch.set_num_threads(3 - threads)
        other = _fused(x, w, bias, g)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, c) for a, c in zip(other, full))


def test_which_layers_fit():
    pool = pool_args(nn.MaxPool2d(2))
    assert fused.fits(nn.Conv2d(1, 4, 5), pool, (1, 28, 28))
    assert fused.fits(nn.Conv2d(3, 6, 5), pool, (3, 32, 32))
    assert fused.fits(nn.Conv2d(4, 12, 5), pool, (4, 12, 12))
    assert not fused.fits(nn.Conv2d(1, 64, 5), pool, (1, 28, 28))  # LeNet's: too many outputs
    assert not fused.fits(nn.Conv2d(1, 4, 5, padding=1), pool, (1, 28, 28))
    assert not fused.fits(nn.Conv2d(1, 4, 5), pool_args(nn.MaxPool2d(3)), (1, 28, 28))
    assert not fused.fits(nn.Conv2d(1, 4, 5), pool, (1, 64, 64))  # wider than four vectors
    assert not fused.fits(nn.Conv2d(7, 4, 5), pool, (7, 28, 28))  # 35 patch rows
    assert not fused.fits(nn.Conv2d(1, 17, 5), pool, (1, 28, 28))
    assert not fused.fits(nn.Conv2d(1, 4, 9), pool, (1, 28, 28))  # a patch row wider than a vector
    ops = grouped_convnet(models.cnn_dpfl((1, 28, 28), 10))
    head = fuse(ops, (1, 28, 28))
    assert head is not None and [op[0] for op in head[:3]] == ["fused", "fused", "flatten"] and unfused(head) == ops
    assert [op[0] for op in fuse(grouped_convnet(models.cnn_dpfl((3, 32, 32), 10)), (3, 32, 32))[:2]] == ["fused"] * 2
    assert fuse(grouped_convnet(models.lenet((1, 28, 28), 10)), (1, 28, 28)) is None


@pytest.mark.usefixtures("fused_kernel")
def test_the_fused_net_computes_the_torch_nets_function():
    torch.manual_seed(3)
    model = models.cnn_dpfl((1, 28, 28), 10)
    ops = grouped_convnet(model)
    head = fuse(ops, (1, 28, 28))
    m = 4
    p = {k: torch.randn(m, *v.shape) * 0.1 for k, v in model.named_parameters()}
    x, y, w = torch.randn(m, 6, 1, 28, 28), torch.randint(0, 10, (m, 6)), torch.ones(m, 6)
    res = []
    for o in (ops, head):
        leaves = {k: v.clone().requires_grad_(True) for k, v in p.items()}
        loss = grouped_loss(o, leaves, x, y, w)
        res.append([loss.detach(), *torch.autograd.grad(loss.sum(), list(leaves.values()))])
        with torch.no_grad():
            res[-1].append(_forward(o, p, x))
    for a, r in zip(res[1], res[0]):
        assert (a - r).abs().max() <= 1e-5 * r.abs().max() + 1e-7


def _clients(batched="on", fused_conv="auto"):
    return make_conv(batched, **{"train.fused_conv": fused_conv})  # 1 -> 4 channels, 3x3, pooled: it fits


@pytest.mark.usefixtures("fused_kernel")
def test_clients_take_the_kernel_where_it_fits_and_builds(monkeypatch):
    assert _clients().conv_kernel == "fused"
    assert _clients(fused_conv="off").conv_kernel == "torch"
    assert _clients(batched="off").conv_kernel == "torch"  # the loop has no grouped layer to fuse
    assert make_conv("on", bn=True).conv_kernel is None  # BatchNorm: no grouped path at all
    monkeypatch.setattr(fused, "_build", lambda: "CalledProcessError: no compiler")
    assert _clients().conv_kernel == "torch"
    alone = _clients(fused_conv="on")  # refused where the ranks settle on one kernel (runtime.setup)
    with pytest.raises(ConfigError, match=r"train\.fused_conv=on .* on rank\(s\) 0 of 1 \(.*no compiler\)"):
        alone.agree_conv_kernel([alone.conv_unavailable])


def _trained(c) -> torch.Tensor:
    local = np.arange(c.n)
    for t in range(2):
        c.train(local, 1, t)
    return c.params.clone()


@pytest.mark.usefixtures("fused_kernel")
def test_a_resume_keeps_the_kernel_its_run_took(monkeypatch):
    fused_run, torch_run = _trained(_clients()), _trained(_clients(fused_conv="off"))
    assert not torch.equal(fused_run, torch_run)  # other sums: the check below can tell the kernels apart
    resumed = _clients()
    resumed.keep_conv_kernel("torch")
    assert resumed.conv_kernel == "torch" and torch.equal(_trained(resumed), torch_run)
    monkeypatch.setattr(fused, "_build", lambda: "CalledProcessError: no compiler")
    with pytest.raises(ConfigError, match=r"took the fused conv kernel .*\(.*no compiler\): resume where it builds"):
        _clients().keep_conv_kernel("fused")


def test_auto_times_each_shape_once_per_build_and_reads_it_back(tmp_path, monkeypatch):
    """``fused.timed``: a key is measured once and then read from the file beside
    the build, whatever the next measure would say; another key is measured apart; a
    damaged file is measured again; a folder that cannot be written measures every
    time and fails nothing."""
    monkeypatch.setattr(fused, "_folder", lambda: tmp_path)
    calls = []

    def measure(value):
        return lambda: calls.append(value) or (value, 2 * value)

    assert TIMED("a", measure(0.5)) == (0.5, 1.0)
    assert TIMED("a", measure(9.0)) == (0.5, 1.0) and calls == [0.5]  # cached: the second timing never ran
    assert TIMED("b", measure(3.0)) == (3.0, 6.0) and calls == [0.5, 3.0]
    assert json.loads((tmp_path / fused.TIMES).read_text()) == {"a": [0.5, 1.0], "b": [3.0, 6.0]}
    (tmp_path / fused.TIMES).write_text("{not json")
    assert TIMED("a", measure(4.0)) == (4.0, 8.0) and calls[-1] == 4.0
    monkeypatch.setattr(fused, "_folder", lambda: "its cache folder cannot be made")
    assert TIMED("a", measure(5.0)) == (5.0, 10.0) and calls[-1] == 5.0


@pytest.mark.usefixtures("fused_kernel")
def test_measuring_the_kernels_leaves_the_clients_as_they_were(monkeypatch):
    """``Clients.measure_conv`` times both kernels on random inputs of its own: the
    clients' rows, counters and the training after it are those of clients never
    measured."""
    monkeypatch.setattr(fused, "timed", lambda key, measure: (*measure(), key))
    c = _clients()
    before = c.params.clone(), c.steps.copy(), c.updates
    tf, tt, key = c.measure_conv(reps=1)
    assert tf > 0 and tt > 0 and key.startswith("conv (1, ") and "clients 64 batch " in key
    assert torch.equal(c.params, before[0]) and np.array_equal(c.steps, before[1]) and c.updates == before[2]
    assert c.conv_kernel == "fused" and torch.equal(_trained(c), _trained(_clients()))


@pytest.mark.usefixtures("fused_kernel")
def test_a_resume_of_a_fused_run_keeps_the_kernel_auto_timed_slower_here():
    """Where auto found torch's kernels faster (the fused layers built, not taken), a
    checkpoint of a fused run continues on the fused kernel: a resume keeps its bits."""
    c = _clients()
    c.keep_conv_kernel("torch")  # what runtime.setup does when the fused kernel is timed slower
    assert c.conv_kernel == "torch"
    c.keep_conv_kernel("fused")
    assert c.conv_kernel == "fused" and torch.equal(_trained(c), _trained(_clients()))


@pytest.mark.usefixtures("fused_kernel")
def test_a_nan_window_passes_its_gradient_as_torchs_kernels_do():
    """A channel whose bias is NaN: every window's maximum is NaN, torch's pooling
    takes the last NaN of each window and its ReLU passes the gradient there
    (``NaN <= 0`` is false), so the weight, bias and input gradients stay finite
    and are the sums over those positions. The kernel must give torch's bits."""
    gen = torch.Generator().manual_seed(7)
    m, b, ci, c, k, hw = 2, 3, 2, 4, 5, 12

    def ints(*shape):
        return torch.randint(-2, 3, shape, generator=gen).float()

    x, w, bias = ints(m, b, ci, hw, hw), ints(m, c, ci, k, k), ints(m, c)
    bias[1, 2] = float("nan")
    g = ints(m, b, c, (hw - k + 1) // 2, (hw - k + 1) // 2)
    got, ref = _fused(x, w, bias, g), _reference(x, w, bias, g)
    assert ref[0][1, :, 2].isnan().all() and ref[3][1, 2] != 0, "no NaN window passing a gradient: tests nothing"
    assert torch.equal(got[0].isnan(), ref[0].isnan())
    assert torch.equal(got[0].nan_to_num(0.0), ref[0].nan_to_num(0.0))
    for name, a, r in zip(["dx", "dw", "db"], got[1:], ref[1:]):
        assert r.isfinite().all() and torch.equal(a, r), name
