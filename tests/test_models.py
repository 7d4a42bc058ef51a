"""Models: forward/backward on every dataset shape they apply to, parameter
counts as the papers describe the architectures, BatchNorm per client, weights
from a local file.

Bits: the exact comparisons are of copies (weights loaded from a file, a template
left untouched) and of weights built twice from one seed in one process (the same
draws): any CPU. Gradients are compared within tolerances."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import DEVICE

from mpifl import config, models
from mpifl.config import ModelConfig
from mpifl.data import build
from mpifl.errors import ConfigError
from mpifl.train import Clients

# input shapes of the datasets (pool.shape): 28x28 gray (MNIST family), 32x32 RGB
# (CIFAR, CINIC-10, Digit-5), 64x64 RGB (Office-10), 8x8 gray (digits), vectors
SHAPES = {"mnist": (1, 28, 28), "cifar10": (3, 32, 32), "office10": (3, 64, 64), "digits": (1, 8, 8),
          "mnist1d": (40,), "features": (512,)}
APPLIES = {
    "mlp": list(SHAPES),
    "lenet": ["mnist", "cifar10", "office10"],
    "cnn_dpfl": ["mnist", "cifar10", "office10"],
    "cnn2": ["mnist", "cifar10", "office10", "digits"],
    "resnet18": ["mnist", "cifar10", "office10", "digits"],
}


def conv(cin: int, cout: int, k: int) -> int:
    return cin * cout * k * k + cout


def fc(a: int, b: int) -> int:
    return a * b + b


@pytest.mark.parametrize("name,data", [(m, d) for m, ds in APPLIES.items() for d in ds])
def test_forward_backward(name, data):
    torch.set_num_threads(1)
    shape, C = SHAPES[data], 10
    m = models.build(ModelConfig(name=name), shape, C, seed=0)
    x = torch.randn(3, *shape)
    out = m(x)
    assert out.shape == (3, C)
    torch.nn.functional.cross_entropy(out, torch.tensor([0, 1, 2])).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("name,data", [(m, d) for m in ("lenet", "cnn_dpfl", "cnn2", "resnet18")
                                       for d in SHAPES if d not in APPLIES[m]])
def test_image_model_on_wrong_data_is_config_error(name, data):
    with pytest.raises(ConfigError, match=f"model.name='{name}'"):
        models.build(ModelConfig(name=name), SHAPES[data], 10, seed=0)


def test_parameter_counts_match_the_papers():
    # FedC2I Table 7: conv(3,64,5) pool conv(64,64,5) pool fc(64*13*13,384) fc(384,192) fc(192,10); 64x64 inputs
    lenet = conv(3, 64, 5) + conv(64, 64, 5) + fc(64 * 13 * 13, 384) + fc(384, 192) + fc(192, 10)
    # DPFL F.3.2 (CIFAR-10): conv(3,6,5) conv(6,16,5) fc(400,120) fc(120,84) fc(84,10)
    dpfl = conv(3, 6, 5) + conv(6, 16, 5) + fc(400, 120) + fc(120, 84) + fc(84, 10)
    # DPFL F.4.2 (FEMNIST): conv(1,4,5) conv(4,12,5) fc(192,120) fc(120,100) fc(100,10)
    dpfl_femnist = conv(1, 4, 5) + conv(4, 12, 5) + fc(192, 120) + fc(120, 100) + fc(100, 10)
    # FedeRiCo: three 3x3 convs of 128 channels, each with 2x2 pooling, one fc (CIFAR-10)
    cnn2 = conv(3, 128, 3) + 2 * conv(128, 128, 3) + fc(128 * 4 * 4, 10)
    got = {k: models.n_params(models.build(ModelConfig(name=n), s, 10, 0)) for k, n, s in [
        ("lenet", "lenet", (3, 64, 64)), ("dpfl", "cnn_dpfl", (3, 32, 32)),
        ("dpfl_femnist", "cnn_dpfl", (1, 28, 28)), ("cnn2", "cnn2", (3, 32, 32))]}
    assert got == {"lenet": lenet, "dpfl": dpfl, "dpfl_femnist": dpfl_femnist, "cnn2": cnn2}
    assert (lenet, dpfl, dpfl_femnist, cnn2) == (4336906, 62006, 37586, 319242)
    from torchvision.models import resnet18

    tv = sum(p.numel() for p in resnet18(weights=None, num_classes=10).parameters())
    assert models.n_params(models.build(ModelConfig(name="resnet18"), (3, 32, 32), 10, 0)) == tv


def test_lenet_classifier_is_last_linear():
    """FedC2I splits phi / per-class rows of the last nn.Linear."""
    m = models.build(ModelConfig(name="lenet"), (3, 32, 32), 7, 0)
    last = [mod for mod in m.modules() if isinstance(mod, torch.nn.Linear)][-1]
    assert last.weight.shape == (7, 192)


@pytest.mark.slow
def test_weights_from_file(tmp_path):
    src = models.build(ModelConfig(name="resnet18"), (3, 32, 32), 1000, seed=5)  # an "ImageNet" head
    torch.save(src.state_dict(), tmp_path / "r18.pt")
    m = models.build(ModelConfig(name="resnet18", weights=str(tmp_path / "r18.pt")), (3, 32, 32), 10, seed=0)
    fresh = models.build(ModelConfig(name="resnet18"), (3, 32, 32), 10, seed=0)
    assert torch.equal(m.conv1.weight, src.conv1.weight)
    assert torch.equal(m.layer4[1].bn2.running_var, src.layer4[1].bn2.running_var)
    assert torch.equal(m.fc.weight, fresh.fc.weight)  # 1000-way head skipped, own init kept
    with pytest.raises(ConfigError, match="file not found"):
        models.build(ModelConfig(name="mlp", weights=str(tmp_path / "none.pt")), (4,), 2, 0)
    torch.save(src.state_dict(), tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="no tensor matches"):
        models.build(ModelConfig(name="mlp", weights=str(tmp_path / "other.pt")), (4,), 2, 0)


def bn_clients(batch: int, n_clients: int = 3):
    torch.set_num_threads(1)
    cfg = config.load(None, ["data.name=digits", "data.partition=clusters", f"data.n_clients={n_clients}",
                             "data.n_clusters=3", "data.subsample=0.4", "model.name=resnet18",
                             f"train.batch_size={batch}"])
    data = build(cfg.data, 0, np.arange(n_clients))
    m = models.build(cfg.model, data.in_shape, data.n_classes, 0)
    return Clients(m, data, cfg.train, DEVICE, 0), m


def test_batchnorm_statistics_are_per_client():
    c, m = bn_clients(batch=64)
    assert not c.batched and c.layout.B > 0
    floats = [b for b in m.buffers() if b.is_floating_point()]  # num_batches_tracked is not per client
    before, template = c.buffers.clone(), [b.clone() for b in floats]
    c.train(np.array([0, 2]), 1, 0)
    moved = (c.buffers - before).abs().amax(1)
    assert moved[0] > 0 and moved[2] > 0 and moved[1] == 0  # only the trained clients' statistics
    assert all(torch.equal(a, b) for a, b in zip(template, floats))  # template untouched
    # a model evaluated on a client uses that client's statistics, whether given as its row or as one [P] model
    own = c.evaluate("test", local=np.array([0]))
    shared = c.evaluate("test", params=c.params[0], local=np.array([0]))
    np.testing.assert_allclose(own[0], shared[0], rtol=1e-6)
    np.testing.assert_allclose(own[1], shared[1])


@pytest.mark.slow
def test_batchnorm_skips_single_sample_batches():
    c, _ = bn_clients(batch=64)
    n = int(c.sizes[0, 0])
    c2, _ = bn_clients(batch=n - 1)  # leaves one sample alone in the last batch
    plan = c2.plan(np.array([0]), 2, 0)
    counts = (plan.idx[0] >= 0).sum(1)
    assert counts.min() >= 2 and counts.sum() == 2 * (n - 1)
    loss = c2.train(np.array([0]), 1, 0)
    assert np.isfinite(loss).all()


def test_sequential_gradients_equal_batched():
    """The per-tensor leaves of the sequential path give vmap's gradients."""
    torch.set_num_threads(1)
    cfg = config.load(None, ["data.name=digits", "data.partition=iid", "data.n_clients=3", "model.name=cnn2",
                             "data.subsample=0.3", "train.batched=on"])
    data = build(cfg.data, 0, np.arange(3))
    m = models.build(cfg.model, data.in_shape, data.n_classes, 0)
    c = Clients(m, data, cfg.train, DEVICE, 0)
    assert c.batched
    g = torch.Generator().manual_seed(0)
    params = c.params + 0.01 * torch.randn(c.params.shape, generator=g).to(c.device)
    x, y, w = c.batch(c.plan(np.arange(3), 1, 0).idx[:, 0])
    w[1, -5:] = 0  # padding must not count
    gb, lb = c.grads(params, x, y, w)
    c.batched = False
    gs, ls = c.grads(params, x, y, w, np.arange(3))
    torch.testing.assert_close(gs, gb, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ls, lb)


@pytest.mark.parametrize("in_shape", [(1, 28, 28), (3, 17, 23), (2, 40, 9)])
def test_the_flat_size_from_shape_rules_is_the_forwards(in_shape):
    """models._flat_size reads conv and pooling layers' shape rules instead of running a
    forward (none under the meta device): the same count as a forward, over kernel,
    stride, padding, dilation and ceil_mode, and a refusal where the forward refuses."""
    from torch import nn

    stacks = [
        [nn.Conv2d(in_shape[0], 4, 5), nn.ReLU(), nn.MaxPool2d(2)],
        [nn.Conv2d(in_shape[0], 3, 3, stride=2, padding=1), nn.BatchNorm2d(3),
         nn.MaxPool2d(3, stride=2, ceil_mode=True)],
        [nn.Conv2d(in_shape[0], 2, (3, 2), stride=(1, 2), padding=(2, 0), dilation=(2, 1)), nn.MaxPool2d(2, padding=1)],
        [nn.Conv2d(in_shape[0], 5, 3, padding=1), nn.MaxPool2d(2, ceil_mode=True), nn.MaxPool2d(3, ceil_mode=True)],
        [nn.Conv2d(in_shape[0], 2, 9), nn.Conv2d(2, 2, 9), nn.Conv2d(2, 2, 9)],  # too small for 9x9 three times
        [nn.Conv2d(in_shape[0], 2, 3), nn.AdaptiveAvgPool2d(3)],  # no rule here: a forward
    ]
    for layers in stacks:
        features = nn.Sequential(*layers, nn.Flatten()).eval()
        try:
            with torch.no_grad():
                want = features(torch.zeros(1, *in_shape)).numel()
        except RuntimeError:
            with pytest.raises(RuntimeError):
                models._flat_size(features, in_shape)
            continue
        assert models._flat_size(features, in_shape) == want, layers


def test_an_mlp_with_batchnorm_puts_one_before_each_hidden_relu_and_only_an_mlp_takes_it():
    from mpifl.algorithms import fedbn

    cfg = config.load(None, ["model.name=mlp", "model.hidden=[16,8]", "model.batchnorm=true"])
    m = models.build(cfg.model, (1, 28, 28), 10, 0)
    kinds = [type(x).__name__ for x in m]
    assert kinds == ["Flatten", "Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d", "ReLU", "Linear"]
    # FedBN's personal part
    assert fedbn.batchnorm_names(models.layers(m)) == {"2.weight", "2.bias", "5.weight", "5.bias"}
    plain = models.build(config.load(None, ["model.name=mlp", "model.hidden=[16,8]"]).model, (1, 28, 28), 10, 0)
    # the option adds layers and draws nothing: the Linear layers start from the same weights
    assert all(torch.equal(a, b) for a, b in zip([p for n, p in m.named_parameters() if n not in {"2.weight", "2.bias",
               "5.weight", "5.bias"}], plain.parameters()))
    with pytest.raises(ConfigError, match="model.batchnorm=True .* model.name=mlp only"):
        config.load(None, ["model.name=lenet", "model.batchnorm=true"])
