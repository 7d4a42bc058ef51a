"""The training package's small pieces: the layout's slices, the write-back of
selected rows, and the forms of the one loss.

Bits: the exact comparisons are of copies (flattened and unflattened rows,
written-back rows) and of ``per_sample_loss`` against the ``F.cross_entropy`` call
it makes, on the same shapes in one process: any CPU. The loss's two forms agree
within tolerances."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mpifl.train import Layout, cross_entropy, loss_acc, per_sample_loss, read_rows, rows_selector, write_back


def test_layout_slices_tile_the_row_and_every_walk_uses_them():
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(12, 4))
    lay = Layout(model)
    ends = [(p.cols.start, p.cols.stop) for p in lay.params]
    assert ends[0][0] == 0 and ends[-1][1] == lay.P and all(a[1] == b[0] for a, b in zip(ends, ends[1:]))
    assert [p.size for p in lay.params] == [t.numel() for t in model.parameters()]
    assert lay.B == sum(b.numel() for b in model.buffers() if b.is_floating_point())
    flat = lay.flatten(model)
    for (name, t), v in zip(model.named_parameters(), lay.unflatten(flat).values()):
        assert torch.equal(v, t.detach()), name
    rows = torch.randn(5, lay.P)
    out = torch.zeros_like(rows)
    lay.write(out, {k: v.clone() for k, v in lay.parts(rows).items()})
    assert torch.equal(out, rows)
    assert lay.slices(["3.bias"]) == [lay.params[-1].cols]
    bufs = torch.randn(5, lay.B)
    for i in range(5):
        for k, v in lay.buffer_parts(bufs).items():
            assert torch.equal(v[i], lay.unflatten_buffers(bufs[i])[k])


def test_write_back_scatters_copies_and_leaves_views_alone():
    g = torch.Generator().manual_seed(0)
    for strided in (False, True):  # rows of a [6, 3] block inside a wider tensor: the column views of a row
        for rows in (np.array([1, 2, 3]), np.array([0, 2, 5])):
            base = torch.randn(6, 5, generator=g)
            dst = base[:, 1:4] if strided else base[:, :3].contiguous()
            before, outside = dst.clone(), base[:, [0, 4]].clone()
            sel = rows_selector(rows, "cpu")
            assert isinstance(sel, slice) == (rows[1] - rows[0] == 1)
            p = read_rows(dst, sel)
            assert torch.equal(p, before[torch.as_tensor(rows)]) and (p.data_ptr() == dst[rows[0]].data_ptr()) == \
                isinstance(sel, slice)  # a view of a slice, a copy otherwise
            p += torch.arange(3.0)[:, None] + 1  # in place on a view, on a copy otherwise
            write_back(dst, sel, p)
            assert torch.equal(dst[torch.as_tensor(rows)], p)
            others = np.setdiff1d(np.arange(6), rows)
            assert torch.equal(dst[others], before[others])
            assert torch.equal(base[:, [0, 4]], outside)  # the columns outside the block are untouched


@pytest.mark.parametrize("bias", [False, True])
def test_the_loss_forms_agree_and_the_closed_form_gradient_is_autograds(bias):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 7, 5, generator=g, requires_grad=True)
    y = torch.randint(0, 5, (3, 7), generator=g)
    w = (torch.rand(3, 7, generator=g) > 0.3).float()
    b = torch.randn(3, 5, generator=g) if bias else None
    weighted = cross_entropy(z, y, w, bias=b)
    (grad,) = torch.autograd.grad(weighted.sum(), z)
    closed, dz = cross_entropy(z.detach(), y, w, bias=b, grad=True)
    torch.testing.assert_close(closed, weighted.detach())
    torch.testing.assert_close(dz, grad)
    zb = z.detach() + (b[:, None] if bias else 0)
    for i in range(3):  # one client's batch: its weighted mean is the plain mean of its real samples
        keep = w[i] > 0
        plain = cross_entropy(z.detach()[i][keep], y[i][keep], bias=None if b is None else b[i])
        torch.testing.assert_close(plain, weighted[i].detach())
        torch.testing.assert_close(plain, F.cross_entropy(zb[i][keep], y[i][keep]))
        # a weighted sum over a given count n (per-sample weights over the batch size)
        v = torch.rand(int(keep.sum()), generator=g)
        want = (F.cross_entropy(zb[i][keep], y[i][keep], reduction="none") * v).sum() / 4
        torch.testing.assert_close(cross_entropy(z.detach()[i][keep], y[i][keep], v, n=4,
                                                 bias=None if b is None else b[i]), want)
    loss, acc = loss_acc(z.detach(), y, w)  # evaluation: the same weighted form, no bias
    torch.testing.assert_close(torch.from_numpy(loss), cross_entropy(z.detach(), y, w))
    for i in range(3):
        keep = w[i] > 0
        assert acc[i] == pytest.approx((z.detach()[i][keep].argmax(-1) == y[i][keep]).float().mean().item())


def test_per_sample_loss_is_torchs_in_both_forms():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2, 4, 9, 6, generator=g)
    y = torch.randint(0, 6, (2, 4, 9), generator=g)
    rows = F.cross_entropy(z.reshape(-1, 6), y.reshape(-1), reduction="none").view(2, 4, 9)
    assert torch.equal(per_sample_loss(z, y), rows)  # the row form, bit for bit
    nd = per_sample_loss(z[0].transpose(1, 2), y[0], dim=1)  # [m, C, n]: torch's N-d form
    assert torch.equal(nd, F.cross_entropy(z[0].transpose(1, 2), y[0], reduction="none"))
    torch.testing.assert_close(nd, rows[0])  # the same losses, up to the order of additions
