"""FedC2I pieces that need no MPI: the classifier split, the one-op class-level
losses against a loop, and config checks.

    python -m pytest -x -q tests/algorithms/test_fedc2i_parts.py

Bits: the exact comparisons are of rows written into and read back from the
classifier's slots (copies): any CPU. Logits and losses are compared within
tolerances.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import DEVICE
from torch import nn

from mpifl import config
from mpifl.algorithms import fedc2i
from mpifl.data import FederatedData
from mpifl.errors import ConfigError
from mpifl.train import Clients
from mpifl.train.head import find_head


class TinyLeNet(nn.Module):
    """Nested modules and a classifier that is not the last parameter group of a
    Sequential: the split must still be found."""

    def __init__(self, n_classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(4 * 3 * 3, 12), nn.ReLU())
        self.classifier = nn.Linear(12, n_classes)

    def forward(self, x):
        return self.classifier(self.fc(self.features(x)))


class SquashedOutput(nn.Module):
    def __init__(self, n_classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU())
        self.out = nn.Linear(16, n_classes)

    def forward(self, x):
        return torch.tanh(self.out(self.body(x)))


def clients_for(model: nn.Module, batched: str = "auto") -> Clients:
    g = np.random.default_rng(0)
    n = 30
    x = g.normal(size=(n, 1, 8, 8)).astype(np.float32)
    y = g.integers(0, 10, n).astype(np.int64)
    data = FederatedData(10, (1, 8, 8), np.zeros(1, np.int64), np.array([[20, 5, 5]]), np.zeros((1, 10)),
                         x, y, np.array([[0, 20, 25]]), np.array([0]))
    return Clients(model, data, config.TrainConfig(batched=batched), DEVICE, seed=0)


@pytest.mark.parametrize("batched", ["auto", "off"])
def test_head_split_reproduces_the_model(batched):
    torch.manual_seed(0)
    c = clients_for(TinyLeNet(), batched)
    head = find_head(c, "tiny", "fedc2i")
    assert (head.n_classes, head.dim, head.names) == (10, 12, ("classifier.weight", "classifier.bias"))
    rows = c.init[None] + 0.1 * torch.randn(2, c.P).to(c.device)
    x = c.x[:12].reshape(2, 6, 1, 8, 8)
    h = head.features_of(c, rows, x)
    v = head.rows(rows)
    z = torch.einsum("mbd,mcd->mbc", torch.cat([h, torch.ones_like(h[..., :1])], -1), v)
    np.testing.assert_allclose(z.cpu().numpy(), c.logits(rows, x, np.array([0, 0])).cpu().numpy(), rtol=1e-5, atol=1e-5)
    # put/rows round trip touches only the classifier
    v2 = torch.randn_like(v)
    new = head.put(rows.clone(), v2)
    np.testing.assert_array_equal(head.rows(new).cpu().numpy(), v2.cpu().numpy())
    mask = torch.ones(c.P, dtype=torch.bool, device=c.device)
    mask[head.weight] = False
    mask[head.bias] = False
    np.testing.assert_array_equal(new[:, mask].cpu().numpy(), rows[:, mask].cpu().numpy())


def test_head_rejects_output_that_is_not_the_last_linear():
    torch.manual_seed(0)
    with pytest.raises(ConfigError, match="model.name='squashed'.*last"):
        find_head(clients_for(SquashedOutput()), "squashed", "fedc2i")


@pytest.mark.parametrize("bias,scale", [(True, 1.0), (False, 1.0), (True, 40.0)])
def test_class_losses_match_a_loop(bias, scale):
    """scale 40: confident logits, where a careless log-sum-exp cancels."""
    g = torch.Generator().manual_seed(1)
    m, bs, d, N, C = 2, 7, 5, 4, 3
    h = scale * torch.randn(m, bs, d, generator=g)
    y = torch.randint(0, C, (m, bs), generator=g)
    w = torch.ones(m, bs)
    w[1, 5:] = 0  # padding must not count
    v = torch.randn(N, C, d + bias, generator=g)
    got = fedc2i.class_losses(h, y, w, v, bias)
    h1 = torch.cat([h, torch.ones_like(h[..., :1])], -1) if bias else h
    for i in range(m):
        keep = w[i] > 0
        for j in range(N):
            for c in range(C):
                cls = v.mean(0).clone()
                cls[c] = torch.stack([v[k, c] for k in range(N) if k != j]).mean(0)
                ref = F.cross_entropy(h1[i][keep] @ cls.T, y[i][keep])
                assert abs(got[i, j, c].item() - ref.item()) < 1e-5 * max(1.0, ref.item())


@pytest.mark.parametrize("override,match", [
    ("fedc2i.alpha=-1", "fedc2i.alpha"),
    ("fedc2i.ablation=class_only", "fedc2i.ablation"),
    ("data.n_clients=1", "data.n_clients"),
])
def test_config_errors_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        config.load(None, ["algorithm.name=fedc2i", override])


@pytest.mark.parametrize("batched", ["auto", "off"])
def test_mlp_features_fast_path_matches_the_model(batched):
    """MLPs take batched matmuls for the features instead of vmap: same values."""
    from mpifl import models
    torch.manual_seed(0)
    c = clients_for(models.mlp((1, 8, 8), 10, [16, 12]), batched)
    head = find_head(c, "mlp", "fedc2i")
    assert head.body is not None
    rows = c.init[None] + 0.1 * torch.randn(3, c.P).to(c.device)
    x = c.x[:15].reshape(3, 5, 1, 8, 8)
    got = head.features_of(c, rows, x)
    want = torch.stack([head.features(rows[i], x[i]) for i in range(3)])
    np.testing.assert_allclose(got.cpu().numpy(), want.cpu().numpy(), rtol=1e-5, atol=1e-6)
    assert find_head(clients_for(TinyLeNet(), batched), "tiny", "fedc2i").body is None
