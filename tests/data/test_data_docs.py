"""The preparation scripts docs/data.md gives for the hand-prepared datasets, run
on tiny inputs in their sources' formats: what they write is what ``data.root``
reads, and what ``verify`` finds present.

Bits: the exact comparisons are of labels, domains and counts (integers); features
are compared within tolerances."""

from __future__ import annotations

import json
import pickle
import re
import sys

import numpy as np
import pytest
from helpers import REPO

from mpifl import config
from mpifl.data import build, datasets
from mpifl.data.__main__ import main


def script(name: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "data.md").read_text(), re.S)
    found = [b for b in blocks if b.startswith(f"# {name}:")]
    assert len(found) == 1, f"docs/data.md has {len(found)} python blocks starting '# {name}:'"
    return found[0]


def run(name: str, argv: list[str], monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [name, *argv])
    exec(compile(script(name), name, "exec"), {"__name__": "__main__"})


def data_cfg(name: str, root, *more: str) -> config.DataConfig:
    return config.load(None, [f"data.name={name}", f"data.root={root}", *more]).data


def test_leaf_femnist_to_features(tmp_path, monkeypatch, capsys):
    g = np.random.default_rng(0)
    leaf = tmp_path / "leaf"
    sizes = {"w0": (6, 2), "w1": (4, 2), "w2": (5, 1)}  # writer: (train, test) samples
    written = {}
    for k, part in enumerate(("train", "test")):
        (leaf / part).mkdir(parents=True)
        users = list(sizes)
        data = {"users": users, "num_samples": [sizes[u][k] for u in users], "user_data": {}}
        for u in users:
            x = g.random((sizes[u][k], 784)).round(3)
            y = g.integers(0, 62, sizes[u][k])
            data["user_data"][u] = {"x": x.tolist(), "y": y.tolist()}
            written[u, part] = (x, y)
        (leaf / part / f"all_data_0_niid_0_keep_0_{part}_9.json").write_text(json.dumps(data))
    out = tmp_path / "data" / "femnist"
    run("leaf_to_npz.py", [str(leaf), str(out), "2"], monkeypatch)
    assert "2 writers, 14 samples" in capsys.readouterr().out
    pool = datasets.load(data_cfg("features", out), 0)
    assert pool.shape == (1, 28, 28) and len(pool.y) == 14
    for w, u in enumerate(("w0", "w1")):
        for part in ("train", "test"):
            keep = (pool.domain == w) & (pool.test == (part == "test"))
            x, y = written[u, part]
            np.testing.assert_allclose(pool.x[keep].reshape(-1, 784), x.astype(np.float32))
            np.testing.assert_array_equal(pool.y[keep], y)
    # one client per writer, holding exactly its writer's samples
    data = build(data_cfg("features", out, "data.partition=domains", "data.n_clients=2", "data.val_frac=0",
                          "data.test_frac=0.25"), 0, np.arange(0))
    np.testing.assert_array_equal(data.cluster, [0, 1])
    np.testing.assert_array_equal(data.sizes.sum(1), [8, 6])


def test_fedbn_digits_to_image_folders(tmp_path, monkeypatch, capsys):
    g = np.random.default_rng(1)
    src = tmp_path / "FedBN" / "data"
    shapes = {"MNIST": (28, 28), "SVHN": (32, 32, 3), "USPS": (28, 28), "SynthDigits": (32, 32, 3),
              "MNIST_M": (32, 32, 3)}
    for domain, shape in shapes.items():
        (src / domain / "partitions").mkdir(parents=True)
        files = [src / domain / "partitions" / f"train_part{i}.pkl" for i in range(2)] + [src / domain / "test.pkl"]
        for path in files:
            n = 6
            images = g.integers(0, 256, (n, *shape), dtype=np.uint8)
            labels = (np.arange(n) % 3).astype(np.float64)[:, None]  # FedBN's USPS labels are [n, 1] floats
            path.write_bytes(pickle.dumps((images, labels), protocol=4))
    out = tmp_path / "data" / "digit5"
    run("fedbn_digits_to_folders.py", [str(src), str(out)], monkeypatch)
    assert "SVHN train: 12 images" in capsys.readouterr().out
    assert main(["verify", "--root", str(out.parent), "digit5"]) == 0
    assert "10 folders, 3 classes, 90 images" in capsys.readouterr().out
    pool = datasets.load(data_cfg("digit5", out.parent), 0)
    assert pool.domain_names == sorted(shapes) and pool.shape == (3, 32, 32)
    np.testing.assert_array_equal(np.bincount(pool.domain), [18] * 5)
    assert pool.test.sum() == 30 and np.bincount(pool.y).tolist() == [30, 30, 30]


def test_officehome_features(tmp_path, monkeypatch, capsys):
    import torchvision
    from datafiles import write_png_tree

    g = np.random.default_rng(2)
    src = tmp_path / "OfficeHomeDataset_10072016"
    for domain in ("Art", "Real World"):
        write_png_tree(src / domain, ["Alarm_Clock", "Bike"], 2, 40, g)
    (src / "ImageInfo.csv").write_text("not a folder\n")
    real = torchvision.models.resnet18
    # ImageNet weights are a download: the test runs the same network untrained
    monkeypatch.setattr(torchvision.models, "resnet18", lambda weights=None: real(weights=None))
    out = tmp_path / "data" / "officehome-resnet18"
    run("officehome_features.py", [str(src), str(out)], monkeypatch)
    assert "2 domains ['Art', 'Real World'], 2 classes, 8 images" in capsys.readouterr().out
    assert main(["verify", "--root", str(out), "features"]) == 0
    pool = datasets.load(data_cfg("features", out), 0)
    assert pool.shape == (512,) and pool.n_classes == 2
    np.testing.assert_array_equal(pool.domain, np.repeat([0, 1], 4))
    np.testing.assert_array_equal(pool.y, np.tile(np.repeat([0, 1], 2), 2))
    assert np.isfinite(pool.x).all() and pool.x.std() > 0


@pytest.mark.parametrize("name", ["leaf_to_npz.py", "fedbn_digits_to_folders.py", "officehome_features.py"])
def test_each_script_says_how_to_run_it(name):
    assert f"#   python {name} " in script(name)
