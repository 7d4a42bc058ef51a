"""The datasets ``python -m mpifl.data fetch`` downloads: torchvision's own
mirrors, file names and md5 checksums, and the folder under ``data.root`` that a
complete copy fills (the one :mod:`mpifl.data.datasets` reads).

Everything here is read from torchvision's dataset classes, so a torchvision
upgrade that moves a mirror moves it here too. What fetch writes:

======================  =====================================================
``mnist``               ``MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``
``fashionmnist``        ``FashionMNIST/raw/`` (the same four names)
``emnist``              ``EMNIST/raw/emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte.gz``
                        for the six splits, and ``MD5SUMS``
``cifar10``             ``cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``
``cifar100``            ``cifar-100-python/{train,test,meta}``
======================  =====================================================

The IDX files stay gzipped: those are the files whose md5 torchvision publishes,
and mpifl reads them as they are. EMNIST is published as one large (over 500 MB)
``gzip.zip`` with one md5; fetch checks it, keeps the 24 ``.gz`` files inside it
and records their md5s in ``MD5SUMS`` (``md5sum -c`` reads it), so that the copy
can be checked again later without the archive.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMES = ("mnist", "fashionmnist", "emnist", "cifar10", "cifar100")
MD5SUMS = "MD5SUMS"  # md5s fetch derived itself (from an archive whose md5 it checked), md5sum's format
# md5 of each IDX file's gunzipped bytes: a copy recompressed elsewhere (Debian's
# dataset-fashion-mnist) differs from torchvision's .gz in bytes, not in content,
# so an intact copy of it is recognised by what it decodes to wherever it lies
CONTENT_MD5 = {
    "fashionmnist": {
        "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
    },
}


@dataclass(frozen=True)
class Download:
    filename: str  # as served: the URL is a mirror followed by this name
    md5: str


@dataclass(frozen=True)
class File:
    """One file of a complete copy, as mpifl reads it."""

    name: str  # relative to the dataset's folder
    md5: str | None  # None: torchvision publishes none; MD5SUMS in the folder holds it
    idx: bool = False  # an IDX file: read as ``name`` or ``name.gz``; the md5 is the ``.gz`` file's
    content_md5: str | None = None  # IDX: md5 of the gunzipped bytes, for a .gz compressed by another tool


@dataclass(frozen=True)
class Source:
    name: str  # as data.name spells it
    folder: str  # under data.root: what fetch creates and what a complete copy fills
    mirrors: tuple[str, ...]  # base URLs tried in turn, each ending in "/"
    downloads: tuple[Download, ...]
    files: tuple[File, ...]
    unpack: str  # "idx": the downloads are the files; "zip": EMNIST's gzip.zip; "tar": one folder inside


def _idx_files(split_prefix: str = "") -> list[str]:
    parts = ("train", "test") if split_prefix else ("train", "t10k")
    return [f"{split_prefix}{p}-{k}-ubyte" for p in parts for k in ("images-idx3", "labels-idx1")]


def table() -> dict[str, Source]:
    """Every dataset fetch knows, by data.name."""
    from torchvision import datasets as tvd

    out = {}
    for name, cls in (("mnist", tvd.MNIST), ("fashionmnist", tvd.FashionMNIST)):
        out[name] = Source(name, f"{cls.__name__}/raw", tuple(cls.mirrors),
                           tuple(Download(f, m) for f, m in cls.resources),
                           tuple(File(f[:-len(".gz")], m, idx=True,
                                      content_md5=CONTENT_MD5.get(name, {}).get(f[:-len(".gz")]))
                                 for f, m in cls.resources), "idx")
    base, zipname = tvd.EMNIST.url.rsplit("/", 1)
    out["emnist"] = Source("emnist", "EMNIST/raw", (base + "/",), (Download(zipname, tvd.EMNIST.md5),),
                           tuple(File(f, None, idx=True) for s in tvd.EMNIST.splits
                                 for f in _idx_files(f"emnist-{s}-")), "zip")
    for name, cls in (("cifar10", tvd.CIFAR10), ("cifar100", tvd.CIFAR100)):
        base = cls.url.rsplit("/", 1)[0] + "/"
        files = [File(f, m) for f, m in cls.train_list + cls.test_list]
        files.append(File(cls.meta["filename"], cls.meta["md5"]))
        out[name] = Source(name, cls.base_folder, (base,), (Download(cls.filename, cls.tgz_md5),), tuple(files),
                           "tar")
    return out
