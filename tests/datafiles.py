"""Tiny datasets written in the real on-disk formats (IDX, CIFAR's pickled
batches, ImageFolder trees of PNGs), for the loader and fetch tests."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np


def write_idx(path: Path, arr: np.ndarray, gz: bool) -> None:
    arr = np.ascontiguousarray(arr, np.uint8)
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    data = header + arr.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def fake_images(g: np.random.Generator, n: int, *shape: int) -> np.ndarray:
    return g.integers(0, 256, (n, *shape), dtype=np.uint8)


def write_cifar(root: Path, n100: bool, g: np.random.Generator, n_train: int = 10, n_test: int = 20) -> dict:
    out = {}
    if not n100:
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True)
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            n = n_test if name == "test_batch" else n_train
            entry = {"data": fake_images(g, n, 3072), "labels": list(g.integers(0, 10, n))}
            out[name] = entry
            (folder / name).write_bytes(pickle.dumps(entry))
        (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
        return out
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    coarse_of = np.arange(100) % 20  # a known fine -> coarse map
    for name, n in (("train", n_train * 5), ("test", 200)):
        fine = np.arange(n) % 100 if name == "test" else g.integers(0, 100, n)  # test covers every class
        entry = {"data": fake_images(g, n, 3072), "fine_labels": list(fine), "coarse_labels": list(coarse_of[fine])}
        out[name] = entry
        (folder / name).write_bytes(pickle.dumps(entry))
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": [f"f{i}" for i in range(100)]}))
    out["coarse_of"] = coarse_of
    return out


def write_png_tree(folder: Path, classes: list[str], n: int, size: int, g: np.random.Generator,
                   mode: str = "RGB") -> None:
    from PIL import Image

    for c in classes:
        (folder / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            shape = (size, size, 3) if mode == "RGB" else (size, size)
            Image.fromarray(g.integers(0, 256, shape, dtype=np.uint8), mode).save(folder / c / f"{i}.png")
