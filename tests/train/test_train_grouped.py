"""The grouped conv-net path (mpifl.train.grouped): vmap's results up to the order of
its sums, and a client's bits whatever clients share its call.

Bits: every bitwise comparison here is of two calls in one process: the same CPU
(its torch capability and oneDNN's choice of kernels) and the same thread count (the
``threads`` parameter, or torch's default where there is none); docs/reliability.md
says which of them hold on other CPUs."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_clients import make_conv
from torch import nn
from torch.func import functional_call, vmap

from mpifl import models
from mpifl.train import fused
from mpifl.train.grouped import (
    _max_pool,
    column_sums,
    fuse,
    grouped_convnet,
    grouped_forward,
    grouped_loss,
    pool_args,
    shared_forward,
)
from mpifl.train.loss import cross_entropy


def _padded_net(in_shape, n_classes):
    """Padding, stride, dilation, a ceil-mode pool, a bias-free conv, ReLU on both sides of the flatten."""
    c = in_shape[0]
    return nn.Sequential(nn.Conv2d(c, 3, 3, padding=1, bias=False), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         nn.Conv2d(3, 5, 3, stride=2, dilation=2), nn.MaxPool2d(2, ceil_mode=True), nn.ReLU(),
                         nn.Flatten(), nn.Linear(5 * 3 * 3, 7), nn.ReLU(), nn.Linear(7, n_classes, bias=False))


NETS = {"cnn_dpfl": models.cnn_dpfl, "lenet": models.lenet, "cnn2": models.cnn2, "padded": _padded_net,
        "cnn_dpfl-fused": models.cnn_dpfl}


def _ops(net: str, model: nn.Module, in_shape: tuple[int, ...]):
    """The grouped path's layers; "-fused": its convolutions in mpifl.train.fused's kernel."""
    ops = grouped_convnet(model)
    if net.endswith("-fused"):
        if isinstance(fused._build(), str):
            pytest.skip("the fused kernel does not build here")
        ops = fuse(ops, in_shape)
        assert ops is not None and ops[0][0] == "fused"
    return ops


def _case(net: str, m: int, seed: int = 0):
    torch.manual_seed(seed)
    in_shape = (3, 32, 32) if net == "padded" else (1, 28, 28)
    model = NETS[net](in_shape, 10)
    p = {k: torch.randn(m, *v.shape) * 0.1 for k, v in model.named_parameters()}
    x = torch.randn(m, 5, *in_shape)
    y = torch.randint(0, 10, (m, 5))
    w = torch.ones(m, 5)
    w[0, 3:] = 0  # padding, as a client's short last batch
    return model, p, x, y, w


def _close(a: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5) -> bool:
    """Equal up to float32 rounding of sums in another order: every entry within
    ``rel`` of the largest entry (a small entry of a long sum has no precision of its own)."""
    return bool((a - ref).abs().max() <= rel * ref.abs().max() + 1e-7)


def _run(ops, p: dict, x, y, w, bias=None) -> list[torch.Tensor]:
    """Logits, losses and every parameter's gradient of the grouped path."""
    leaves = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    loss = grouped_loss(ops, leaves, x, y, w, bias)
    grads = torch.autograd.grad(loss.sum(), list(leaves.values()))
    with torch.no_grad():
        logits = grouped_forward(ops, p, x)
    return [logits, loss.detach(), *grads]


@pytest.mark.parametrize("m", [2, 3])
@pytest.mark.parametrize("net", list(NETS))
def test_logits_loss_and_gradients_are_vmaps_up_to_rounding(net, m):
    """The same function as the modules under vmap: channels-last kernels and the
    bias gradients' own sums change only the order of additions."""
    model, p, x, y, w = _case(net, m)
    ops = _ops(net, model, x.shape[2:])
    assert ops is not None
    for b in (None, torch.randn(m, 10)):
        leaves = {k: v.clone().requires_grad_(True) for k, v in p.items()}
        if b is None:
            ref = vmap(lambda q, xi, yi, wi: cross_entropy(functional_call(model, q, (xi,)), yi, wi))(leaves, x, y, w)
        else:
            ref = vmap(lambda q, xi, yi, wi, bi: cross_entropy(functional_call(model, q, (xi,)), yi, wi, bias=bi))(
                leaves, x, y, w, b)
        ref_g = torch.autograd.grad(ref.sum(), list(leaves.values()))
        with torch.no_grad():
            ref_logits = vmap(lambda q, xi: functional_call(model, q, (xi,)))(p, x)
        got = _run(ops, p, x, y, w, b)
        for name, a, c in zip(["logits", "loss", *leaves], got, [ref_logits, ref.detach(), *ref_g]):
            assert _close(a, c), (name, (a - c).abs().max().item())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("net,shape,m", [("cnn_dpfl", (1, 28, 28), 30), ("cnn_dpfl", (3, 32, 32), 12),
                                         ("cnn_dpfl-fused", (1, 28, 28), 30), ("cnn_dpfl-fused", (3, 32, 32), 12),
                                         ("lenet", (1, 28, 28), 9), ("padded-wide", (3, 32, 32), 8)])
def test_a_clients_bits_do_not_depend_on_how_many_share_the_call(net, shape, m, threads):
    """Logits, loss and gradients of the last k clients alone are those they get
    among all m, for every k (odd widths included, where torch's and oneDNN's
    reductions over a channels-last tensor change their order)."""
    torch.manual_seed(1)
    if net == "padded-wide":
        # the padded net's convolutions before linear layers 64 wide: bmm's kernels
        # for its 45- and 7-wide ones change their bits with the parity of m, with
        # the grouped convolutions or without (bench/README.md, Performance IV)
        model = nn.Sequential(*list(_padded_net(shape, 10))[:7], nn.Linear(45, 64), nn.ReLU(), nn.Linear(64, 10))
    else:
        model = NETS[net](shape, 10)
    ops = _ops(net, model, shape)
    p = {k: torch.randn(m, *v.shape) * 0.1 for k, v in model.named_parameters()}
    x, y, w = torch.randn(m, 6, *shape), torch.randint(0, 10, (m, 6)), torch.ones(m, 6)
    w[-1, 4:] = 0
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        full = _run(ops, p, x, y, w)
        for k in range(1, m):
            part = _run(ops, {n: v[m - k:] for n, v in p.items()}, x[m - k:], y[m - k:], w[m - k:])
            for name, a, c in zip(["logits", "loss", *p], part, full):
                assert torch.equal(a, c[m - k:]), (k, name)
    finally:
        torch.set_num_threads(before)


def test_linear_weight_gradients_come_in_the_weights_own_layout():
    """The optimizer adds each gradient block to the rows' ``[m, out, in]`` view: a
    transposed block (autograd's ``bmm`` backward) made it walk across the rows."""
    model, p, x, y, w = _case("cnn_dpfl", 3)
    got = _run(grouped_convnet(model), p, x, y, w)[2:]
    linear = [g for v, g in zip(p.values(), got) if v.dim() == 3]  # [m, out, in]
    assert len(linear) == 3 and all(g.is_contiguous() for g in linear)


def test_column_sums_have_the_same_bits_at_every_width():
    torch.manual_seed(0)
    g = torch.randn(1001, 37)
    full = column_sums(g)
    torch.testing.assert_close(full, g.double().sum(0).float(), rtol=1e-5, atol=1e-4)
    for k in (1, 2, 5, 16, 36):
        assert torch.equal(column_sums(g[:, :k].contiguous()), full[:k])
        assert torch.equal(column_sums(g[:, -k:]), full[-k:])  # strided too
    assert torch.equal(column_sums(g[:1]), g[0])


@pytest.mark.parametrize("net", list(NETS))
def test_one_client_computes_what_it_computes_among_others(net):
    """A client alone (m = 1) gets the logits, loss and gradients it gets as the first
    of 2 or 3: not torch's ungrouped convolution, whose weight gradients differ in
    the last bits."""
    model, p, x, y, w = _case(net, 3)
    ops = _ops(net, model, x.shape[2:])

    def first(m: int):
        leaves = {k: v[:m].clone().requires_grad_(True) for k, v in p.items()}
        loss = grouped_loss(ops, leaves, x[:m], y[:m], w[:m])
        grads = torch.autograd.grad(loss.sum(), list(leaves.values()))
        with torch.no_grad():
            logits = grouped_forward(ops, {k: v[:m] for k, v in p.items()}, x[:m])
        return [logits[0], loss[0], *(g[0] for g in grads)]

    alone = first(1)
    for m in (2, 3):
        assert all(torch.equal(a, b) for a, b in zip(alone, first(m))), m
    ungrouped = {k: v[:1].clone().requires_grad_(True) for k, v in p.items()}
    ref = vmap(lambda q, xi, yi, wi: cross_entropy(functional_call(model, q, (xi,)), yi, wi))(ungrouped, x[:1], y[:1],
                                                                                              w[:1])
    ref_g = torch.autograd.grad(ref.sum(), list(ungrouped.values()))
    assert not all(torch.equal(a[0], b) for a, b in zip(ref_g, alone[2:]))  # what the padding is for


def _shared_case(net: str):
    """A net, one model's parameters ``one`` and its grouped ops, and samples ``flat``."""
    torch.manual_seed(3)
    in_shape = (3, 32, 32) if net == "padded" else (1, 28, 28)
    model = NETS[net](in_shape, 10)
    one = {k: v.detach() * 3 for k, v in model.named_parameters()}
    flat = torch.randn(600 if net != "cnn2" else 200, *in_shape)
    return model, one, _ops(net, model, in_shape), flat  # a fused layer runs as its three


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("net", list(NETS))
def test_one_shared_model_evaluates_to_its_modules_bits_on_the_same_thread_count(net, threads):
    """The modules' own bits (the same torch calls on the same CPU with the same
    threads), but for a one-channel first layer of up to 4 outputs (cnn_dpfl's),
    which runs depthwise: there the modules' result up to rounding."""
    model, one, ops, flat = _shared_case(net)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            got, ref = shared_forward(ops, one, flat), functional_call(model, one, (flat,))
        assert torch.equal(got, ref) if not net.startswith("cnn_dpfl") else _close(got, ref)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("net", [n for n in NETS if n != "padded"])
def test_a_samples_logits_barely_depend_on_the_samples_beside_it(net, threads):
    """A sample's logits among tens and hundreds of others (how many clients a rank
    evaluates at once) are those it gets in another batch up to rounding. Bit for
    bit on the AVX2 and AMD AVX-512 CPUs measured, not on an Intel AVX-512 one
    (LeNet on 2 threads), where oneDNN's convolutions and the GEMMs take other
    kernels with the batch size: docs/reliability.md, "Not guaranteed". A batch of a
    few samples takes other GEMM kernels on every CPU."""
    _, one, ops, flat = _shared_case(net)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            got = shared_forward(ops, one, flat)
            for a, b in ((0, 64), (17, 117), (100, 200)):
                assert _close(shared_forward(ops, one, flat[a:b]), got[a:b]), (a, b)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
def test_one_models_samples_folded_into_channels_keep_the_lone_models_bits(threads):
    """Evaluation of one model folds samples into the channels of its one-channel
    first convolution (:func:`_folded_depthwise`): every sample's logits are those of
    that model's own depthwise convolution (the repeat of one client), zero-filled
    last image or not."""
    from mpifl.train import grouped

    torch.manual_seed(4)
    model = models.cnn_dpfl((1, 28, 28), 10)
    ops = grouped_convnet(model)
    one = {k: v.detach() * 2 for k, v in model.named_parameters()}
    mod, pool = ops[0][3], ops[1][1]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            for n in (1, 15, 16, 17, 130):
                x = torch.randn(n, 1, 28, 28)
                lone = grouped.repeated_depthwise(x.contiguous(memory_format=torch.channels_last), one["0.weight"],
                                                  one["0.bias"], mod.stride, mod.padding, mod.dilation, 1)
                ref = _max_pool(lone, pool)
                got = grouped._folded_depthwise(x, one["0.weight"], one["0.bias"], mod, pool)
                assert got.is_contiguous() and torch.equal(got, ref), n
                assert torch.equal(grouped._folded_depthwise(x, one["0.weight"], one["0.bias"], mod, None), lone)
    finally:
        torch.set_num_threads(before)


def test_one_models_evaluation_skips_the_padding_and_keeps_the_bits():
    """Clients of unequal splits: one model's loss and accuracy per client, its
    padding never evaluated, are those of the padded batch."""
    from mpifl.train.evaluation import shared_logits, split_index
    from mpifl.train.loss import loss_acc
    from mpifl.train.plan import gather

    c = _hosted_clients(list(range(6)), "cnn_dpfl")
    row = c.params[1]
    idx = split_index(c, np.arange(6), "test")
    x, y, w = gather(c, idx)
    assert (w == 0).any()  # padding there is
    loss, acc = loss_acc(shared_logits(c, row, x, np.arange(6)), y, w)
    got = c.evaluate("test", row)
    assert np.array_equal(got[0], loss) and np.array_equal(got[1], acc)


@pytest.mark.parametrize("pool", [nn.MaxPool2d(2), nn.MaxPool2d(3, 2, 1), nn.MaxPool2d(2, ceil_mode=True),
                                  nn.MaxPool2d(3, 1, 1, dilation=2)], ids=["2", "3s2p1", "ceil", "dilated"])
def test_pooling_keeps_torchs_values_and_gradients_with_ties(pool):
    """ReLU outputs rounded to one decimal: windows full of equal maxima, zero
    and positive, where a pooling that picked another maximum would route the
    gradient elsewhere."""
    torch.manual_seed(0)
    h = F.relu(torch.randn(3, 6, 13, 13)).round(decimals=1).requires_grad_(True)
    ref = pool(h)
    got = _max_pool(h, pool_args(pool))
    assert torch.equal(got, ref) and got.is_contiguous()
    g = torch.randn_like(ref)
    ref_g = torch.autograd.grad(ref, h, g)[0]
    assert torch.equal(torch.autograd.grad(got, h, g)[0], ref_g)
    # the grouped path pools channels-last tensors with torch's own kernel: the same
    # maxima, the gradient to the same (first) entry of a tie
    hc = h.detach().contiguous(memory_format=torch.channels_last).requires_grad_(True)
    cl = F.max_pool2d(hc, *pool_args(pool))
    assert torch.equal(cl, ref)
    assert torch.equal(torch.autograd.grad(cl, hc, g)[0], ref_g)


@pytest.mark.parametrize("model", [
    nn.Sequential(nn.Flatten(), nn.Linear(4, 2)),  # an MLP: mpifl.train.mlp's
    nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2, 2)),
    nn.Sequential(nn.Conv2d(2, 2, 3, groups=2), nn.Flatten(), nn.Linear(2, 2)),
    nn.Sequential(nn.Conv2d(1, 2, 3, padding="same"), nn.Flatten(), nn.Linear(2, 2)),
    nn.Sequential(nn.Conv2d(1, 2, 3, padding_mode="reflect"), nn.Flatten(), nn.Linear(2, 2)),
    nn.Sequential(nn.Conv2d(1, 2, 3), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(2, 2)),
    nn.Sequential(nn.Conv2d(1, 2, 3), nn.Linear(2, 2)),  # a linear layer before the flatten
    nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2, 2), nn.Conv2d(1, 2, 3)),
], ids=["mlp", "batchnorm", "groups", "same", "reflect", "avgpool", "unflattened", "conv-after-flatten"])
def test_other_models_are_left_to_vmap(model):
    assert grouped_convnet(model) is None


@pytest.mark.parametrize("opt", [{"train.optimizer": "sgd"},
                                 {"train.optimizer": "adam", "train.lr": 1e-3, "train.momentum": 0.0}])
def test_clients_train_and_evaluate_as_the_vmap_path_does(opt):
    a, b = make_conv("on", **opt), make_conv("on", **opt)
    assert a.convnet is not None and a.stacked is None
    b.convnet = None  # vmap over functional_call, as before this path existed
    local = np.array([0, 2, 3])
    for t in range(2):
        np.testing.assert_allclose(a.train(local, 2, t), b.train(local, 2, t), rtol=1e-5)
    torch.testing.assert_close(a.params, b.params, rtol=1e-4, atol=1e-5)
    assert not torch.equal(a.params[0], a.init) and not torch.equal(a.params, b.params)  # the sums' order
    for split in ("val", "test"):
        for row in (None, a.params[2]):
            (la, aa), (lb, ab) = a.evaluate(split, row), b.evaluate(split, row)
            np.testing.assert_allclose(la, lb, rtol=1e-4)
            np.testing.assert_allclose(aa, ab, atol=0.02)  # a near tie of two logits may flip
    frozen = ("0.weight", "0.bias")
    x, y, w = a.batch(a.plan(local, 1, 0).idx[:, 0])
    ga, la = a.engine.grads(a.params[local], x, y, w, a.buffers, local, frozen=frozen)
    gb, lb = b.engine.grads(a.params[local], x, y, w, b.buffers, local, frozen=frozen)
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-6)
    assert ga[0] is None and ga[1] is None
    assert all(_close(u, v) for u, v in zip(ga[2:], gb[2:]))


def _hosted_clients(ids: list[int], net: str, batched: str = "on"):
    """Clients ``ids`` of 6 Dirichlet-split clients of 28x28 Gaussian blobs (unequal
    sizes: a client's last steps of an epoch may have no company), on one rank."""
    from mpifl import config
    from mpifl.data import build
    from mpifl.train import Clients

    cfg = config.load(None, ["data.name=synthetic", "data.partition=dirichlet", "data.dirichlet_alpha=0.5",
                             "data.n_clients=6", "data.n_samples=600", "data.synthetic_dim=784",
                             f"model.name={net}", f"train.batched={batched}", "train.batch_size=8",
                             "train.momentum=0.9", "train.lr=0.02"])
    data = build(cfg.data, 0, np.asarray(ids))
    data.x = data.x.reshape(-1, 1, 28, 28)
    data.in_shape = (1, 28, 28)
    return Clients(models.build(cfg.model, data.in_shape, data.n_classes, 0), data, cfg.train, torch.device("cpu"), 0)


def _hosted_with(ids: list[int], net: str, batched: str):
    """:func:`_hosted_clients` trained two epochs: client 0's loss, row and test metrics."""
    c = _hosted_clients(ids, net, batched)
    loss = c.train(np.arange(len(ids)), 2, 0)[0]
    return c.sizes, loss, c.params[0].clone(), [v[0] for v in c.evaluate("test")]


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("net", ["cnn_dpfl", "lenet"])
def test_a_clients_conv_training_does_not_depend_on_the_clients_sharing_its_rank(net, threads):
    """Client 0 alone, with one neighbour or with five (one client per rank, or a
    few) trains and evaluates to the same bits on the grouped path: a convolution
    of one client is not torch's ungrouped kernel, whose sums run in another order."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        sizes, *ref = _hosted_with(list(range(6)), net, "on")
        assert len(set(sizes[:6, 0])) > 1  # unequal sizes: steps where only some clients step
        for ids in ([0], [0, 1], [0, 5]):
            _, loss, params, (tl, ta) = _hosted_with(ids, net, "on")
            assert loss == ref[0] and torch.equal(params, ref[1]) and tl == ref[2][0] and ta == ref[2][1], ids
    finally:
        torch.set_num_threads(before)


def test_conv_chunks_hold_two_clients_at_least_and_keep_the_bits(monkeypatch):
    """A conv net's chunk is never one client (the grouped path would run it beside a
    zero one); chunks of two train every client to the bits of one chunk of all."""
    from mpifl.train import batched

    a, b = make_conv("on"), make_conv("on")
    if a.device.type != "cpu":
        pytest.skip("chunks are the CPU's: a GPU trains every client at once")
    local = np.arange(5)
    monkeypatch.setattr(batched, "CONV_CHUNK_BYTES", 1)
    assert batched.chunks(a, 5) == [(0, 2), (2, 4), (4, 5)]
    la = a.train(local, 2, 0)
    monkeypatch.setattr(batched, "CONV_CHUNK_BYTES", 1 << 30)
    assert batched.chunks(b, 5) == [(0, 5)]
    assert np.array_equal(la, b.train(local, 2, 0)) and torch.equal(a.params, b.params)


def _inner_one_channel_net(in_shape, n_classes):
    """A one-channel convolution inside a net (its input gradient wanted) after one on the input."""
    return nn.Sequential(nn.Conv2d(1, 1, 3), nn.ReLU(), nn.Conv2d(1, 3, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
                         nn.Flatten(), nn.Linear(3 * 13 * 13, n_classes))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("make,n_depthwise", [(models.cnn_dpfl, 1), (_inner_one_channel_net, 2)],
                         ids=["cnn_dpfl", "inner"])
def test_one_channel_convolutions_run_depthwise_to_the_grouped_kernels_bits(monkeypatch, threads, make, n_depthwise):
    """The depthwise forward gives the grouped convolution's bits, and the results
    stay vmap's up to rounding."""
    from mpifl.train import grouped

    torch.manual_seed(2)
    model = make((1, 28, 28), 10)
    ops = grouped_convnet(model)
    m = 5
    p = {k: torch.randn(m, *v.shape) * 0.1 for k, v in model.named_parameters()}
    x, y, w = torch.randn(m, 7, 1, 28, 28), torch.randint(0, 10, (m, 7)), torch.ones(m, 7)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        calls = []
        apply = grouped._DepthwiseForward.apply
        monkeypatch.setattr(grouped._DepthwiseForward, "apply", lambda *a: calls.append(1) or apply(*a))
        fast = _run(ops, p, x, y, w)
        assert len(calls) == 2 * n_depthwise  # the loss's forward and the logits'
        monkeypatch.setattr(grouped, "DEPTHWISE_MAX_OUT", 0)
        plain = _run(ops, p, x, y, w)
        assert len(calls) == 2 * n_depthwise
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(fast, plain))
    leaves = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    ref = vmap(lambda q, xi, yi, wi: cross_entropy(functional_call(model, q, (xi,)), yi, wi))(leaves, x, y, w)
    ref_g = torch.autograd.grad(ref.sum(), list(leaves.values()))
    assert all(_close(a, b) for a, b in zip(fast[2:], ref_g))
