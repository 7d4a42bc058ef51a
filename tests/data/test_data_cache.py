"""The on-disk cache of built-in datasets: what a run reads back is what it would
have made; a bad file is made again; an empty MPIFL_CACHE or an unwritable folder
only costs the time.

Bits: the exact comparisons are of arrays read back from the cache against those
made in the same process (copies through a file): any CPU."""

from __future__ import annotations

import numpy as np
import pytest

from mpifl import config
from mpifl.data import cache, datasets


def counting_maker(n: int = 6):
    calls = []

    def make():
        calls.append(1)
        return {"x": np.arange(n * 2, dtype=np.float32).reshape(n, 2) / 3, "y": np.arange(n, dtype=np.int64)}

    return make, calls


def test_second_call_reads_the_first_calls_arrays(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    make, calls = counting_maker()
    a = cache.cached("toy", {"v": 1}, ("x", "y"), make)
    b = cache.cached("toy", {"v": 1}, ("x", "y"), make)
    assert len(calls) == 1
    for k in ("x", "y"):
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])
    cache.cached("toy", {"v": 2}, ("x", "y"), make)  # another key: another file
    assert len(calls) == 2 and len(list(tmp_path.glob("toy-*.npz"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "other_arrays", "ragged"])
def test_a_bad_file_is_made_again_and_replaced(tmp_path, monkeypatch, damage):
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    make, calls = counting_maker()
    path = cache.file_for("toy", {"v": 1, "fields": ["x", "y"]})
    path.parent.mkdir(parents=True, exist_ok=True)
    if damage == "truncate":
        cache.cached("toy", {"v": 1}, ("x", "y"), make)
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "other_arrays":
        np.savez(path, x=np.zeros(6), z=np.zeros(6))
    else:
        np.savez(path, x=np.zeros(6), y=np.zeros(5))
    before = len(calls)
    got = cache.cached("toy", {"v": 1}, ("x", "y"), make)
    assert len(calls) == before + 1
    assert np.array_equal(got["y"], np.arange(6))
    assert np.array_equal(np.load(path)["y"], np.arange(6))


def test_empty_env_disables_and_unwritable_folder_still_makes(tmp_path, monkeypatch):
    make, calls = counting_maker()
    monkeypatch.setenv(cache.ENV, "")
    assert cache.folder() is None
    cache.cached("toy", {"v": 1}, ("x", "y"), make)
    cache.cached("toy", {"v": 1}, ("x", "y"), make)
    assert len(calls) == 2
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(cache.ENV, str(blocker / "sub"))
    assert np.array_equal(cache.cached("toy", {"v": 1}, ("x", "y"), make)["y"], np.arange(6))
    assert len(calls) == 3


@pytest.mark.parametrize("name", ["mnist1d", "digits"])
def test_builtin_dataset_from_cache_is_bitwise_the_made_one(tmp_path, monkeypatch, name):
    cfg = config.load(None, [f"data.name={name}", "data.n_samples=400"]).data
    monkeypatch.setenv(cache.ENV, "")
    made = datasets.load(cfg, 0)
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    first = datasets.load(cfg, 0)  # makes and stores
    assert len(list(tmp_path.glob(f"{name}-*.npz"))) == 1
    read = datasets.load(cfg, 0)
    for pool in (first, read):
        for k in ("x", "y", "test"):
            a, b = getattr(made, k), getattr(pool, k)
            assert (a is None and b is None) or (a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b))


@pytest.mark.slow
def test_flat_fashionmnist_is_read_back_until_its_files_change(tmp_path, monkeypatch):
    from test_datasets import _write_flat_fashion

    flat = tmp_path / "flat"
    _write_flat_fashion(flat, np.random.default_rng(1))
    cfg = config.load(None, ["data.name=fashionmnist", f"data.root={flat}"]).data
    monkeypatch.setenv(cache.ENV, "")
    made = datasets.load(cfg, 0)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    for _ in range(2):  # made and stored, then read back
        pool = datasets.load(cfg, 0)
        for k in ("x", "y", "test", "mean", "std"):
            a, b = getattr(made, k), getattr(pool, k)
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), k
    assert len(list((tmp_path / "cache").glob("fashionmnist-*.npz"))) == 1
    x, _ = _write_flat_fashion(flat, np.random.default_rng(2))  # other images in the same files
    assert np.array_equal(datasets.load(cfg, 0).x[:, 0], x)
