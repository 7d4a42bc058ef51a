"""Checkpoints: all a run needs to continue after its last complete round.

Every random draw is keyed by (seed, round, client, purpose), so there is no
generator state to keep: the clients' rows (parameters, BatchNorm buffers,
optimizer state), the algorithm's state and the round number are the whole
state. Each rank writes its clients' rows, keyed by client id, so a run
checkpointed on R ranks resumes on any other number of ranks.

    <run>/checkpoint/latest              name of the newest complete checkpoint
    <run>/checkpoint/round-000012/meta.pt        round, config, training path, replicated state
    <run>/checkpoint/round-000012/part-0003.pt   rank 3's clients
    <run>/checkpoint/round-000012/manifest.json  every file's size and sha256, written last

A checkpoint directory is filled under a temporary name and renamed when
complete; ``latest`` is replaced atomically after that. A kill at any moment
leaves the previous checkpoint intact. The last ``run.keep_checkpoints`` (default
2) are kept while a run goes (``run.resume=previous`` resumes from the one before
the latest), the final one alone once it has finished (none with
``run.keep_final_checkpoint: false``); older ones are deleted after ``latest``
names the new one.

Every file is checked against the manifest as it is read: a bit flip, a
truncated or missing file, a ``latest`` naming a missing directory stop the run
in one line naming the damage and the ways forward (:func:`damaged`), never a
silent start over. ``<run>/checkpoint`` may not be a symbolic link: old
checkpoints are deleted there, and a folder shared through a link could hold
another run's (:func:`check_dir`).
A write refused on any rank (a full disk) raises ``StorageError`` on every
rank, the temporary directory is removed, and the previous checkpoint stays the
latest.

Algorithm state: fields of the ``State`` dataclass marked with
:func:`mpifl.algorithms.state.per_client` hold one row (or list item) per local client — a tensor,
an array, a list, or a dict of those (an optimizer state of extra rows); every
other field must be identical on all ranks and is saved once, by rank 0.

Files hold tensors and plain containers only, and are read with
``torch.load(weights_only=True)``: a file planted in a run directory cannot run
code when the run resumes. Numpy arrays travel as tensors and records (such as
DPFL's per-client ``Peer``) as dicts of their fields, filled back into the
records a fresh ``init`` made (:func:`_encode`, :func:`_decode`). ``latest``
must name a ``round-NNNNNN`` directory beside it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mpifl.algorithms.state import saved_fields
from mpifl.config.identity import config_diff
from mpifl.errors import UNWRITABLE, ConfigError, StorageError, shorten, storage_error
from mpifl.paths import RunDir, atomic_write_text, probe_write

LATEST = "latest"
META = "meta.pt"
MANIFEST = "manifest.json"  # {"round": t, "files": {name: [size, sha256 hex]}}, written last
MANIFEST_MAX = 1 << 24  # bytes read of a manifest: ~100 per rank's part, so 10^5 ranks
ROUND_DIR = re.compile(r"round-[0-9]{6}")  # every checkpoint directory mpifl writes
_NUMPY = "__numpy__"  # an encoded numpy array: {_NUMPY: tensor} (+ "scalar": True)
_FIELDS = "__fields__"  # an encoded dataclass record: {_FIELDS: {name: value}}


class _Checked:
    """A file for ``torch.save`` that hashes what passes (a checkpoint file's
    checksum without reading it back) and keeps the ``OSError`` of a refused write:
    torch reports that as a ``RuntimeError`` of its own that does not say why."""

    def __init__(self, f) -> None:
        self.f, self.sha, self.size, self.error = f, hashlib.sha256(), 0, None

    def write(self, b) -> int:
        try:
            n = self.f.write(b)
        except OSError as e:
            self.error = e
            raise
        self.sha.update(b)
        self.size += len(b)
        return n

    def flush(self) -> None:
        self.f.flush()


def _kept(rd: RunDir) -> str:
    """What a refused checkpoint write leaves: the published checkpoint, if any."""
    try:
        last = latest(rd)
    except ConfigError:
        last = None
    return f"the checkpoint {last.name} is kept" if last else "there is no checkpoint yet: the run starts over"


def _save(obj: Any, path: Path, kept: str) -> tuple[int, str]:
    """Write ``obj`` to ``path``; returns its (size, sha256) for the manifest."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            out = _Checked(f)
            try:
                torch.save(obj, out)
            except RuntimeError:
                if out.error is None:
                    raise
                raise out.error from None
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise storage_error("the checkpoint file", path, e, kept) from None
    return out.size, out.sha.hexdigest()


def _agreed(comm, fn, tmp: Path) -> Any:
    """``fn`` on every rank (collective), its result; a refused write on any rank
    removes the checkpoint being written (``tmp``) and raises on every rank."""
    from mpifl.comm import agree

    try:
        return agree(comm, fn)
    except StorageError:
        if comm.is_writer:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def latest(rd: RunDir) -> Path | None:
    """The checkpoint ``latest`` names, or None without one; ``latest`` naming
    anything but a ``round-NNNNNN`` directory beside it is refused. Whether it is
    whole is checked as it is read (:func:`read_meta`, :func:`load`)."""
    p = rd.checkpoint / LATEST
    if not p.is_file():
        return None
    try:
        with open(p, "rb") as f:  # a planted pointer may be huge: its head is enough
            name = f.read(100).decode(errors="replace").strip()
    except OSError as e:
        raise ConfigError(f"checkpoint pointer {str(p)!r} is unreadable ({e.strerror}); "
                          f"delete it or use run.resume=never") from None
    d = rd.checkpoint / name
    if not ROUND_DIR.fullmatch(name) or d.is_symlink():
        raise ConfigError(f"checkpoint pointer {str(p)!r} names {name!r}, not a round-NNNNNN directory beside it; "
                          f"delete it or use run.resume=never")
    return d


def previous(ck: Path) -> Path | None:
    """The newest checkpoint directory beside ``ck`` of an earlier round, or None."""
    older = [d for d in _ours(ck.parent) if d.name < ck.name]
    return max(older, key=lambda d: d.name, default=None)


def _ours(folder: Path) -> list[Path]:
    """The checkpoint directories mpifl wrote in ``folder`` (its names, no links)."""
    if not folder.is_dir():
        return []
    return [d for d in folder.iterdir() if is_checkpoint_dir(d) and d.is_dir() and not d.is_symlink()]


def checkpoints(rd: RunDir) -> dict[int, Path]:
    """Round (numbered from 1, as on the console) -> checkpoint directory, for every
    published checkpoint of ``rd`` (a temporary one is not)."""
    return {int(d.name.removeprefix("round-")) + 1: d for d in _ours(rd.checkpoint)}


def read_part(ck: Path, rank: int) -> dict:
    """Rank ``rank``'s part of the checkpoint in ``ck`` (ids, params, buffers, opt,
    algo), checked against the manifest as :func:`load` reads it."""
    return _load(ck / f"part-{rank:04d}.pt", _manifest(ck))


def check_dir(rd: RunDir) -> None:
    """Refuse a ``checkpoint`` folder that is a symbolic link: mpifl deletes its old
    checkpoints there, and a folder reached through a link may be shared with
    other runs (whose ``round-NNNNNN`` look like ours)."""
    if rd.checkpoint.is_symlink():
        raise ConfigError(f"checkpoint folder {str(rd.checkpoint)!r} is a symbolic link (to "
                          f"{shorten(repr(os.readlink(rd.checkpoint)), 80)}), refused: mpifl deletes old checkpoints "
                          f"there and could delete another run's; make it a directory of this run (move the "
                          f"checkpoints into it), or put the whole run on that disk with run.out_dir")
    _check_entries(rd)


def _check_entries(rd: RunDir) -> None:
    """Refuse a name mpifl writes in the folder (``round-NNNNNN``, its temporary
    ``.round-NNNNNN.tmp``, ``latest``) held by something mpifl did not write there:
    a symbolic link, or a file where a checkpoint directory goes. Publishing over
    it would fail after the rounds were computed, at every later launch alike, and
    mpifl deletes only what it wrote."""
    if not rd.checkpoint.is_dir():
        return
    for d in rd.checkpoint.iterdir():
        round_dir = ROUND_DIR.fullmatch(d.name.removeprefix(".").removesuffix(".tmp"))
        if not (round_dir or d.name == LATEST):
            continue
        if d.is_symlink():
            what = f"a symbolic link (to {shorten(repr(os.readlink(d)), 80)})"
        elif round_dir and not d.is_dir():
            what = "not a directory"
        else:
            continue
        raise ConfigError(f"{str(d)!r} is {what}, where mpifl writes its checkpoints: refused (mpifl deletes "
                          f"only what it wrote); remove or move it, or use another run.name")


def check_writable(rd: RunDir) -> None:
    """A ``checkpoint`` folder this job cannot write (read-only, no permission) is a
    user error found before any round is computed (exit 2), not a refused write of
    the first checkpoint afterwards (exit 74, "free space")."""
    if not rd.checkpoint.is_dir() or rd.checkpoint.is_symlink():
        return
    try:
        probe_write(rd.checkpoint)
    except OSError as e:
        if e.errno not in UNWRITABLE:
            return  # a full disk is the checkpoint writer's to report, with what it keeps
        raise ConfigError(f"checkpoint folder {str(rd.checkpoint)!r} cannot be written ({e.strerror}): the run "
                          f"could not checkpoint; make it writable, or pick a run.out_dir you can write (a copy of "
                          f"the run directory there continues the run)") from None


def unpublished(rd: RunDir) -> Path | None:
    """Without a ``latest`` pointer, the newest checkpoint directory, or None: a job
    killed between publishing its first checkpoint and writing ``latest`` leaves one
    that is whole (its manifest, checked as it is read, says so) and that a fresh
    start would delete."""
    return max(_ours(rd.checkpoint), key=lambda d: d.name, default=None)


def damaged(ck: Path, what: str) -> ConfigError:
    """The one-line error for a checkpoint that cannot be trusted, with the ways
    forward that work: the checkpoint before it (when ``ck`` is the one ``latest``
    names and an earlier one is kept), or starting over."""
    pointer = ck.parent / LATEST
    try:
        is_latest = pointer.is_file() and pointer.read_text()[:100].strip() == ck.name
    except OSError:
        is_latest = False
    before = previous(ck) if is_latest else None
    start_over = "start over with run.resume=never (replaces this run's log and checkpoints, nothing else)"
    if before is not None:
        ways = f"resume from the checkpoint before it ({before.name}) with run.resume=previous, or {start_over}"
    else:  # the latest without an earlier one, or the earlier one (run.resume=previous) itself
        ways = ("no earlier checkpoint is kept: " if is_latest else "") + start_over
    return ConfigError(f"checkpoint {str(ck)!r} is damaged: {what}; {ways}")


def _manifest(ck: Path) -> dict[str, tuple[int, str]]:
    """{file name: (size, sha256)} of a checkpoint; a missing or unreadable one is damage."""
    if not ck.is_dir():
        raise damaged(ck, f"{LATEST} names {ck.name}, which is missing")
    text = _read(ck / MANIFEST, MANIFEST_MAX, f"it has no {MANIFEST} (not completely written, or by an mpifl "
                 f"before checksums)", f"its {MANIFEST}")
    try:
        files = json.loads(text)["files"]
        out = {str(k): (int(v[0]), str(v[1])) for k, v in files.items()}
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise damaged(ck, f"its {MANIFEST} is not one mpifl wrote (corrupted?)") from None
    if META not in out:
        raise damaged(ck, f"its {MANIFEST} lists no {META}")
    return out


def _read(path: Path, limit: int, missing: str, what: str) -> bytes:
    """At most ``limit`` bytes of a checkpoint's file; a missing or unreadable one is damage."""
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except FileNotFoundError:
        raise damaged(path.parent, missing) from None
    except OSError as e:
        raise damaged(path.parent, f"{what} is unreadable ({e.strerror})") from None


def is_checkpoint_dir(path: Path) -> bool:
    """A directory name mpifl gives its checkpoints (the only ones it deletes)."""
    return bool(ROUND_DIR.fullmatch(path.name))


def save(rd: RunDir, ctx, state: Any, t: int, die_before_publish: bool = False, keep: int = 2) -> Path:
    """Collective: every rank writes its part; rank 0 the meta, then publishes and
    keeps ``keep`` checkpoints, this one and the newest before it (:func:`prune`).
    ``die_before_publish`` (tests) SIGKILLs the process with the parts written."""
    comm, c = ctx.comm, ctx.clients
    name = f"round-{t:06d}"
    final = rd.checkpoint / name
    tmp = rd.checkpoint / f".{name}.tmp"
    kept = _kept(rd)

    def prepare() -> None:
        if comm.is_writer:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                tmp.mkdir(parents=True)
            except OSError as e:
                raise storage_error("the checkpoint directory", tmp, e, kept) from None

    _agreed(comm, prepare, tmp)
    rows, glob = saved_fields(state)
    part = {
        "ids": torch.as_tensor(np.asarray(c.ids, np.int64)),
        "params": c.params.detach().cpu(),
        "buffers": c.buffers.detach().cpu(),
        "opt": {k: v.detach().cpu() for k, v in c.opt.state.items()},
        "algo": {k: _encode(getattr(state, k), k) for k in rows},
    }
    mine = f"part-{comm.rank:04d}.pt"

    def write_part() -> dict[str, tuple[int, str]]:
        written = {mine: _save(part, tmp / mine, kept)}
        if die_before_publish:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        return written

    parts = comm.allgather(_agreed(comm, write_part, tmp))  # every part's checksum, for the manifest

    def publish() -> None:
        if not comm.is_writer:
            return
        meta = {"round": t, "config": ctx.cfg.to_dict(), "n_ranks": comm.size,
                "train_path": "batched" if ctx.clients.batched else "per_client",
                "conv_kernel": ctx.clients.trained_conv_kernel,
                "starts": torch.as_tensor(np.asarray(comm.placement.starts, np.int64)),
                "algo": {k: _encode(getattr(state, k), k) for k in glob}}
        files = {META: _save(meta, tmp / META, kept)}
        for p in parts:
            files.update(p)
        try:
            atomic_write_text(tmp / MANIFEST, json.dumps({"round": t, "files": files}, indent=1))
        except OSError as e:
            raise storage_error("the checkpoint manifest", tmp / MANIFEST, e, kept) from None
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        try:
            atomic_write_text(rd.checkpoint / LATEST, name)
        except OSError as e:  # unpublished: the space it took goes back
            shutil.rmtree(final, ignore_errors=True)
            raise storage_error("the checkpoint pointer", rd.checkpoint / LATEST, e, kept) from None
        prune(final, keep)

    _agreed(comm, publish, tmp)
    return final


def prune(final: Path, keep: int) -> None:
    """Keep ``final`` and the ``keep - 1`` newest checkpoints before it; delete the
    others of this run, a newer one too (it is of a run resumed from an earlier
    checkpoint, run.resume=previous, and no longer matches the log)."""
    older = sorted((d for d in _ours(final.parent) if d.name < final.name), key=lambda d: d.name, reverse=True)
    kept = {final, *older[:keep - 1]}
    for old in _ours(final.parent):
        if old not in kept:
            shutil.rmtree(old, ignore_errors=True)


def _load(path: Path, files: dict[str, tuple[int, str]]) -> Any:
    """A checkpoint file, checked against the manifest's ``files`` and read without
    running any code it may hold; one line when it cannot be."""
    ck = path.parent
    if path.name not in files:
        raise damaged(ck, f"its {MANIFEST} does not list {path.name}")
    size, sha = files[path.name]
    data = _read(path, size + 1, f"{path.name} is missing", path.name)
    if len(data) != size:
        raise damaged(ck, f"checkpoint file {path.name} is not the size it was written with ({size} bytes): "
                          f"truncated, or changed since")
    if hashlib.sha256(data).hexdigest() != sha:
        raise damaged(ck, f"checkpoint file {path.name} does not match the sha256 recorded when it was written "
                          f"(corrupted, or changed since)")
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]{1,100})", str(e))
        if found:
            raise ConfigError(f"checkpoint file {str(path)!r} holds a {found.group(1)} object, not only tensors and "
                              f"plain containers (refused: loading it could run code); delete the checkpoint or "
                              f"use run.resume=never") from None
        raise ConfigError(f"checkpoint file {str(path)!r} is unreadable (not a checkpoint mpifl wrote); "
                          f"delete the checkpoint or use run.resume=never") from None
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"checkpoint file {str(path)!r} is unreadable ({type(e).__name__}); "
                          f"delete the checkpoint or use run.resume=never") from None


def read_meta(path: Path) -> dict:
    """The verified meta of the checkpoint in ``path`` (see :func:`damaged`)."""
    meta = _load(path / META, _manifest(path))
    if not isinstance(meta, dict) or not {"round", "config", "starts", "algo"} <= set(meta):
        raise ConfigError(f"checkpoint file {str(path / META)!r} is not an mpifl checkpoint; "
                          f"delete the checkpoint or use run.resume=never")
    return meta


def check_config(meta: dict, cfg_dict: dict, where: Path) -> None:
    """Refuse a checkpoint of another experiment (:mod:`mpifl.config.identity`)."""
    diff = config_diff(meta["config"], cfg_dict) if isinstance(meta["config"], dict) else "unreadable"
    if diff:
        raise ConfigError(f"run directory {str(where)!r} holds a run with a different config: {diff}; "
                          f"use another run.name (or run.out_dir), or remove that directory to start over in it")


def forget(rd: RunDir) -> None:
    """Delete the checkpoints mpifl wrote in ``rd`` (``latest``, ``round-NNNNNN``
    and their temporary directories); anything else there stays."""
    if not rd.checkpoint.is_dir():
        return
    (rd.checkpoint / LATEST).unlink(missing_ok=True)
    for d in rd.checkpoint.iterdir():
        name = d.name.removeprefix(".").removesuffix(".tmp")
        if ROUND_DIR.fullmatch(name) and d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)


def load(path: Path, ctx, state: Any) -> int:
    """Fill this rank's clients and ``state`` from a checkpoint; returns its round."""
    c = ctx.clients
    meta = read_meta(path)
    files = _manifest(path)
    rows, glob = saved_fields(state)
    if c.needs_measuring and meta.get("train_path") in ("batched", "per_client"):
        # train.batched=auto picked the path by a timing, which may come out the
        # other way this time; the two agree to float tolerance only, and a resumed
        # run continues the bits of the run it resumes
        c.batched = meta["train_path"] == "batched"
    if c.batched:  # train.fused_conv=auto may build here and not there, or the other way
        c.keep_conv_kernel(meta.get("conv_kernel"))
    for k in glob:
        if k in meta["algo"]:  # a field added to State since the checkpoint keeps init's value
            setattr(state, k, _decode(meta["algo"][k], getattr(state, k), c.device))
    starts = np.asarray(meta["starts"])
    lo, hi = int(c.ids[0]), int(c.ids[-1]) + 1
    for r in range(len(starts) - 1):
        if starts[r + 1] <= lo or starts[r] >= hi:
            continue  # this part holds none of our clients
        part = _load(path / f"part-{r:04d}.pt", files)
        src_ids = np.asarray(part["ids"])
        take = np.flatnonzero((src_ids >= lo) & (src_ids < hi))
        dst = src_ids[take] - lo
        src_t, dst_t = torch.as_tensor(take), torch.as_tensor(dst, device=c.device)
        c.params[dst_t] = part["params"][src_t].to(c.device)
        if c.buffers.shape[1]:
            c.buffers[dst_t] = part["buffers"][src_t].to(c.device)
        for k, v in part["opt"].items():
            c.opt.state[k][dst_t] = v[src_t].to(c.device)
        for k in rows:
            src = part["algo"][k]
            if src is None:  # not set yet when the checkpoint was taken
                continue
            if not isinstance(src, list):  # rows of a tensor or array: decoded whole
                src = _decode(src, None, c.device)
            if getattr(state, k) is None:  # set during the run: make room for our rows
                setattr(state, k, _empty_rows(src, c.n, c.device))
            _fill_rows(getattr(state, k), src, take, dst, c.device)
    return int(meta["round"])


def _fill_rows(dst: Any, src: Any, take: np.ndarray, at: np.ndarray, device) -> None:
    if isinstance(dst, dict):  # e.g. an optimizer state of extra rows: name -> rows
        for k in dst:
            _fill_rows(dst[k], src[k], take, at, device)
    elif torch.is_tensor(dst):
        dst[torch.as_tensor(at, device=dst.device)] = torch.as_tensor(src)[torch.as_tensor(take)].to(dst.device)
    elif isinstance(dst, np.ndarray):
        dst[at] = np.asarray(src)[take]
    elif isinstance(dst, list):
        for s, d in zip(take, at):
            dst[d] = _decode(src[s], dst[d], device)
    else:
        raise TypeError(f"per-client state of type {type(dst).__name__} cannot be checkpointed")


def _empty_rows(like: Any, n: int, device) -> Any:
    if isinstance(like, dict):
        return {k: _empty_rows(v, n, device) for k, v in like.items()}
    if torch.is_tensor(like):
        return torch.zeros((n, *like.shape[1:]), dtype=like.dtype, device=device)
    if isinstance(like, np.ndarray):
        return np.zeros((n, *like.shape[1:]), like.dtype)
    return [None] * n


_PLAIN = (type(None), bool, int, float, str, bytes)


def _encode(v: Any, key: str) -> Any:
    """``v`` as what ``weights_only`` loading admits: tensors, plain values and
    containers; numpy arrays and dataclass records are wrapped (see :func:`_decode`)."""
    if torch.is_tensor(v):
        return v.detach().cpu()
    if isinstance(v, (np.ndarray, np.generic)):
        a = np.asarray(v)
        if a.dtype.kind not in "biufc":
            raise TypeError(f"algorithm state {key!r} of dtype {a.dtype} cannot be checkpointed")
        out = {_NUMPY: torch.from_numpy(np.ascontiguousarray(a).copy())}
        return {**out, "scalar": True} if isinstance(v, np.generic) else out
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {_FIELDS: {f.name: _encode(getattr(v, f.name), f"{key}.{f.name}") for f in dataclasses.fields(v)}}
    if isinstance(v, dict):
        return {k: _encode(x, f"{key}[{k!r}]") for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_encode(x, f"{key}[{i}]") for i, x in enumerate(v))
    if isinstance(v, _PLAIN):
        return v
    raise TypeError(f"algorithm state {key!r} of type {type(v).__name__} cannot be checkpointed")


def _decode(v: Any, like: Any, device) -> Any:
    """Undo :func:`_encode`. ``like`` is the value a fresh ``init`` made (or None):
    records are rebuilt as its type, tensors go to its device (else ``device``)."""
    if torch.is_tensor(v):
        return v.to(like.device if torch.is_tensor(like) else device)
    if isinstance(v, dict) and _NUMPY in v:
        a = v[_NUMPY].numpy().copy()
        return a[()] if v.get("scalar") else a
    if isinstance(v, dict) and _FIELDS in v:
        if not (dataclasses.is_dataclass(like) and not isinstance(like, type)):
            raise ConfigError("checkpoint holds a record where this algorithm keeps none; "
                              "delete the checkpoint or use run.resume=never")
        return dataclasses.replace(like, **{k: _decode(x, getattr(like, k, None), device)
                                            for k, x in v[_FIELDS].items()})
    if isinstance(v, dict):
        return {k: _decode(x, like.get(k) if isinstance(like, dict) else None, device) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        ref = like if isinstance(like, (list, tuple)) else ()
        return type(v)(_decode(x, ref[i] if i < len(ref) else None, device) for i, x in enumerate(v))
    return v

