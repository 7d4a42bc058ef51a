"""Checkpoints: all a run needs to continue after its last complete round.

Every random draw is keyed by (seed, round, client, purpose), so there is no
generator state to keep: the clients' rows (parameters, BatchNorm buffers,
optimizer state), the algorithm's state and the round number are the whole
state. Each rank writes its clients' rows, keyed by client id, so a run
checkpointed on R ranks resumes on any other number of ranks.

    <run>/checkpoint/latest              name of the newest complete checkpoint
    <run>/checkpoint/round-000012/meta.pt        round, config, replicated state
    <run>/checkpoint/round-000012/part-0003.pt   rank 3's clients

A checkpoint directory is filled under a temporary name and renamed when
complete; ``latest`` is replaced atomically after that. A kill at any moment
leaves the previous checkpoint intact.

Algorithm state: fields of the ``State`` dataclass marked with
:func:`per_client` hold one row (or list item) per local client — a tensor,
an array, a list, or a dict of those (an optimizer state of extra rows); every
other field must be identical on all ranks and is saved once, by rank 0.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import ConfigError
from .paths import RunDir, atomic_write_text

PER_CLIENT = "per_client"
LATEST = "latest"
META = "meta.pt"

# keys that may differ between a run and its resumption
MAY_CHANGE = {"run.rounds", "run.resume", "run.checkpoint_every", "run.threads", "run.device"}


TRANSIENT = "transient"


def per_client(**kwargs: Any) -> Any:
    """A State field whose first axis (or list index) is this rank's clients."""
    return dataclasses.field(metadata={PER_CLIENT: True}, **kwargs)


def transient(**kwargs: Any) -> Any:
    """A State field that lives within one round (not checkpointed)."""
    return dataclasses.field(metadata={TRANSIENT: True}, **kwargs)


def _fields(state: Any) -> tuple[list[str], list[str]]:
    if state is None or not dataclasses.is_dataclass(state):
        return [], []
    rows, glob = [], []
    for f in dataclasses.fields(state):
        if not f.metadata.get(TRANSIENT):
            (rows if f.metadata.get(PER_CLIENT) else glob).append(f.name)
    return rows, glob


def _save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def latest(rd: RunDir) -> Path | None:
    p = rd.checkpoint / LATEST
    if not p.is_file():
        return None
    d = rd.checkpoint / p.read_text().strip()
    return d if (d / META).is_file() else None


def save(rd: RunDir, ctx, state: Any, t: int, die_before_publish: bool = False) -> Path:
    """Collective: every rank writes its part; rank 0 the meta, then publishes.
    ``die_before_publish`` (tests) SIGKILLs the process with the parts written."""
    comm, c = ctx.comm, ctx.clients
    name = f"round-{t:06d}"
    final = rd.checkpoint / name
    tmp = rd.checkpoint / f".{name}.tmp"
    if comm.is_writer:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    comm.barrier()
    rows, glob = _fields(state)
    part = {
        "ids": np.asarray(c.ids),
        "params": c.params.detach().cpu(),
        "buffers": c.buffers.detach().cpu(),
        "opt": {k: v.detach().cpu() for k, v in c.opt.state.items()},
        "algo": {k: _cpu(getattr(state, k)) for k in rows},
    }
    _save(part, tmp / f"part-{comm.rank:04d}.pt")
    if die_before_publish:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    comm.barrier()
    if comm.is_writer:
        meta = {"round": t, "config": ctx.cfg.to_dict(), "n_ranks": comm.size,
                "starts": comm.placement.starts, "algo": {k: _cpu(getattr(state, k)) for k in glob}}
        _save(meta, tmp / META)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        atomic_write_text(rd.checkpoint / LATEST, name)
        for old in rd.checkpoint.glob("round-*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
    comm.barrier()
    return final


def read_meta(path: Path) -> dict:
    try:
        return torch.load(path / META, weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"checkpoint {str(path)!r} is unreadable ({type(e).__name__}); "
                          f"delete it or use run.resume=never") from None


def check_config(meta: dict, cfg_dict: dict, where: Path) -> None:
    from .config import config_class

    old, new = _flatten(meta["config"]), _flatten(cfg_dict)
    # a key added by a later mpifl was, in effect, at its default in the older run
    defaults = _flatten(config_class()().to_dict())
    old.update({k: defaults[k] for k in set(new) - set(old) if k in defaults})
    diff = sorted(k for k in set(old) | set(new) if k not in MAY_CHANGE and old.get(k) != new.get(k))
    if diff:
        shown = ", ".join(f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in diff[:6])
        more = f" and {len(diff) - 6} more" if len(diff) > 6 else ""
        raise ConfigError(f"run directory {str(where)!r} holds a run with a different config: {shown}{more}; "
                          f"use another run.name, or run.resume=never to start over")


def load(path: Path, ctx, state: Any) -> int:
    """Fill this rank's clients and ``state`` from a checkpoint; returns its round."""
    c = ctx.clients
    meta = read_meta(path)
    rows, glob = _fields(state)
    for k in glob:
        setattr(state, k, _like(meta["algo"][k], getattr(state, k), c.device))
    starts = np.asarray(meta["starts"])
    lo, hi = int(c.ids[0]), int(c.ids[-1]) + 1
    for r in range(len(starts) - 1):
        if starts[r + 1] <= lo or starts[r] >= hi:
            continue  # this part holds none of our clients
        try:
            part = torch.load(path / f"part-{r:04d}.pt", weights_only=False)
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"checkpoint part {str(path / f'part-{r:04d}.pt')!r} is unreadable "
                              f"({type(e).__name__}); delete the checkpoint or use run.resume=never") from None
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
            if getattr(state, k) is None:  # set during the run: make room for our rows
                setattr(state, k, _empty_rows(src, c.n, c.device))
            _fill_rows(getattr(state, k), src, take, dst)
    return int(meta["round"])


def _fill_rows(dst: Any, src: Any, take: np.ndarray, at: np.ndarray) -> None:
    if isinstance(dst, dict):  # e.g. an optimizer state of extra rows: name -> rows
        for k in dst:
            _fill_rows(dst[k], src[k], take, at)
    elif torch.is_tensor(dst):
        dst[torch.as_tensor(at, device=dst.device)] = torch.as_tensor(src)[torch.as_tensor(take)].to(dst.device)
    elif isinstance(dst, np.ndarray):
        dst[at] = np.asarray(src)[take]
    elif isinstance(dst, list):
        for s, d in zip(take, at):
            dst[d] = src[s]
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


def _cpu(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _cpu(x) for k, x in v.items()}
    return v.detach().cpu() if torch.is_tensor(v) else v


def _like(v: Any, ref: Any, device) -> Any:
    if isinstance(v, dict):
        return {k: _like(x, ref.get(k) if isinstance(ref, dict) else None, device) for k, x in v.items()}
    return v.to(ref.device if torch.is_tensor(ref) else device) if torch.is_tensor(v) else v


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out
