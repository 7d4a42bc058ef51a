"""``python -m mpifl.data verify --root DIR [NAME ...]``: what a ``data.root``
holds, one line per dataset, before a job is queued on it.

The downloadable datasets (:mod:`mpifl.data.sources`) are checked file by file
against torchvision's md5s (EMNIST's against the ``MD5SUMS`` fetch wrote), or, for a
``.gz`` compressed by another tool, by the md5 of its gunzipped bytes
(``sources.CONTENT_MD5``: Fashion-MNIST as Debian ships it, wherever it was
copied), in the layout :mod:`mpifl.data.datasets` reads: ``present``, ``missing: <files>`` or
``bad checksum: <files>``. An IDX file found both extracted and gzipped is
read extracted, so the extracted one is compared with the checked ``.gz``; one
found only extracted (another tool unpacked it and dropped the ``.gz``) has no
published md5 and is reported unchecked. Fashion-MNIST is also found as the four
files directly in DIR (Debian's ``dataset-fashion-mnist`` layout; in the
package's own folder they are checked against the package's md5sums, since
Debian recompressed them and torchvision's md5s are of the upstream ``.gz``).
The hand-prepared image folders (cinic10, digit5, office10) and the
``features`` file have no published checksums: their layout is checked the way
``data.root`` reads it (``bad layout: ...`` when it would refuse them), no
image decoded.

Exit status: 0 when every dataset found is complete and intact (a dataset
absent altogether is fine, unless NAMEs were given: then each must be
present), 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from torchvision.datasets.utils import calculate_md5

from mpifl.data import datasets, sources
from mpifl.data.sources import MD5SUMS, Source
from mpifl.errors import ConfigError

FOLDER_DATASETS = ("cinic10", "digit5", "office10")
ALL = (*sources.NAMES, *FOLDER_DATASETS, "features")
# dpkg's record of the files package dataset-fashion-mnist installed, with their md5s
DEBIAN_MD5SUMS = Path("/var/lib/dpkg/info/dataset-fashion-mnist.md5sums")


@dataclass
class Status:
    absent: bool = False  # nothing of the dataset is there
    missing: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)  # md5 differs
    layout: list[str] = field(default_factory=list)  # hand-prepared folders that data.root would refuse
    unchecked: list[str] = field(default_factory=list)  # present, but no md5 to compare with
    note: str = ""  # where, and how it was checked; for an absent dataset, how to get it

    @property
    def ok(self) -> bool:
        return not (self.absent or self.missing or self.bad or self.layout)

    def text(self) -> str:
        parts = []
        if self.bad:
            parts.append("bad checksum: " + ", ".join(self.bad))
        if self.missing:
            parts.append("missing: " + ", ".join(self.missing) + (f" ({self.note})" if self.absent else ""))
        if self.layout:
            parts.append("bad layout: " + "; ".join(self.layout))
        if parts:
            return "; ".join(parts)
        extra = f"; no md5 to check {len(self.unchecked)} of them: {', '.join(self.unchecked[:3])}" \
                f"{', ...' if len(self.unchecked) > 3 else ''}" if self.unchecked else ""
        return f"present: {self.note}{extra}"


def read_md5sums(path: Path) -> dict[str, str]:
    """``md5  name`` lines (md5sum's format) -> {base name: md5}; {} when there is no such file."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        md5, _, name = line.strip().partition(" ")
        if name:
            out[Path(name.strip().lstrip("*")).name] = md5
    return out


def _same_as_gunzipped(path: Path, gz: Path, chunk: int = 1 << 20) -> bool:
    try:
        with open(path, "rb") as a, gzip.open(gz, "rb") as b:
            while True:
                x, y = a.read(chunk), b.read(chunk)
                if x != y:
                    return False
                if not x:
                    return True
    except (OSError, EOFError):
        return False


def gunzipped_md5(gz: Path, chunk: int = 1 << 20) -> str | None:
    """md5 of ``gz``'s decompressed bytes; None when it does not decompress."""
    import hashlib

    h = hashlib.md5()
    try:
        with gzip.open(gz, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    return h.hexdigest()


def intact(path: Path, md5: str, content_md5: str | None) -> bool:
    """``path`` has ``md5``, or (a .gz another tool compressed) decodes to bytes of ``content_md5``."""
    return calculate_md5(path) == md5 or (content_md5 is not None and gunzipped_md5(path) == content_md5)


def check(folder: Path, src: Source, md5s: dict[str, str] | None = None) -> Status:
    """``folder`` against ``src``'s files. Each file's md5 comes from ``md5s`` (by
    file name), else from ``src`` (torchvision's), else from the folder's MD5SUMS."""
    if not folder.is_dir():
        return Status(absent=True, missing=[f"{src.folder}/"])
    derived = read_md5sums(folder / MD5SUMS)
    st = Status()
    n_checked = n_derived = 0
    for f in src.files:
        gz = folder / (f.name + ".gz")
        plain = folder / f.name
        on_disk = gz if f.idx else plain
        if f.idx and not gz.is_file():
            if plain.is_file():
                st.unchecked.append(f.name)
            else:
                st.missing.append(f"{f.name}[.gz]")
            continue
        if not on_disk.is_file():
            st.missing.append(f.name)
            continue
        expected = (md5s or {}).get(on_disk.name) or f.md5
        from_sums = expected is None and on_disk.name in derived
        expected = expected or derived.get(on_disk.name)
        if expected is None:
            st.unchecked.append(on_disk.name)
        elif not intact(on_disk, expected, f.content_md5 if f.idx else None):
            st.bad.append(on_disk.name)
            continue
        else:
            n_checked += 1
            n_derived += from_sums
        if f.idx and plain.is_file() and not _same_as_gunzipped(plain, gz):
            st.bad.append(f"{f.name} (differs from {gz.name})")  # the extracted file is the one read
    if st.missing and len(st.missing) == len(src.files):
        st.absent = True
    st.note = f"{folder} ({n_checked} of {len(src.files)} files md5-checked" + (
        f", {n_derived} against the {MD5SUMS} fetch wrote)" if n_derived else ")")
    return st


def _fashion_flat(root: Path, src: Source) -> Status | None:
    """Debian's layout (the four files directly in root), when there is no FashionMNIST/raw."""
    if (root / src.folder).is_dir():
        return None
    if not any((root / (f.name + ext)).is_file() for f in src.files for ext in ("", ".gz")):
        return None
    debian = root.resolve() == datasets.DEBIAN_FASHION_MNIST.resolve() and DEBIAN_MD5SUMS.is_file()
    st = check(root, src, read_md5sums(DEBIAN_MD5SUMS) if debian else None)
    st.note = st.note.replace("md5-checked", "md5-checked against Debian's package" if debian else "md5-checked")
    return st


def folder_status(name: str, root: Path) -> Status:
    """cinic10/digit5/office10: the ImageFolder trees datasets.py would read, scanned, not decoded."""
    where, _expected, _names, folders = datasets.image_folders(name, root)
    if not where.is_dir():
        return Status(absent=True, missing=[f"{where.name}/"], note="prepared by hand: see docs/data.md")
    if not folders:
        return Status(layout=[f"{where.name}/ holds no domain folder"])
    classes, n = None, 0
    for _d, path, _test in folders:
        rel = str(path.relative_to(root))
        if not path.is_dir():
            return Status(missing=[rel + "/"])
        try:
            ds = datasets.image_folder(path)
        except (FileNotFoundError, OSError) as e:
            return Status(layout=[f"{rel}: {str(e).splitlines()[0]}"])
        if classes is not None and ds.classes != classes:
            return Status(layout=[f"{rel}: class folders {ds.classes} differ from {classes}"])
        classes = ds.classes
        n += len(ds.samples)
    return Status(note=f"{where} ({len(folders)} folders, {len(classes)} classes, {n} images; no checksums "
                       "published, layout only)")


def features_status(root: Path) -> Status:
    import zipfile

    path = root / "features.npz"
    if not path.is_file():
        return Status(absent=True, missing=["features.npz"], note="prepared by hand: see docs/data.md")
    try:
        with zipfile.ZipFile(path) as z:
            keys = {n.removesuffix(".npy") for n in z.namelist()}
    except (OSError, zipfile.BadZipFile) as e:
        return Status(layout=[f"features.npz: unreadable ({e})"])
    if not ({"x", "features"} & keys and {"y", "labels"} & keys):
        return Status(layout=[f"features.npz needs arrays x (or features) and y (or labels); it holds {sorted(keys)}"])
    return Status(note=f"{path} (arrays {', '.join(sorted(keys))}; layout only)")


def status(name: str, root: Path, table: dict[str, Source]) -> Status:
    if name in table:
        src = table[name]
        st = check(root / src.folder, src)
        if name == "fashionmnist" and st.absent:
            st = _fashion_flat(root, src) or st
        if st.absent:
            st.note = f"python -m mpifl.data fetch {name} --root {root}"
        return st
    if name in FOLDER_DATASETS:
        return folder_status(name, root)
    return features_status(root)


def report(root: Path | str, names: list[str] | None = None, table: dict[str, Source] | None = None,
           out: Callable[[str], None] = print) -> int:
    """One line per dataset to ``out``; the exit status (module docstring)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ConfigError(f"--root {str(root)!r} is not a folder")
    unknown = [n for n in names or [] if n not in ALL]
    if unknown:
        raise ConfigError(f"verify: {unknown[0]!r} is not a dataset it knows; one of {', '.join(ALL)}")
    table = sources.table() if table is None else table
    wanted = list(names or ALL)
    out(f"verify: {root}")
    broken = 0
    for name in wanted:
        try:
            st = status(name, root, table)
        except OSError as e:  # a file there that this user may not read: the job could not either
            st = Status(missing=[f"{e.filename} (unreadable: {e.strerror})"])
        out(f"  {name:<13} {st.text()}")
        broken += not st.ok and (bool(names) or not st.absent)
    out(f"verify: {'ok' if not broken else f'{broken} dataset(s) incomplete or damaged'}")
    return 1 if broken else 0
