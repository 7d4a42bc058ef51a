"""A dataset's shape from the config alone, nothing loaded: input shape, classes,
samples and bytes per stored value. :mod:`mpifl.run.memory` estimates a run's memory
from it before anything is allocated. Sample counts are the published sizes of
the datasets (train + test) before ``data.subsample``/``data.per_class``, so an
estimate from them is an upper bound of the data; ``features`` is read from its
``.npz`` header and labels."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpifl.schema import DataConfig

# data.emnist_split -> (classes, samples): EMNIST's published splits
EMNIST = {"byclass": (62, 814255), "bymerge": (47, 814255), "balanced": (47, 131600), "letters": (26, 145600),
          "digits": (10, 280000), "mnist": (10, 70000)}
FOLDER_SAMPLES = {"cinic10": 270000, "office10": 2533, "digit5": 0}  # digit5's copies differ: not counted


@dataclass(frozen=True)
class Shape:
    in_shape: tuple[int, ...]
    n_classes: int
    n_samples: int  # in the whole dataset (every rank holds it while partitioning); 0: unknown
    stored_bytes: int  # per value as the pool keeps it: 1 for uint8 images, 4 for float32


def shape(cfg: DataConfig) -> Shape | None:
    """The shape of ``data.name`` as the config sets it; None where it cannot be
    told without the files (a missing ``features`` file: loading it says why)."""
    image_size = cfg.image_size or (64 if cfg.name == "office10" else 32)
    if cfg.name == "digits":
        return Shape((1, 8, 8), 10, 1797, 4)
    if cfg.name == "mnist1d":
        return Shape((40,), 10, cfg.n_samples, 4)
    if cfg.name == "synthetic":
        return Shape((cfg.synthetic_dim,), cfg.synthetic_classes, cfg.n_samples, 4)
    if cfg.name in ("mnist", "fashionmnist"):
        return Shape((1, 28, 28), 10, 70000, 1)
    if cfg.name == "emnist":
        classes, n = EMNIST[cfg.emnist_split]
        return Shape((1, 28, 28), classes, n, 1)
    if cfg.name in ("cifar10", "cifar100"):
        classes = 10 if cfg.name == "cifar10" else (20 if cfg.cifar100_labels == "coarse" else 100)
        return Shape((3, 32, 32), classes, 60000, 1)
    if cfg.name in FOLDER_SAMPLES:
        return Shape((3, image_size, image_size), 10, FOLDER_SAMPLES[cfg.name], 1)
    if cfg.name == "features":
        return _features(cfg.root)
    return None


def _features(root: str) -> Shape | None:
    path = Path(root).expanduser()
    if path.is_dir():
        path = path / "features.npz"
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            x = next(n for n in ("x.npy", "features.npy") if n in names)
            y = next(n for n in ("y.npy", "labels.npy") if n in names)
            with z.open(x) as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                x_shape, _, _ = read(f)
            with z.open(y) as f:
                labels = np.lib.format.read_array(f, allow_pickle=False)
    except (OSError, ValueError, StopIteration, zipfile.BadZipFile):
        return None
    if len(x_shape) < 2 or labels.ndim != 1 or not len(labels):
        return None
    return Shape(tuple(int(d) for d in x_shape[1:]), int(labels.max()) + 1, int(x_shape[0]), 4)
