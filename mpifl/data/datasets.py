"""Datasets by name -> one pool of samples.

Built-in, no files: scikit-learn's bundled ``digits``, the ``mnist1d`` generator
(``data.n_samples``) and Gaussian ``synthetic`` blobs.

From ``data.root`` (read-only; nothing is downloaded here: ``python -m mpifl.data
fetch`` puts the torchvision-hosted ones there, docs/data.md says how to prepare
the others):

======================  ========================================================
``mnist``               ``<root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``
``fashionmnist``        ``<root>/FashionMNIST/raw/`` (same files); with no such folder, the same
                        files directly in ``<root>`` or, without ``data.root``, in
                        ``/usr/share/datasets/fashion-mnist`` (Debian's package
                        ``dataset-fashion-mnist``: the real dataset, read in place)
``emnist``              ``<root>/EMNIST/raw/emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]``
``cifar10``             ``<root>/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``
``cifar100``            ``<root>/cifar-100-python/{train,test,meta}``
``cinic10``             ``<root>/CINIC-10/{train,valid,test}/<class>/*.png``
``digit5``              ``<root>/digit5/<domain>/<class>/*`` or ``<domain>/{train,test}/<class>/*``
``office10``            ``<root>/office10/<domain>/<class>/*`` (same)
``features``            ``data.root`` is a ``.npz`` (or a folder holding ``features.npz``):
                        ``x`` (or ``features``), ``y`` (or ``labels``), optional
                        ``domain`` [n] and ``test`` [n] bool
======================  ========================================================

The torchvision layouts are read through torchvision's own dataset classes with
``download=False``. Two deliberate departures, both only about *checking*:
MNIST-style files may be gzipped (torchvision 0.29 reads only the extracted
files, but a shared read-only disk often holds only the ``.gz``), and CIFAR files
are checked for presence rather than md5 (hashing 170 MB on every rank at every
start buys nothing; a corrupt file still fails to unpickle and is reported).

Images stay uint8 in the pool (a rank holds every sample of the dataset while it
partitions, but only its own clients' samples as float32); :meth:`Pool.floats`
scales them to [0, 1] and standardises each channel with the pool's statistics.
The dataset's own test set is kept, flagged by ``Pool.test``; whether clients'
test splits come from it is the data builder's choice (``data.test_source``).
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpifl.data import cache
from mpifl.data.sources import NAMES as FETCHABLE
from mpifl.errors import ConfigError
from mpifl.rng import GLOBAL, rng
from mpifl.schema import DataConfig

BUILTIN = ("digits", "mnist1d", "synthetic")


@dataclass
class Pool:
    x: np.ndarray  # [n, *shape] float32, or uint8 images ([n, C, H, W]) that floats() scales
    y: np.ndarray  # [n] int64
    n_classes: int
    test: np.ndarray | None = None  # [n] bool: in the dataset's own test set (None: it has none)
    domain: np.ndarray | None = None  # [n] int: source domain (digit5, office10, features)
    domain_names: list[str] | None = None
    class_groups: np.ndarray | None = None  # [n_classes] super-class of each class (cifar100 fine)
    mean: np.ndarray | None = None  # [C] per-channel mean of uint8 images scaled to [0, 1]
    std: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def floats(self, idx: np.ndarray) -> np.ndarray:
        """Samples ``idx`` as float32 model inputs."""
        x = self.x[idx]
        if x.dtype == np.float32:
            return x
        x = x.astype(np.float32) / 255.0
        if self.mean is not None:
            x -= self.mean.reshape(1, -1, 1, 1).astype(np.float32)
            x /= self.std.reshape(1, -1, 1, 1).astype(np.float32)
        return x

    def select(self, keep: np.ndarray) -> Pool:
        def take(a):
            return None if a is None else a[keep]

        return Pool(self.x[keep], self.y[keep], self.n_classes, take(self.test), take(self.domain),
                    self.domain_names, self.class_groups, self.mean, self.std)


def _channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean/std of uint8 images [n, C, H, W] in [0, 1], without a float copy."""
    n = len(x)
    mean = np.zeros(x.shape[1])
    sq = np.zeros(x.shape[1])
    for a in range(0, n, 4096):
        chunk = x[a:a + 4096].astype(np.float64) / 255.0
        mean += chunk.sum(axis=(0, 2, 3))
        sq += (chunk * chunk).sum(axis=(0, 2, 3))
    count = n * x.shape[2] * x.shape[3]
    mean /= max(count, 1)
    std = np.sqrt(np.maximum(sq / max(count, 1) - mean * mean, 0.0))
    return mean.astype(np.float32), np.maximum(std, 1e-3).astype(np.float32)


def _image_pool(x: np.ndarray, y: np.ndarray, n_classes: int, **kw) -> Pool:
    mean, std = _channel_stats(x)
    return Pool(np.ascontiguousarray(x), y.astype(np.int64), n_classes, mean=mean, std=std, **kw)


# --------------------------------------------------------------------------- built-in


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def digits(cfg: DataConfig) -> Pool:
    def make() -> dict[str, np.ndarray]:
        from sklearn.datasets import load_digits

        d = load_digits()
        x = (d.images.astype(np.float32) / 16.0)[:, None]  # [n, 1, 8, 8], pixels in [0, 1]
        return {"x": x, "y": d.target.astype(np.int64)}

    a = cache.cached("digits", {"scikit-learn": _version("scikit-learn"), "numpy": np.__version__},
                     ("x", "y"), make)
    return Pool(a["x"], a["y"], 10)


def mnist1d(cfg: DataConfig) -> Pool:
    def make() -> dict[str, np.ndarray]:
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples = cfg.n_samples
        # mnist1d seeds numpy's global generator; keep the caller's state intact
        state = np.random.get_state()
        try:
            d = make_dataset(args)
        finally:
            np.random.set_state(state)
        x = np.concatenate([d["x"], d["x_test"]]).astype(np.float32)
        y = np.concatenate([d["y"], d["y_test"]]).astype(np.int64)
        test = np.r_[np.zeros(len(d["y"]), bool), np.ones(len(d["y_test"]), bool)]
        return {"x": (x - x.mean()) / x.std(), "y": y, "test": test}

    key = {"n_samples": cfg.n_samples, "mnist1d": _version("mnist1d"), "numpy": np.__version__,
           "scipy": _version("scipy")}
    a = cache.cached("mnist1d", key, ("x", "y", "test"), make)
    return Pool(a["x"], a["y"], 10, test=a["test"])


def synthetic(cfg: DataConfig, seed: int = 0) -> Pool:
    """Gaussian blobs, one per class: fast data for tests."""
    g = np.random.default_rng([seed, 7])
    centers = g.normal(0, 1.0, (cfg.synthetic_classes, cfg.synthetic_dim))
    y = g.integers(0, cfg.synthetic_classes, cfg.n_samples)
    x = centers[y] + g.normal(0, 0.7, (cfg.n_samples, cfg.synthetic_dim))
    return Pool(x.astype(np.float32), y.astype(np.int64), cfg.synthetic_classes)


# --------------------------------------------------------------------------- on disk: helpers


def _missing(name: str, path: Path | str, expected: str, why: str = "") -> ConfigError:
    extra = f" ({why})" if why else ""
    return ConfigError(f"data.name={name!r}: no usable dataset at {str(path)!r}{extra}; expected {expected}; "
                       f"set data.root to the folder that holds it (nothing is downloaded{_fetch_hint(name)})")


def _fetch_hint(name: str) -> str:
    """How to put a downloadable dataset onto disk, as a clause; "" for the others."""
    return f"; python -m mpifl.data fetch {name} --root DIR puts it there" if name in FETCHABLE else ""


def _root(cfg: DataConfig) -> Path:
    if not cfg.root:
        raise ConfigError(f"data.name={cfg.name!r} is read from disk: set data.root=PATH (the folder holding it"
                          f"{_fetch_hint(cfg.name)}; docs/data.md lists the layouts read)")
    return Path(cfg.root).expanduser()


def _read_idx(path: str) -> np.ndarray:
    """An IDX file (MNIST format) of uint8, raw or gzipped. Read here rather than by
    torchvision's reader: importing torchvision costs more than reading the file."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            data = f.read()
    else:
        path += ".gz"
        with gzip.open(path, "rb") as f:
            data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    nd, ty = magic % 256, magic // 256
    if ty != 8 or not 1 <= nd <= 3:  # MNIST-family files are uint8
        raise ValueError(f"{path} is not an uint8 IDX file (type {ty}, {nd} dims)")
    dims = [int.from_bytes(data[4 * (i + 1):4 * (i + 2)], "big") for i in range(nd)]
    n = int(np.prod(dims))
    if len(data) < 4 * (nd + 1) + n:
        raise ValueError(f"{path} is shorter than its header's {dims}")
    return np.frombuffer(data, np.uint8, offset=4 * (nd + 1), count=n).reshape(dims)


def _idx_exists(path: str) -> bool:
    return os.path.isfile(path) or os.path.isfile(path + ".gz")


# Debian's dataset-fashion-mnist installs the four IDX .gz files here
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
_FLAT = [f"{p}-{k}-ubyte" for p in ("train", "t10k") for k in ("images-idx3", "labels-idx1")]


def data_path(cfg: DataConfig) -> Path | None:
    """Where the run reads its dataset: ``data.root``; with none, the folder a
    dataset falls back to (Debian's Fashion-MNIST for fashionmnist); None for
    built-in data, or for an on-disk dataset with no root and no fallback. The one
    rule for what the preflight (``mpifl.check``, ``sweep --submit``) checks."""
    if cfg.name in BUILTIN:
        return None
    if cfg.root:
        return Path(cfg.root).expanduser()
    return DEBIAN_FASHION_MNIST if cfg.name == "fashionmnist" else None


def _flat_folder(cfg: DataConfig) -> Path | None:
    """A folder holding the four MNIST-style IDX files themselves (Debian's layout),
    used for fashionmnist when ``data.root`` has no torchvision layout."""
    if cfg.name != "fashionmnist":
        return None
    d = data_path(cfg)
    if cfg.root and (d / "FashionMNIST" / "raw").is_dir():
        return None
    if all(_idx_exists(str(d / f)) for f in _FLAT):
        return d
    if not cfg.root:
        raise ConfigError("data.name='fashionmnist' needs its files: install Debian's package dataset-fashion-mnist "
                          f"(read in place from {str(DEBIAN_FASHION_MNIST)!r}) or set data.root=PATH "
                          "(a folder with FashionMNIST/raw/ or the four IDX files)")
    return None


def _flat_pool(cfg: DataConfig, flat: Path) -> Pool:
    """The four IDX files of ``flat``, decoded once and then read back from the
    cache (keyed by the files' inode, size and modification time)."""
    expected = f"{flat}/{{{','.join(_FLAT)}}}[.gz]"

    def make() -> dict[str, np.ndarray]:
        try:
            xs = [_read_idx(str(flat / f)) for f in _FLAT[0::2]]
            ys = [_read_idx(str(flat / f)).astype(np.int64).reshape(-1) for f in _FLAT[1::2]]
        except (OSError, ValueError, EOFError) as e:
            raise _missing(cfg.name, flat, expected, f"unreadable: {e}") from e
        if any(len(x) != len(y) or x.ndim != 3 for x, y in zip(xs, ys)) or min(y.min() for y in ys) < 0 \
                or max(y.max() for y in ys) > 9:
            raise _missing(cfg.name, flat, "Fashion-MNIST's IDX files", "images and labels disagree")
        test = np.r_[np.zeros(len(ys[0]), bool), np.ones(len(ys[1]), bool)]
        pool = _image_pool(np.concatenate(xs)[:, None], np.concatenate(ys), 10, test=test)
        return {"x": pool.x, "y": pool.y, "test": pool.test, "mean": pool.mean, "std": pool.std}

    files = []
    for f in _FLAT:
        path = flat / f if (flat / f).is_file() else flat / f"{f}.gz"
        try:
            st = path.stat()
        except OSError as e:
            raise _missing(cfg.name, flat, expected, f"unreadable: {e}") from e
        files.append([str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns])
    a = cache.cached(cfg.name, {"files": files, "numpy": np.__version__}, ("x", "y", "test", "mean", "std"), make,
                     rows=("x", "y", "test"))
    return Pool(a["x"], a["y"], 10, test=a["test"], mean=a["mean"], std=a["std"])


def _mnist_family(cfg: DataConfig) -> Pool:
    flat = _flat_folder(cfg)
    if flat is not None:
        return _flat_pool(cfg, flat)
    from torchvision import datasets as tvd

    root = _root(cfg)
    if cfg.name == "emnist":
        base, split = tvd.EMNIST, cfg.emnist_split

        class Cls(base):
            def __init__(self, train: bool):
                super().__init__(str(root), split=split, train=train, download=False)

            def _check_exists(self) -> bool:
                return _idx_exists(self.images_file) and _idx_exists(self.labels_file)

            def _load_data(self):
                return _read_idx(self.images_file), _read_idx(self.labels_file)

        folder, files = "EMNIST", [f"emnist-{split}-{p}-{k}-ubyte" for p in ("train", "test")
                                   for k in ("images-idx3", "labels-idx1")]
    else:
        base = tvd.MNIST if cfg.name == "mnist" else tvd.FashionMNIST

        class Cls(base):
            def __init__(self, train: bool):
                super().__init__(str(root), train=train, download=False)

            def _check_legacy_exist(self) -> bool:
                return False

            def _check_exists(self) -> bool:
                return all(_idx_exists(os.path.join(self.raw_folder, f[:-3])) for f, _ in self.resources)

            def _load_data(self):
                p = "train" if self.train else "t10k"
                return (_read_idx(os.path.join(self.raw_folder, f"{p}-images-idx3-ubyte")),
                        _read_idx(os.path.join(self.raw_folder, f"{p}-labels-idx1-ubyte")))

        folder = base.__name__
        files = [f[:-3] for f, _ in base.resources]
    Cls.__name__ = base.__name__  # torchvision names the raw folder after the class
    where = root / folder / "raw"
    expected = f"{where}/{{{','.join(files)}}}[.gz] (IDX files, as torchvision stores them)"
    if cfg.name == "fashionmnist":  # Debian's layout, which _flat_folder reads
        expected += f", or {root}/{{{','.join(_FLAT)}}}[.gz] (the four files in the folder itself, as Debian's " \
                    f"dataset-fashion-mnist installs them)"
    try:
        parts = [Cls(train=True), Cls(train=False)]
    except RuntimeError as e:
        raise _missing(cfg.name, where, expected) from e
    except (OSError, ValueError, AssertionError, TypeError, EOFError) as e:
        raise _missing(cfg.name, where, expected, f"unreadable: {e}") from e
    xs = [np.asarray(p.data, np.uint8) for p in parts]
    ys = [np.asarray(p.targets, np.int64).reshape(-1) for p in parts]
    if any(len(x) != len(y) or x.ndim != 3 for x, y in zip(xs, ys)):
        raise _missing(cfg.name, where, expected, "images and labels disagree in count or shape")
    x = np.concatenate(xs)[:, None]  # [n, 1, 28, 28]
    y = np.concatenate(ys)
    n_classes = len(parts[0].classes)
    if cfg.name == "emnist":
        x = x.transpose(0, 1, 3, 2)  # EMNIST images are stored transposed
        if split == "letters":  # labels 1..26 ('N/A' is class 0 and never used)
            y, n_classes = y - 1, 26
    if y.min() < 0 or y.max() >= n_classes:
        raise _missing(cfg.name, where, expected, f"labels outside 0..{n_classes - 1}")
    test = np.r_[np.zeros(len(ys[0]), bool), np.ones(len(ys[1]), bool)]
    return _image_pool(x, y, n_classes, test=test)


def _cifar(cfg: DataConfig) -> Pool:
    import pickle

    from torchvision import datasets as tvd

    from mpifl.data import unpickle

    root = _root(cfg)
    base = tvd.CIFAR10 if cfg.name == "cifar10" else tvd.CIFAR100  # file names only: it would pickle.load them
    where = root / base.base_folder
    files = [f for f, _ in base.train_list + base.test_list] + [base.meta["filename"]]
    expected = f"{where}/{{{','.join(files)}}} (python pickles, as torchvision stores them)"
    if not all((where / f).is_file() for f in files):
        raise _missing(cfg.name, where, expected)
    try:
        parts = [[unpickle.load(where / f) for f, _ in lst] for lst in (base.train_list, base.test_list)]
        classes = unpickle.load(where / base.meta["filename"])[base.meta["key"]]
        xs, ys = [], []
        for entries in parts:
            xs.append(np.concatenate([np.asarray(e["data"], np.uint8).reshape(-1, 3, 32, 32) for e in entries]))
            ys.append(np.concatenate([np.asarray(e["labels"] if "labels" in e else e["fine_labels"], np.int64)
                                      for e in entries]))
            if len(xs[-1]) != len(ys[-1]):
                raise ValueError("images and labels disagree in count")
        coarse = None
        if cfg.name == "cifar100":  # the test batch's pairs give the fine -> coarse map
            entry = parts[1][0]
            coarse = np.zeros(100, np.int64)
            coarse[np.asarray(entry["fine_labels"], np.int64)] = np.asarray(entry["coarse_labels"], np.int64)
    except (OSError, ValueError, KeyError, TypeError, EOFError, pickle.UnpicklingError, IndexError) as e:
        raise _missing(cfg.name, where, expected, f"unreadable: {type(e).__name__}: {str(e)[:200]}") from e
    x = np.concatenate(xs)  # [n, 3, 32, 32]
    y = np.concatenate(ys)
    test = np.r_[np.zeros(len(ys[0]), bool), np.ones(len(ys[1]), bool)]
    n_classes = len(classes)
    groups = None
    if coarse is not None:
        if cfg.cifar100_labels == "coarse":
            y, n_classes = coarse[y], 20
        else:
            groups = coarse
    return _image_pool(x, y, n_classes, test=test, class_groups=groups)


IMAGE_EXT = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")


def image_folder(path: Path):
    """The ImageFolder tree at ``path``: its classes and (file, class) samples, nothing decoded."""
    from torchvision.datasets import ImageFolder

    return ImageFolder(str(path), allow_empty=False)


def image_folders(name: str, root: Path) -> tuple[Path, str, list[str], list[tuple[int, Path, bool]]]:
    """Where cinic10, digit5 or office10 lies under ``root``: (its folder, the layout
    in words, domain names, [(domain, ImageFolder path, is test)])."""
    if name == "cinic10":
        where = root / "CINIC-10"
        expected = f"{where}/{{train,valid,test}}/<class>/*.png (ImageFolder trees)"
        return where, expected, ["cinic10"], [(0, where / s, s == "test") for s in ("train", "valid", "test")]
    where = root / name
    expected = (f"{where}/<domain>/<class>/*.png, or {where}/<domain>/{{train,test}}/<class>/*.png "
                "(one ImageFolder tree per domain)")
    if not where.is_dir():
        return where, expected, [], []
    names = sorted(p.name for p in where.iterdir() if p.is_dir() and not p.name.startswith("."))
    folders = []
    for d, domain in enumerate(names):
        sub = [s for s in ("train", "val", "valid", "test") if (where / domain / s).is_dir()]
        if sub:
            folders += [(d, where / domain / s, s == "test") for s in sub]
        else:
            folders.append((d, where / domain, False))
    return where, expected, names, folders


def _folder_pool(cfg: DataConfig, seed: int) -> Pool:
    """cinic10 (splits of one domain), digit5 and office10 (one folder per domain)."""
    from PIL import Image

    root = _root(cfg)
    size = cfg.image_size or (64 if cfg.name == "office10" else 32)
    where, expected, names, folders = image_folders(cfg.name, root)
    if cfg.name != "cinic10" and not where.is_dir():
        raise _missing(cfg.name, where, expected, "folder not found")
    if not folders:
        raise _missing(cfg.name, where, expected, "no domain folders")
    samples, classes = [], None
    for d, path, is_test in folders:
        if not path.is_dir():
            raise _missing(cfg.name, path, expected, "folder not found")
        try:
            ds = image_folder(path)
        except (FileNotFoundError, OSError) as e:
            raise _missing(cfg.name, path, expected, str(e).splitlines()[0]) from e
        if classes is None:
            classes = ds.classes
        elif ds.classes != classes:
            raise _missing(cfg.name, path, expected, f"class folders {ds.classes} differ from {classes}")
        samples += [(p, c, d, is_test) for p, c in ds.samples]
    y = np.array([s[1] for s in samples], np.int64)
    dom = np.array([s[2] for s in samples], np.int64)
    test = np.array([s[3] for s in samples], bool)
    keep = _keep(y, dom * 2 + test, cfg, seed)  # choose before decoding: decoding is the cost
    x = np.empty((len(keep), 3, size, size), np.uint8)
    for k, i in enumerate(keep):
        try:
            with Image.open(samples[i][0]) as im:
                im = im.convert("RGB").resize((size, size), Image.BILINEAR)
                x[k] = np.asarray(im, np.uint8).transpose(2, 0, 1)
        except OSError as e:
            raise _missing(cfg.name, samples[i][0], expected, f"unreadable image: {e}") from e
    has_test = bool(test.any())
    return _image_pool(x, y[keep], len(classes), test=test[keep] if has_test else None,
                       domain=dom[keep] if cfg.name != "cinic10" else None,
                       domain_names=names if cfg.name != "cinic10" else None)


def _features(cfg: DataConfig) -> Pool:
    path = Path(cfg.root).expanduser()
    if path.is_dir():
        path = path / "features.npz"
    expected = ("a .npz (data.root, or <data.root>/features.npz) with arrays x (or features) [n, d] and "
                "y (or labels) [n], optional domain [n], test [n]")
    if not path.is_file():
        raise _missing(cfg.name, path, expected, "file not found")
    try:
        with np.load(path) as z:
            keys = set(z.files)
            xk = "x" if "x" in keys else "features"
            yk = "y" if "y" in keys else "labels"
            if xk not in keys or yk not in keys:
                raise ValueError(f"arrays present: {sorted(keys)}")
            x = np.asarray(z[xk], np.float32)
            y = np.asarray(z[yk]).astype(np.int64)
            dom = np.asarray(z["domain"]).astype(np.int64) if "domain" in keys else None
            test = np.asarray(z["test"]).astype(bool) if "test" in keys else None
    except (OSError, ValueError, EOFError) as e:
        raise _missing(cfg.name, path, expected, f"unreadable: {e}") from e
    n = len(y)
    if x.ndim < 2 or len(x) != n or y.ndim != 1 or y.min() < 0 or any(
            a is not None and a.shape != (n,) for a in (dom, test)):
        raise _missing(cfg.name, path, expected, f"shapes x{x.shape} y{y.shape} do not fit")
    names = [str(d) for d in range(int(dom.max()) + 1)] if dom is not None else None
    return Pool(x, y, int(y.max()) + 1, test=test, domain=dom, domain_names=names)


# --------------------------------------------------------------------------- selection


def _keep(y: np.ndarray, strata: np.ndarray, cfg: DataConfig, seed: int) -> np.ndarray:
    """Sorted indices kept by ``data.subsample`` / ``data.per_class``, chosen per
    (class, stratum) with a seeded draw."""
    if cfg.subsample >= 1 and cfg.per_class == 0:
        return np.arange(len(y))
    g = rng(seed, -1, GLOBAL, "subsample")
    keys = strata.astype(np.int64) * (int(y.max()) + 1 if len(y) else 1) + y
    keep = []
    for k in np.unique(keys):
        idx = g.permutation(np.flatnonzero(keys == k))
        m = max(1, round(cfg.subsample * len(idx)))
        if cfg.per_class:
            m = min(m, cfg.per_class)
        keep.append(idx[:m])
    return np.sort(np.concatenate(keep)) if keep else np.arange(0)


def load(cfg: DataConfig, seed: int) -> Pool:
    if cfg.name == "digits":
        pool = digits(cfg)
    elif cfg.name == "mnist1d":
        pool = mnist1d(cfg)
    elif cfg.name == "synthetic":
        pool = synthetic(cfg, seed)
    elif cfg.name in ("mnist", "fashionmnist", "emnist"):
        pool = _mnist_family(cfg)
    elif cfg.name in ("cifar10", "cifar100"):
        pool = _cifar(cfg)
    elif cfg.name in ("cinic10", "digit5", "office10"):
        return _folder_pool(cfg, seed)  # already subsampled, before decoding
    elif cfg.name == "features":
        pool = _features(cfg)
    else:
        raise ConfigError(f"data.name={cfg.name!r} is not allowed")
    strata = np.zeros(len(pool.y), np.int64)
    if pool.domain is not None:
        strata = pool.domain * 2
    if pool.test is not None:
        strata = strata + pool.test
    keep = _keep(pool.y, strata, cfg, seed)
    return pool if len(keep) == len(pool.y) else pool.select(keep)
