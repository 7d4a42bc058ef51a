"""On-disk loaders: tiny datasets written in the real formats, read back through
mpifl (torchvision, download=False); missing or malformed roots give one line.

Bits: the exact comparisons are of images and labels read back as they were written
(no arithmetic), and of two loads of one subsample in one process: any CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from datafiles import fake_images, write_cifar, write_idx, write_png_tree

from mpifl import config
from mpifl.data import build, datasets
from mpifl.errors import ConfigError


def cfg_for(name: str, root: Path | str, *more: str) -> config.DataConfig:
    return config.load(None, [f"data.name={name}", f"data.root={root}", "data.n_clients=2", *more]).data


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzip"])
@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashionmnist", "FashionMNIST")])
def test_mnist_family_idx(tmp_path, name, folder, gz):
    g = np.random.default_rng(0)
    raw = tmp_path / folder / "raw"
    xtr, xte = fake_images(g, 30, 28, 28), fake_images(g, 12, 28, 28)
    ytr, yte = g.integers(0, 10, 30), g.integers(0, 10, 12)
    write_idx(raw / "train-images-idx3-ubyte", xtr, gz)
    write_idx(raw / "train-labels-idx1-ubyte", ytr, gz)
    write_idx(raw / "t10k-images-idx3-ubyte", xte, gz)
    write_idx(raw / "t10k-labels-idx1-ubyte", yte, gz)
    pool = datasets.load(cfg_for(name, tmp_path), 0)
    assert pool.shape == (1, 28, 28) and pool.n_classes == 10
    np.testing.assert_array_equal(pool.x[:, 0], np.concatenate([xtr, xte]))
    np.testing.assert_array_equal(pool.y, np.concatenate([ytr, yte]))
    np.testing.assert_array_equal(pool.test, np.r_[np.zeros(30, bool), np.ones(12, bool)])
    f = pool.floats(np.arange(len(pool.y)))
    assert f.dtype == np.float32 and abs(float(f.mean())) < 1e-4 and abs(float(f.std()) - 1) < 1e-3


@pytest.mark.parametrize("split,n_classes,offset", [("byclass", 62, 0), ("letters", 26, 1), ("digits", 10, 0)])
def test_emnist_splits(tmp_path, split, n_classes, offset):
    g = np.random.default_rng(1)
    raw = tmp_path / "EMNIST" / "raw"
    xs, ys = {}, {}
    for part, n in (("train", 20), ("test", 8)):
        xs[part] = fake_images(g, n, 28, 28)
        ys[part] = g.integers(offset, n_classes + offset, n)
        write_idx(raw / f"emnist-{split}-{part}-images-idx3-ubyte", xs[part], gz=(part == "test"))
        write_idx(raw / f"emnist-{split}-{part}-labels-idx1-ubyte", ys[part], gz=False)
    pool = datasets.load(cfg_for("emnist", tmp_path, f"data.emnist_split={split}"), 0)
    assert pool.n_classes == n_classes
    np.testing.assert_array_equal(pool.y, np.concatenate([ys["train"], ys["test"]]) - offset)
    # EMNIST stores images transposed; the pool holds them upright
    np.testing.assert_array_equal(pool.x[0, 0], xs["train"][0].T)


def test_cifar10_batches(tmp_path):
    written = write_cifar(tmp_path, False, np.random.default_rng(2))
    pool = datasets.load(cfg_for("cifar10", tmp_path), 0)
    order = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    assert pool.shape == (3, 32, 32) and pool.n_classes == 10 and len(pool.y) == 70
    np.testing.assert_array_equal(pool.y, np.concatenate([written[k]["labels"] for k in order]))
    # CIFAR rows are 1024 R, 1024 G, 1024 B values: channel-first 32x32
    np.testing.assert_array_equal(pool.x[0], written["data_batch_1"]["data"][0].reshape(3, 32, 32))
    assert pool.test.sum() == 20 and pool.test[-20:].all()


def test_cifar100_fine_and_coarse(tmp_path):
    written = write_cifar(tmp_path, True, np.random.default_rng(3))
    fine = datasets.load(cfg_for("cifar100", tmp_path), 0)
    assert fine.n_classes == 100
    np.testing.assert_array_equal(fine.class_groups, written["coarse_of"])
    np.testing.assert_array_equal(fine.y, np.concatenate([written["train"]["fine_labels"],
                                                          written["test"]["fine_labels"]]))
    coarse = datasets.load(cfg_for("cifar100", tmp_path, "data.cifar100_labels=coarse"), 0)
    assert coarse.n_classes == 20 and coarse.class_groups is None
    np.testing.assert_array_equal(coarse.y, written["coarse_of"][fine.y])


def test_cinic10_image_folder(tmp_path):
    g = np.random.default_rng(4)
    classes = ["airplane", "cat", "dog"]
    for split, n in (("train", 3), ("valid", 2), ("test", 2)):
        write_png_tree(tmp_path / "CINIC-10" / split, classes, n, 32, g)
    pool = datasets.load(cfg_for("cinic10", tmp_path), 0)
    assert pool.shape == (3, 32, 32) and pool.n_classes == 3 and len(pool.y) == 21
    assert pool.test.sum() == 6 and pool.domain is None
    np.testing.assert_array_equal(np.bincount(pool.y), [7, 7, 7])


def test_digit5_domains_mixed_layouts_and_sizes(tmp_path):
    """One folder per domain, grayscale 28px and RGB 32px mixed, one domain with
    train/test subfolders: all come out as 3x32x32 with their domain recorded."""
    g = np.random.default_rng(5)
    classes = [str(i) for i in range(4)]
    write_png_tree(tmp_path / "digit5" / "mnist", classes, 3, 28, g, mode="L")
    write_png_tree(tmp_path / "digit5" / "svhn" / "train", classes, 2, 32, g)
    write_png_tree(tmp_path / "digit5" / "svhn" / "test", classes, 1, 32, g)
    pool = datasets.load(cfg_for("digit5", tmp_path), 0)
    assert pool.shape == (3, 32, 32) and pool.n_classes == 4
    assert pool.domain_names == ["mnist", "svhn"]
    np.testing.assert_array_equal(np.bincount(pool.domain), [12, 12])
    assert pool.test.sum() == 4 and (pool.domain[pool.test] == 1).all()
    capped = datasets.load(cfg_for("digit5", tmp_path, "data.per_class=1", "data.image_size=16"), 0)
    assert capped.shape == (3, 16, 16)
    # one per (class, domain, train/test part)
    assert len(capped.y) == 4 * 3


def test_office10_class_mismatch_is_one_line(tmp_path):
    g = np.random.default_rng(6)
    write_png_tree(tmp_path / "office10" / "amazon", ["back_pack", "bike"], 1, 20, g)
    write_png_tree(tmp_path / "office10" / "dslr", ["back_pack", "mug"], 1, 20, g)
    with pytest.raises(ConfigError) as e:
        datasets.load(cfg_for("office10", tmp_path), 0)
    msg = str(e.value)
    assert "\n" not in msg and "office10" in msg and "dslr" in msg and "differ" in msg


def test_office10_default_size_and_build(tmp_path):
    g = np.random.default_rng(7)
    for d in ("amazon", "caltech", "dslr", "webcam"):
        write_png_tree(tmp_path / "office10" / d, ["a", "b"], 3, 40, g)
    cfg = cfg_for("office10", tmp_path, "data.partition=domains", "data.n_clients=4", "data.val_frac=0",
                  "data.test_frac=0.34")
    data = build(cfg, 0, np.arange(4))
    assert data.in_shape == (3, 64, 64)
    np.testing.assert_array_equal(data.cluster, [0, 1, 2, 3])
    assert (data.label_hist > 0).all()  # label-complete clients


def test_features_npz(tmp_path):
    g = np.random.default_rng(8)
    x, y, dom = g.normal(size=(40, 16)), g.integers(0, 5, 40), np.repeat([0, 1], 20)
    np.savez(tmp_path / "office_home.npz", features=x, labels=y, domain=dom)
    pool = datasets.load(cfg_for("features", tmp_path / "office_home.npz"), 0)
    assert pool.shape == (16,) and pool.n_classes == int(y.max()) + 1
    np.testing.assert_allclose(pool.x, x.astype(np.float32))
    np.testing.assert_array_equal(pool.domain, dom)
    (tmp_path / "dir").mkdir()
    np.savez(tmp_path / "dir" / "features.npz", x=x, y=y)
    assert datasets.load(cfg_for("features", tmp_path / "dir"), 0).domain is None


@pytest.mark.parametrize("name,expect", [
    ("mnist", "MNIST/raw"), ("fashionmnist", "FashionMNIST/raw"), ("emnist", "emnist-byclass-train-images"),
    ("cifar10", "data_batch_1"), ("cifar100", "cifar-100-python"), ("cinic10", "CINIC-10"),
    ("digit5", "digit5/<domain>"), ("office10", "office10/<domain>"), ("features", ".npz")])
def test_missing_root_is_one_clear_line(tmp_path, name, expect):
    with pytest.raises(ConfigError) as e:
        datasets.load(cfg_for(name, tmp_path / "nowhere"), 0)
    msg = str(e.value)
    assert "\n" not in msg and name in msg and str(tmp_path / "nowhere") in msg and expect in msg


def test_malformed_files_are_one_clear_line(tmp_path):
    write_cifar(tmp_path, False, np.random.default_rng(9))
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError) as e:
        datasets.load(cfg_for("cifar10", tmp_path), 0)
    assert "\n" not in str(e.value) and "unreadable" in str(e.value)
    raw = tmp_path / "MNIST" / "raw"
    for f in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
              "t10k-labels-idx1-ubyte"):
        raw.mkdir(parents=True, exist_ok=True)
        (raw / f).write_bytes(b"\x00\x00\x08")  # truncated header
    with pytest.raises(ConfigError) as e:
        datasets.load(cfg_for("mnist", tmp_path), 0)
    assert "\n" not in str(e.value) and "MNIST" in str(e.value)


def test_no_root_given(tmp_path):
    with pytest.raises(ConfigError, match="set data.root=PATH .*; python -m mpifl.data fetch cifar10 --root DIR "
                                          "puts it there; docs/data.md lists the layouts read"):
        datasets.load(config.load(None, ["data.name=cifar10"]).data, 0)
    with pytest.raises(ConfigError) as e:  # a hand-prepared folder: nothing to fetch
        datasets.load(config.load(None, ["data.name=office10"]).data, 0)
    assert "set data.root=PATH" in str(e.value) and "fetch" not in str(e.value)


def test_a_fashion_mnist_root_in_neither_layout_names_both_and_the_fetch(tmp_path):
    """Fashion-MNIST is read in torchvision's layout or as the four IDX files in
    the folder itself (Debian's): a root with neither names both."""
    with pytest.raises(ConfigError) as e:
        datasets.load(cfg_for("fashionmnist", tmp_path), 0)
    msg = str(e.value)
    assert f"{tmp_path}/FashionMNIST/raw/{{train-images-idx3-ubyte," in msg and "(IDX files, as torchvision" in msg
    assert f"or {tmp_path}/{{train-images-idx3-ubyte," in msg and "as Debian's dataset-fashion-mnist" in msg
    assert msg.endswith("python -m mpifl.data fetch fashionmnist --root DIR puts it there)") and "\n" not in msg


def test_subsample_is_per_class_and_seeded():
    cfg = config.load(None, ["data.name=digits", "data.subsample=0.1"]).data
    a, b = datasets.load(cfg, 0), datasets.load(cfg, 0)
    full = datasets.load(config.load(None, ["data.name=digits"]).data, 0)
    np.testing.assert_array_equal(a.y, b.y)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_allclose(np.bincount(a.y), np.round(0.1 * np.bincount(full.y)))
    assert not np.array_equal(datasets.load(cfg, 1).x, a.x)


def _write_flat_fashion(folder: Path, g: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    xtr, xte = fake_images(g, 20, 28, 28), fake_images(g, 8, 28, 28)
    ytr, yte = g.integers(0, 10, 20), g.integers(0, 10, 8)
    for name, arr in (("train-images-idx3-ubyte", xtr), ("train-labels-idx1-ubyte", ytr),
                      ("t10k-images-idx3-ubyte", xte), ("t10k-labels-idx1-ubyte", yte)):
        write_idx(folder / name, arr, gz=True)  # Debian's layout: the .gz files, no raw/ folder
    return np.concatenate([xtr, xte]), np.concatenate([ytr, yte])


def test_fashionmnist_reads_the_flat_debian_layout_from_root_or_the_package(tmp_path, monkeypatch):
    x, y = _write_flat_fashion(tmp_path / "flat", np.random.default_rng(4))
    pool = datasets.load(cfg_for("fashionmnist", tmp_path / "flat"), 0)
    np.testing.assert_array_equal(pool.x[:, 0], x)
    np.testing.assert_array_equal(pool.y, y)
    assert pool.test.sum() == 8
    # no data.root: the package's folder
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", tmp_path / "flat")
    pool = datasets.load(config.load(None, ["data.name=fashionmnist"]).data, 0)
    np.testing.assert_array_equal(pool.y, y)


def test_fashionmnist_without_root_or_package_names_both_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", tmp_path / "absent")
    with pytest.raises(ConfigError) as e:
        datasets.load(config.load(None, ["data.name=fashionmnist"]).data, 0)
    msg = str(e.value)
    assert "\n" not in msg and "dataset-fashion-mnist" in msg and "data.root" in msg


@pytest.mark.slow
@pytest.mark.skipif(not datasets.DEBIAN_FASHION_MNIST.is_dir(), reason="Debian's dataset-fashion-mnist not installed")
def test_the_real_fashion_mnist_from_debians_package():
    # CI installs the package, so the real files are read on every change
    pool = datasets.load(config.load(None, ["data.name=fashionmnist"]).data, 0)
    assert pool.x.shape == (70000, 1, 28, 28) and pool.test.sum() == 10000
    np.testing.assert_array_equal(np.bincount(pool.y), np.full(10, 7000))
    np.testing.assert_array_equal(pool.y[:5], [9, 0, 0, 3, 0])  # the training set's first labels
