"""``python -m mpifl.data fetch NAME --root DIR [--mirror URL|FOLDER]``: one of
the torchvision-hosted datasets onto disk, in the layout ``data.root`` reads.

Run it where there is internet (a cluster's login node); the compute nodes then
read ``DIR`` and download nothing: nothing mpifl runs for training fetches
anything. The download goes through torchvision's own ``download_url`` and md5
checks, into a temporary folder under ``DIR``; the dataset's folder is renamed
into place only once every file in it checks, so a failed download or a
checksum mismatch leaves nothing that ``verify`` or ``data.root`` would take
for a complete copy. An existing complete copy is left alone (nothing is
downloaded); an existing incomplete one is refused, untouched.

``--mirror`` replaces the host: a base URL under which the same file names are
served (``<mirror>/cifar-10-python.tar.gz``), or a local folder holding those
files (archives copied by hand to a cluster whose login node is offline too);
either way the md5s are torchvision's, except that a local ``.gz`` of an IDX file
compressed by another tool (Debian's Fashion-MNIST) is taken by the md5 of its
gunzipped bytes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import urllib.error
from collections.abc import Callable
from pathlib import Path

from torchvision.datasets.utils import calculate_md5, download_url, extract_archive

from mpifl.data import sources
from mpifl.data.sources import MD5SUMS, Source
from mpifl.data.verify import check, intact

TIMEOUT_S = 120  # a stalled connection fails instead of hanging the login-node session


class FetchError(Exception):
    """A download that failed or did not check: one line, exit 2."""


def _mirrors(src: Source, mirror: str | None) -> list[str]:
    if mirror is None:
        return list(src.mirrors)
    scheme = mirror.split("://", 1)[0] if "://" in mirror else ""
    if scheme not in ("", "http", "https", "ftp", "file"):
        raise FetchError(f"--mirror {mirror!r}: not an http(s)/ftp URL, a file:// URL or a folder")
    if not scheme and not Path(mirror).expanduser().is_dir():
        raise FetchError(f"--mirror {mirror!r}: no such folder (a URL needs its scheme, http://...)")
    return [mirror if mirror.endswith("/") else mirror + "/"]


def _content_md5(src: Source, filename: str) -> str | None:
    """The md5 of a download's gunzipped bytes, for an IDX ``.gz`` another tool compressed."""
    return next((f.content_md5 for f in src.files if f.idx and f.name + ".gz" == filename), None)


def _get(src: Source, filename: str, md5: str, mirrors: list[str], into: Path, say: Callable[[str], None]) -> Path:
    """``filename`` from the first mirror that serves it with the right md5."""
    path = into / filename
    errors = []
    for base in mirrors:
        url = base + filename
        say(f"{src.name}: {filename} <- {url}")
        try:
            if "://" in base and not base.startswith("file://"):
                # torchvision's progress goes to stderr: keep stderr for the one error line
                with contextlib.redirect_stderr(sys.stdout):
                    download_url(url, str(into), filename, md5)
            else:
                local = Path(url.removeprefix("file://")).expanduser()
                shutil.copyfile(local, path)
                if not intact(path, md5, _content_md5(src, filename)):
                    raise RuntimeError("File not found or corrupted.")
            return path
        except RuntimeError as e:  # torchvision's word for a wrong md5 (the file is left there), among others
            why = f"md5 {calculate_md5(str(path))}, expected {md5}" if path.is_file() else str(e).splitlines()[0]
            errors.append(f"{url}: {why}")
        except urllib.error.HTTPError as e:
            errors.append(f"{url}: HTTP {e.code} {e.reason}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            errors.append(f"{url}: {str(getattr(e, 'reason', None) or e).splitlines()[0]}")
        path.unlink(missing_ok=True)
    raise FetchError(f"{src.name}: could not fetch {filename}: " + "; ".join(errors))


def _unpack(src: Source, got: list[Path], work: Path) -> Path:
    """The downloads -> a folder laid out as ``src.folder`` (not yet in place)."""
    out = work / "out"
    if src.unpack == "idx":
        out.mkdir()
        for p in got:
            p.rename(out / p.name)
        return out
    extract_archive(str(got[0]), str(work / "extracted"))
    if src.unpack == "tar":  # CIFAR: the archive holds the folder itself
        inner = work / "extracted" / Path(src.folder).name
        if not inner.is_dir():
            raise FetchError(f"{src.name}: {got[0].name} holds no folder {Path(src.folder).name}/")
        return inner
    # EMNIST: gzip/emnist-<split>-<part>-<kind>-ubyte.gz; torchvision drops the mapping files too
    out.mkdir()
    wanted = {f.name + ".gz" for f in src.files}
    for p in sorted((work / "extracted").rglob("*.gz")):
        if p.name in wanted:
            p.rename(out / p.name)
    sums = [f"{calculate_md5(str(out / n))}  {n}\n" for n in sorted(wanted) if (out / n).is_file()]
    (out / MD5SUMS).write_text("".join(sums))
    return out


def fetch(name: str, root: Path | str, mirror: str | None = None, table: dict[str, Source] | None = None,
          say: Callable[[str], None] = print) -> Path:
    """Download ``name`` into ``root`` (see the module docstring); its folder."""
    table = sources.table() if table is None else table
    if name not in table:
        raise FetchError(f"fetch: {name!r} is not one of {', '.join(table)}; the others are prepared by hand "
                         "(docs/data.md)")
    src = table[name]
    mirrors = _mirrors(src, mirror)
    root = Path(root).expanduser()
    target = root / src.folder
    if target.exists():
        st = check(target, src)
        if st.ok:
            say(f"{name}: already present, nothing downloaded: {st.note}")
            return target
        raise FetchError(f"{name}: {target} exists but is not a complete copy ({st.text()}); "
                         "move it aside and fetch again (nothing there was changed)")
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".mpifl-fetch-{name}-", dir=root))
    except OSError as e:
        raise FetchError(f"{name}: cannot write under {str(root)!r}: {e.strerror or e}") from e
    timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(TIMEOUT_S)
    try:
        (work / "download").mkdir()
        got = [_get(src, d.filename, d.md5, mirrors, work / "download", say) for d in src.downloads]
        folder = _unpack(src, got, work)
        st = check(folder, src)
        if not st.ok:
            raise FetchError(f"{name}: the download checked but its contents do not: {st.text()}")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(folder, target)
    except (FetchError, OSError) as e:
        why = str(e) if isinstance(e, FetchError) else f"{name}: {type(e).__name__}: {e}"
        raise FetchError(f"{why.splitlines()[0]}; {str(target)!r} was not created") from e
    finally:
        socket.setdefaulttimeout(timeout)
        shutil.rmtree(work, ignore_errors=True)
    say(f"{name}: done: {target} ({len(src.files)} files, each checked)")
    return target
