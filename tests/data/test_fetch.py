"""``python -m mpifl.data fetch`` and ``verify``, offline: tiny archives in each
real format (IDX .gz files, EMNIST's gzip.zip, CIFAR's tar.gz of pickled
batches) with their own md5s, served over HTTP from 127.0.0.1; what fetch
writes is read back through ``data.root``; failures are one line, exit 2, and
leave nothing that looks complete.

Bits: the exact comparisons are of images and labels read back as fetched (integers,
no arithmetic)."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import zipfile
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from datafiles import fake_images, write_cifar, write_idx, write_png_tree
from helpers import REPO

from mpifl import config
from mpifl.data import datasets, sources, verify
from mpifl.data.__main__ import main
from mpifl.errors import ConfigError


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def build_archives(served: Path, real: dict[str, sources.Source]) -> tuple[dict, dict]:
    """One folder per dataset under ``served`` holding what torchvision's mirrors hold,
    in miniature; (the table with these files' md5s, the arrays written)."""
    g = np.random.default_rng(0)
    table, arrays = {}, {}
    for name in ("mnist", "fashionmnist"):
        src = real[name]
        x = {p: fake_images(g, n, 28, 28) for p, n in (("train", 30), ("t10k", 12))}
        y = {p: g.integers(0, 10, len(x[p])) for p in x}
        for p in x:
            write_idx(served / name / f"{p}-images-idx3-ubyte", x[p], gz=True)
            write_idx(served / name / f"{p}-labels-idx1-ubyte", y[p], gz=True)
        sums = {d.filename: md5(served / name / d.filename) for d in src.downloads}
        table[name] = dataclasses.replace(
            src, downloads=tuple(dataclasses.replace(d, md5=sums[d.filename]) for d in src.downloads),
            files=tuple(dataclasses.replace(f, md5=sums[f.name + ".gz"]) for f in src.files))
        arrays[name] = (np.concatenate([x["train"], x["t10k"]]), np.concatenate([y["train"], y["t10k"]]))
    # EMNIST: one zip, gzip/<every split's four files>.gz and a mapping file torchvision drops
    src = real["emnist"]
    (served / "emnist").mkdir()
    with zipfile.ZipFile(served / "emnist" / "gzip.zip", "w") as z:
        for f in src.files:
            n = 10 if "-train-" in f.name else 4
            arr = fake_images(g, n, 28, 28) if "images" in f.name else g.integers(0, 10, n).astype(np.uint8)
            tmp = served / "tmp"
            write_idx(tmp / f.name, arr, gz=True)
            z.write(tmp / (f.name + ".gz"), f"gzip/{f.name}.gz")
            arrays.setdefault("emnist", {})[f.name] = arr
        z.writestr("gzip/emnist-byclass-mapping.txt", "0 48\n")
        shutil.rmtree(served / "tmp")
    table["emnist"] = dataclasses.replace(src, downloads=(
        dataclasses.replace(src.downloads[0], md5=md5(served / "emnist" / "gzip.zip")),))
    # CIFAR: a tar.gz of the folder torchvision reads, with a file it does not
    for name in ("cifar10", "cifar100"):
        src = real[name]
        work = served / "tmp"
        written = write_cifar(work, name == "cifar100", g)
        (work / src.folder / "readme.html").write_text("<html></html>")
        archive = served / name / src.downloads[0].filename
        archive.parent.mkdir()
        with tarfile.open(archive, "w:gz") as t:
            t.add(work / src.folder, arcname=src.folder)
        table[name] = dataclasses.replace(
            src, downloads=(dataclasses.replace(src.downloads[0], md5=md5(archive)),),
            files=tuple(dataclasses.replace(f, md5=md5(work / src.folder / f.name)) for f in src.files))
        arrays[name] = written
        shutil.rmtree(work)
    return table, arrays


class Server:
    """``http.server`` on 127.0.0.1 in a thread; remembers the paths asked for."""

    def __init__(self, folder: Path):
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                server.requests.append(self.path)

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # torchvision's redirect probe hangs up before the body: a broken pipe here, by design

        self.httpd = Quiet(("127.0.0.1", 0), partial(Handler, directory=str(folder)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # a short poll: shutdown() waits up to one poll interval (0.5 s by default)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def dead_url() -> str:
    """A 127.0.0.1 port nothing listens on: connection refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    served = tmp_path_factory.mktemp("served")
    table, arrays = build_archives(served, sources.table())
    server = Server(served)
    # each dataset's own mirror list points at the local server
    table = {n: dataclasses.replace(s, mirrors=(f"{server.url}/{n}/",)) for n, s in table.items()}
    yield server, served, table, arrays
    server.close()


@pytest.fixture
def fake(mirror, monkeypatch):
    """The server, the folder it serves, and the tiny md5s in place of torchvision's."""
    server, served, table, arrays = mirror
    monkeypatch.setattr(sources, "table", lambda: dict(table))
    server.requests.clear()
    return server, served, table, arrays


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mpifl.data: error: "), err
    return err[0]


def load(name: str, root: Path, *more: str) -> datasets.Pool:
    return datasets.load(config.load(None, [f"data.name={name}", f"data.root={root}", *more]).data, 0)


def assert_nothing_complete(root: Path, name: str, capsys) -> None:
    assert not root.exists() or [p.name for p in root.iterdir()] == [], list(root.iterdir())
    root.mkdir(exist_ok=True)
    assert main(["verify", "--root", str(root), name]) == 1
    assert "missing" in capsys.readouterr().out
    with pytest.raises(ConfigError):
        load(name, root)


@pytest.mark.parametrize("name", sources.NAMES)
def test_fetch_writes_what_data_root_reads(fake, tmp_path, capsys, name):
    _, _, table, arrays = fake
    root = tmp_path / "data"
    assert main(["fetch", name, "--root", str(root)]) == 0
    assert capsys.readouterr().err == ""
    assert [p.name for p in root.iterdir()] == [table[name].folder.split("/")[0]]  # no temporary left
    assert main(["verify", "--root", str(root), name]) == 0
    out = capsys.readouterr().out
    assert f"{name:<13} present" in out and "verify: ok" in out
    if name in ("mnist", "fashionmnist"):
        x, y = arrays[name]
        pool = load(name, root)
        np.testing.assert_array_equal(pool.x[:, 0], x)
        np.testing.assert_array_equal(pool.y, y)
    elif name == "emnist":
        for split in ("byclass", "digits"):
            pool = load(name, root, f"data.emnist_split={split}")
            want = np.concatenate([arrays[name][f"emnist-{split}-{p}-labels-idx1-ubyte"] for p in ("train", "test")])
            np.testing.assert_array_equal(pool.y, want)
            np.testing.assert_array_equal(pool.x[0, 0], arrays[name][f"emnist-{split}-train-images-idx3-ubyte"][0].T)
        sums = verify.read_md5sums(root / "EMNIST" / "raw" / sources.MD5SUMS)
        assert len(sums) == 24 and all(sums[f] == md5(root / "EMNIST" / "raw" / f) for f in sums)
        assert not (root / "EMNIST" / "raw" / "emnist-byclass-mapping.txt").exists()
    else:
        written = arrays[name]
        pool = load(name, root)
        key, parts = ("labels", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]) if name == "cifar10" \
            else ("fine_labels", ["train", "test"])
        np.testing.assert_array_equal(pool.y, np.concatenate([written[p][key] for p in parts]))


def test_a_present_copy_is_not_downloaded_again_and_an_incomplete_one_is_refused(fake, tmp_path, capsys):
    server, _, table, _ = fake
    root = tmp_path / "data"
    assert main(["fetch", "mnist", "--root", str(root)]) == 0
    asked = len(server.requests)
    assert {Path(r).name for r in server.requests} == {d.filename for d in table["mnist"].downloads}
    assert main(["fetch", "mnist", "--root", str(root)]) == 0
    assert len(server.requests) == asked and "already present" in capsys.readouterr().out
    raw = root / "MNIST" / "raw"
    (raw / "t10k-labels-idx1-ubyte.gz").unlink()
    before = sorted(p.name for p in raw.iterdir())
    assert main(["fetch", "mnist", "--root", str(root)]) == 2
    line = one_error_line(capsys)
    assert "t10k-labels-idx1-ubyte" in line and "move it aside" in line
    assert sorted(p.name for p in raw.iterdir()) == before and len(server.requests) == asked


def test_mirror_replaces_the_host_and_mirrors_are_tried_in_turn(fake, tmp_path, capsys, monkeypatch):
    server, served, table, _ = fake
    dead = {n: dataclasses.replace(s, mirrors=(dead_url(),)) for n, s in table.items()}
    monkeypatch.setattr(sources, "table", lambda: dead)
    assert main(["fetch", "mnist", "--root", str(tmp_path / "a")]) == 2
    assert "refused" in one_error_line(capsys).lower()
    assert main(["fetch", "mnist", "--root", str(tmp_path / "b"), "--mirror", f"{server.url}/mnist"]) == 0
    # torchvision's MNIST lists two mirrors: the first failing, the second serves
    both = {**dead, "mnist": dataclasses.replace(table["mnist"], mirrors=(dead_url(), f"{server.url}/mnist/"))}
    monkeypatch.setattr(sources, "table", lambda: both)
    assert main(["fetch", "mnist", "--root", str(tmp_path / "c")]) == 0
    # a local folder (archives copied by hand) works as a mirror too
    assert main(["fetch", "cifar10", "--root", str(tmp_path / "d"), "--mirror", str(served / "cifar10")]) == 0
    capsys.readouterr()
    for root in ("b", "c", "d"):
        assert main(["verify", "--root", str(tmp_path / root)]) == 0
        assert capsys.readouterr().out.count(" present: ") == 1


def corrupt_copy(served: Path, name: str, filename: str, into: Path) -> str:
    """A mirror folder like ``served/name`` with one file's bytes changed; its URL path."""
    shutil.copytree(served / name, into / name)
    data = bytearray((into / name / filename).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (into / name / filename).write_bytes(bytes(data))
    return name


@pytest.mark.parametrize("name,filename", [("mnist", "t10k-images-idx3-ubyte.gz"),
                                           ("emnist", "gzip.zip"), ("cifar100", "cifar-100-python.tar.gz")])
def test_a_checksum_mismatch_is_one_line_exit_2_and_leaves_nothing(fake, tmp_path, capsys, name, filename):
    server, served, _, _ = fake
    bad = served / "corrupt" / tmp_path.name
    corrupt_copy(served, name, filename, bad)
    root = tmp_path / "data"
    assert main(["fetch", name, "--root", str(root), "--mirror",
                 f"{server.url}/corrupt/{tmp_path.name}/{name}/"]) == 2
    line = one_error_line(capsys)
    assert filename in line and "md5" in line and "was not created" in line
    assert_nothing_complete(root, name, capsys)


def test_a_failed_download_is_one_line_exit_2_and_leaves_nothing(fake, tmp_path, capsys):
    server, served, _, _ = fake
    partial_mirror = served / "partial" / tmp_path.name / "fashionmnist"
    shutil.copytree(served / "fashionmnist", partial_mirror)
    (partial_mirror / "t10k-labels-idx1-ubyte.gz").unlink()  # the last one: three were downloaded
    root = tmp_path / "data"
    assert main(["fetch", "fashionmnist", "--root", str(root), "--mirror",
                 f"{server.url}/partial/{tmp_path.name}/fashionmnist"]) == 2
    line = one_error_line(capsys)
    assert "t10k-labels-idx1-ubyte.gz" in line and "404" in line
    assert_nothing_complete(root, "fashionmnist", capsys)


def test_an_archive_whose_contents_do_not_check_leaves_nothing(fake, tmp_path, capsys, monkeypatch):
    _, _, table, _ = fake
    src = table["cifar10"]
    files = tuple(dataclasses.replace(f, md5="0" * 32) if f.name == "data_batch_2" else f for f in src.files)
    monkeypatch.setattr(sources, "table", lambda: {**table, "cifar10": dataclasses.replace(src, files=files)})
    root = tmp_path / "data"
    assert main(["fetch", "cifar10", "--root", str(root)]) == 2
    line = one_error_line(capsys)
    assert "bad checksum: data_batch_2" in line
    assert_nothing_complete(root, "cifar10", capsys)


def test_verify_finds_damaged_and_missing_files(fake, tmp_path, capsys):
    root = tmp_path / "data"
    for name in ("cifar10", "emnist", "mnist"):
        assert main(["fetch", name, "--root", str(root)]) == 0
    assert main(["verify", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count(" present: ") == 3 and "verify: ok" in out
    assert "cifar100      missing: cifar-100-python/" in out  # absent: fine unless asked for
    batch = root / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:-1] + b"\x00")
    (root / "EMNIST" / "raw" / "emnist-letters-test-labels-idx1-ubyte.gz").unlink()
    assert main(["verify", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "cifar10       bad checksum: data_batch_3" in out
    assert "emnist        missing: emnist-letters-test-labels-idx1-ubyte[.gz]" in out
    assert "mnist         present" in out and "2 dataset(s) incomplete or damaged" in out
    assert main(["verify", "--root", str(root), "mnist"]) == 0
    assert main(["verify", "--root", str(root), "mnist", "cifar100"]) == 1  # named: must be there
    gz = root / "EMNIST" / "raw" / "emnist-digits-train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes() + b"\x00")  # checked against the MD5SUMS fetch wrote
    assert main(["verify", "--root", str(root), "emnist"]) == 1
    assert "bad checksum: emnist-digits-train-images-idx3-ubyte.gz" in capsys.readouterr().out


def test_verify_reads_extracted_idx_files_as_data_root_does(fake, tmp_path, capsys):
    """torchvision's own download keeps the .gz and the extracted file; the extracted
    one is what is read, so it is compared with the checked .gz."""
    import gzip

    root = tmp_path / "data"
    assert main(["fetch", "mnist", "--root", str(root)]) == 0
    raw = root / "MNIST" / "raw"
    for gz in raw.glob("*.gz"):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
    assert main(["verify", "--root", str(root), "mnist"]) == 0
    labels = raw / "train-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:-1] + b"\x07")
    assert main(["verify", "--root", str(root), "mnist"]) == 1
    assert "train-labels-idx1-ubyte (differs from train-labels-idx1-ubyte.gz)" in capsys.readouterr().out
    for gz in raw.glob("*.gz"):  # extracted only: nothing to check them against
        gz.unlink()
    assert main(["verify", "--root", str(root), "mnist"]) == 0
    assert "no md5 to check 4 of them" in capsys.readouterr().out


def test_verify_the_flat_debian_fashion_mnist_layout(fake, tmp_path, capsys, monkeypatch):
    _, served, table, _ = fake
    flat = tmp_path / "fashion-mnist"
    shutil.copytree(served / "fashionmnist", flat)
    assert main(["verify", "--root", str(flat), "fashionmnist"]) == 0  # the table's md5s
    # in the package's folder: the package's md5s, whatever torchvision publishes
    sums = tmp_path / "dataset-fashion-mnist.md5sums"
    sums.write_text("".join(f"{md5(p)}  usr/share/datasets/fashion-mnist/{p.name}\n" for p in flat.iterdir()))
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", flat)
    monkeypatch.setattr(verify, "DEBIAN_MD5SUMS", sums)
    src = table["fashionmnist"]
    wrong = dataclasses.replace(src, files=tuple(dataclasses.replace(f, md5="0" * 32) for f in src.files))
    monkeypatch.setattr(sources, "table", lambda: {**table, "fashionmnist": wrong})
    capsys.readouterr()
    assert main(["verify", "--root", str(flat), "fashionmnist"]) == 0
    assert "against Debian's package" in capsys.readouterr().out
    (flat / "train-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b")
    assert main(["verify", "--root", str(flat), "fashionmnist"]) == 1
    assert "bad checksum: train-labels-idx1-ubyte.gz" in capsys.readouterr().out


@pytest.mark.skipif(not datasets.DEBIAN_FASHION_MNIST.is_dir() or not verify.DEBIAN_MD5SUMS.is_file(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_verify_the_installed_debian_package(capsys):
    assert main(["verify", "--root", str(datasets.DEBIAN_FASHION_MNIST), "fashionmnist"]) == 0
    assert "4 of 4 files md5-checked against Debian's package" in capsys.readouterr().out


def test_verify_checks_the_layout_of_hand_prepared_datasets(tmp_path, capsys):
    g = np.random.default_rng(1)
    for split in ("train", "valid", "test"):
        write_png_tree(tmp_path / "CINIC-10" / split, ["cat", "dog"], 2, 8, g)
    write_png_tree(tmp_path / "digit5" / "mnist", ["0", "1"], 1, 8, g)
    write_png_tree(tmp_path / "digit5" / "svhn", ["0", "2"], 1, 8, g)
    np.savez(tmp_path / "features.npz", x=np.zeros((3, 2)), y=np.arange(3))
    assert main(["verify", "--root", str(tmp_path), "cinic10", "features"]) == 0
    out = capsys.readouterr().out
    assert "cinic10       present" in out and "3 folders, 2 classes, 12 images" in out
    assert "features      present" in out
    assert main(["verify", "--root", str(tmp_path), "digit5"]) == 1
    assert "class folders ['0', '2'] differ from ['0', '1']" in capsys.readouterr().out
    assert main(["verify", "--root", str(tmp_path), "office10"]) == 1
    with pytest.raises(ConfigError, match="class folders"):
        load("digit5", tmp_path)  # verify and data.root agree


@pytest.mark.parametrize("args,expect", [
    (["fetch", "cinic10", "--root", "{tmp}"], "prepared by hand"),
    (["fetch", "mnist", "--root", "{tmp}", "--mirror", "gopher://x"], "--mirror 'gopher://x'"),
    (["fetch", "mnist", "--root", "{tmp}", "--mirror", "example.org/mnist"], "no such folder"),
    (["verify", "--root", "{tmp}/nowhere"], "is not a folder"),
    (["verify", "--root", "{tmp}", "imagenet"], "'imagenet' is not a dataset"),
])
def test_bad_arguments_are_one_line(tmp_path, capsys, args, expect):
    assert main([a.replace("{tmp}", str(tmp_path)) for a in args]) == 2
    assert expect in one_error_line(capsys)


@pytest.mark.slow
def test_a_real_process_with_torchvision_md5s_refuses_the_tiny_files(mirror, tmp_path):
    """Through ``python -m mpifl.data``, torchvision's md5s: the tiny files do not
    match them, so the error is one line on stderr (no progress, no traceback)."""
    server, _, _, _ = mirror
    root = tmp_path / "data"
    p = subprocess.run([sys.executable, "-m", "mpifl.data", "fetch", "mnist", "--root", str(root), "--mirror",
                        f"{server.url}/mnist/"], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mpifl.data: error: mnist: could not fetch train-images"), err
    assert "expected f68b3c2dcbeaaa9fbdd348bbdeb94873" in err[0]  # torchvision's own md5
    assert root.is_dir() and list(root.iterdir()) == []


def recompress(src: Path, dst: Path, change: bool = False) -> None:
    """``src``'s IDX .gz files as another tool would write them: other gzip bytes
    (level, header), the same content, or with ``change`` one decoded byte flipped."""
    import gzip

    dst.mkdir(parents=True, exist_ok=True)
    for gz in sorted(src.glob("*.gz")):
        data = bytearray(gzip.decompress(gz.read_bytes()))
        if change and "train-labels" in gz.name:
            data[-1] ^= 1
        (dst / gz.name).write_bytes(gzip.compress(bytes(data), compresslevel=1, mtime=12345))
        assert change or md5(dst / gz.name) != md5(gz)


def with_content(table: dict, served: Path) -> dict:
    """The tiny table with fashionmnist's content md5s taken from its served files."""
    import gzip

    src = table["fashionmnist"]
    files = tuple(dataclasses.replace(
        f, content_md5=hashlib.md5(gzip.decompress((served / (f.name + ".gz")).read_bytes())).hexdigest())
        for f in src.files)
    return {**table, "fashionmnist": dataclasses.replace(src, files=files)}


def test_verify_and_fetch_take_a_recompressed_copy_by_content_and_name_a_damaged_one(fake, tmp_path, capsys,
                                                                                     monkeypatch):
    """Debian's way: the gzip bytes differ from the published md5s, the decoded
    bytes do not; wherever the copy lies, it is intact, and a flipped decoded byte
    is named."""
    _, served, table, arrays = fake
    table = with_content(table, served / "fashionmnist")
    monkeypatch.setattr(sources, "table", lambda: dict(table))
    copy, damaged = tmp_path / "copy", tmp_path / "damaged"
    recompress(served / "fashionmnist", copy)
    recompress(served / "fashionmnist", damaged, change=True)
    assert main(["verify", "--root", str(copy), "fashionmnist"]) == 0
    assert "verify: ok" in capsys.readouterr().out
    assert main(["verify", "--root", str(damaged), "fashionmnist"]) == 1
    out = capsys.readouterr().out
    assert "bad checksum: train-labels-idx1-ubyte.gz" in out and "t10k" not in out.split("bad checksum")[1]
    root = tmp_path / "data"
    assert main(["fetch", "fashionmnist", "--root", str(root), "--mirror", str(copy)]) == 0
    capsys.readouterr()
    assert main(["verify", "--root", str(root), "fashionmnist"]) == 0
    np.testing.assert_array_equal(load("fashionmnist", root).y, arrays["fashionmnist"][1])
    other = tmp_path / "other"
    assert main(["fetch", "fashionmnist", "--root", str(other), "--mirror", str(damaged)]) == 2
    line = one_error_line(capsys)
    assert "could not fetch train-labels-idx1-ubyte.gz" in line and "was not created" in line
    assert list(other.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(not datasets.DEBIAN_FASHION_MNIST.is_dir(), reason="Debian's dataset-fashion-mnist not installed")
def test_a_copy_of_debians_fashion_mnist_is_intact_anywhere_and_a_damaged_one_is_named(tmp_path, capsys):
    """The real files and torchvision's md5s: a plain copy verifies, fetch --mirror
    takes the package's folder, and a copy with one decoded byte changed is named."""
    copy = tmp_path / "copy"
    shutil.copytree(datasets.DEBIAN_FASHION_MNIST, copy)
    assert main(["verify", "--root", str(copy), "fashionmnist"]) == 0
    assert "4 of 4 files md5-checked" in capsys.readouterr().out
    assert main(["fetch", "fashionmnist", "--root", str(tmp_path / "data"), "--mirror",
                 str(datasets.DEBIAN_FASHION_MNIST)]) == 0
    damaged = tmp_path / "damaged"
    shutil.copytree(copy, damaged, ignore=shutil.ignore_patterns("train-labels*"))
    recompress_one = damaged / "train-labels-idx1-ubyte.gz"
    import gzip

    data = bytearray(gzip.decompress((copy / recompress_one.name).read_bytes()))
    data[100] ^= 1
    recompress_one.write_bytes(gzip.compress(bytes(data)))
    capsys.readouterr()
    assert main(["verify", "--root", str(damaged), "fashionmnist"]) == 1
    assert "bad checksum: train-labels-idx1-ubyte.gz" in capsys.readouterr().out


def test_verify_without_root_checks_debians_folder_where_it_exists(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", tmp_path / "fashion-mnist")
    with pytest.raises(SystemExit) as e:  # not there: a usage error naming it
        main(["verify"])
    assert e.value.code == 2 and f"verify needs --root DIR (no {tmp_path / 'fashion-mnist'} here" in \
        capsys.readouterr().err
    (tmp_path / "fashion-mnist").mkdir()
    assert main(["verify", "fashionmnist"]) == 1  # there, empty: the named dataset is missing
    assert capsys.readouterr().out.startswith(f"verify: {tmp_path / 'fashion-mnist'}\n")
