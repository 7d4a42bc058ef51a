"""The grouped conv-net path (mpifl.train.grouped) computes vmap's results bit for bit."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_clients import make_conv
from torch import nn
from torch.func import functional_call, vmap

from mpifl import models
from mpifl.train.grouped import _max_pool, grouped_convnet, grouped_forward, grouped_loss, pool_args, shared_forward
from mpifl.train.loss import cross_entropy


def _padded_net(in_shape, n_classes):
    """Padding, stride, dilation, a ceil-mode pool, a bias-free conv, ReLU on both sides of the flatten."""
    c = in_shape[0]
    return nn.Sequential(nn.Conv2d(c, 3, 3, padding=1, bias=False), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         nn.Conv2d(3, 5, 3, stride=2, dilation=2), nn.MaxPool2d(2, ceil_mode=True), nn.ReLU(),
                         nn.Flatten(), nn.Linear(5 * 3 * 3, 7), nn.ReLU(), nn.Linear(7, n_classes, bias=False))


NETS = {"cnn_dpfl": models.cnn_dpfl, "lenet": models.lenet, "cnn2": models.cnn2, "padded": _padded_net}


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


@pytest.mark.parametrize("m", [2, 3])
@pytest.mark.parametrize("net", list(NETS))
def test_logits_loss_and_gradients_are_vmaps_bit_for_bit(net, m):
    model, p, x, y, w = _case(net, m)
    ops = grouped_convnet(model)
    assert ops is not None
    bias = torch.randn(m, 10)
    ref_logits = vmap(lambda q, xi: functional_call(model, q, (xi,)))(p, x)
    assert torch.equal(grouped_forward(ops, p, x), ref_logits)
    for b in (None, bias):
        leaves = {k: v.clone().requires_grad_(True) for k, v in p.items()}
        if b is None:
            ref = vmap(lambda q, xi, yi, wi: cross_entropy(functional_call(model, q, (xi,)), yi, wi))(leaves, x, y, w)
        else:
            ref = vmap(lambda q, xi, yi, wi, bi: cross_entropy(functional_call(model, q, (xi,)), yi, wi, bias=bi))(
                leaves, x, y, w, b)
        ref_g = torch.autograd.grad(ref.sum(), list(leaves.values()))
        got = grouped_loss(ops, leaves, x, y, w, b)
        got_g = torch.autograd.grad(got.sum(), list(leaves.values()))
        assert torch.equal(got, ref)
        for name, a, c in zip(leaves, got_g, ref_g):
            assert torch.equal(a, c), (name, (a - c).abs().max().item())


@pytest.mark.parametrize("net", list(NETS))
def test_one_client_computes_what_it_computes_among_others(net):
    """A client alone (m = 1) gets the logits, loss and gradients it gets as the first
    of 2 or 3: not torch's ungrouped convolution, whose weight gradients differ in
    the last bits."""
    model, p, x, y, w = _case(net, 3)
    ops = grouped_convnet(model)

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


@pytest.mark.parametrize("net", list(NETS))
def test_one_shared_model_evaluates_to_the_modules_own_bits(net):
    model, p, x, _, _ = _case(net, 1)
    one = {k: v[0] for k, v in p.items()}
    flat = x[0]
    with torch.no_grad():
        assert torch.equal(shared_forward(grouped_convnet(model), one, flat), functional_call(model, one, (flat,)))


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
    assert torch.equal(torch.autograd.grad(got, h, g)[0], torch.autograd.grad(ref, h, g)[0])


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
def test_clients_train_and_evaluate_to_the_vmap_paths_bits(opt):
    a, b = make_conv("on", **opt), make_conv("on", **opt)
    assert a.convnet is not None and a.stacked is None
    b.convnet = None  # vmap over functional_call, as before this path existed
    local = np.array([0, 2, 3])
    for t in range(2):
        assert np.array_equal(a.train(local, 2, t), b.train(local, 2, t))
    assert torch.equal(a.params, b.params) and not torch.equal(a.params[0], a.init)
    for split in ("val", "test"):
        for row in (None, a.params[2]):
            for u, v in zip(a.evaluate(split, row), b.evaluate(split, row)):
                assert np.array_equal(u, v)
    frozen = ("0.weight", "0.bias")
    x, y, w = a.batch(a.plan(local, 1, 0).idx[:, 0])
    ga, la = a.engine.grads(a.params[local], x, y, w, a.buffers, local, frozen=frozen)
    gb, lb = b.engine.grads(b.params[local], x, y, w, b.buffers, local, frozen=frozen)
    assert torch.equal(la, lb) and ga[0] is None and ga[1] is None
    assert all(torch.equal(u, v) for u, v in zip(ga[2:], gb[2:]))


def _hosted_with(ids: list[int], net: str, batched: str):
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
    c = Clients(models.build(cfg.model, data.in_shape, data.n_classes, 0), data, cfg.train, torch.device("cpu"), 0)
    loss = c.train(np.arange(len(ids)), 2, 0)[0]
    return data.sizes, loss, c.params[0].clone(), [v[0] for v in c.evaluate("test")]


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
