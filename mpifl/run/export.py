"""``python -m mpifl.results export RUN [--round N] [--out DIR]``: a run's models
as ``state_dict`` files that another program loads with plain torch.

The models come from the run's checkpoint (:mod:`mpifl.run.checkpoint`), which
holds every client's row and the algorithm's state: a finished run keeps the one
of its final round (unless ``run.keep_final_checkpoint: false``), a running or
stopped one its last ``run.keep_checkpoints``. ``--round N`` takes the checkpoint
of round N (from 1, as on the console) where one is kept, and is refused in one
line naming the rounds there are otherwise. Written under DIR (default
``RUN/export``, :class:`mpifl.paths.ExportDir`):

- ``clients/client-0007.pt``: client 7's row, the model mpifl trains for it (its
  own model for Local and the personalised methods; its last local update for
  FedAvg-like methods, whose clients are evaluated with the shared model);
- ``shared/model.pt``, ``shared/models-02.pt``: the algorithm's shared models
  (FedAvg's global model, Oracle's and CFL's cluster models, FedEM's components),
  its state fields of one or more full models;
- ``<field>/client-0007.pt``: a per-client model the algorithm keeps beside the
  row (Ditto's ``personal``, APFL's ``v``);
- ``index.json``: the run, the round, the config, how to build the model
  (``mpifl.models.architecture(cfg.model, in_shape, n_classes)``), every file by
  client or field, and the clients' ``test_acc`` the log holds for that round.

State that is not a full model (FedRoD's personal heads, prototypes, mixing
weights) is not exported. docs/analysis.md, "The models as files", loads one and
evaluates it to the logged accuracy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mpifl import config, models
from mpifl.data.shape import shape
from mpifl.errors import ConfigError
from mpifl.logging.h5 import open_run
from mpifl.paths import ExportDir, RunDir, atomic_write_text
from mpifl.run import checkpoint
from mpifl.train.layout import Layout


def pick(run: Path, round_: int | None) -> Path:
    """The checkpoint directory to export: round ``round_``'s, or the latest."""
    rd = RunDir(run)
    kept = checkpoint.checkpoints(rd)
    if not kept:
        raise ConfigError(f"{str(run)!r} holds no checkpoint, so no models to export (a finished run keeps its final "
                          f"round's unless run.keep_final_checkpoint=false; a run stopped before its first "
                          f"checkpoint has none)")
    if round_ is None:
        return checkpoint.latest(rd) or kept[max(kept)]
    if round_ not in kept:
        only = ", ".join(str(r) for r in sorted(kept))
        final = " (the final round's: a finished run keeps that one alone)" if len(kept) == 1 else ""
        raise ConfigError(f"--round {round_}: {str(run)!r} holds the models of round(s) {only} only{final}")
    return kept[round_]


def _state_dict(template: torch.nn.Module, layout: Layout, row: torch.Tensor,
                buffers: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """``template``'s state_dict with the parameters of ``row`` (and the float buffers of ``buffers``)."""
    sd = {k: v.clone() for k, v in template.state_dict().items()}
    sd.update({k: v.clone() for k, v in layout.unflatten(row).items()})
    if buffers is not None and layout.B:
        sd.update({k: v.clone() for k, v in layout.unflatten_buffers(buffers).items()})
    return sd


def export(run: str | Path, out: str | Path | None = None, round_: int | None = None) -> Path:
    """Write the models of ``run`` (a run directory or its run.h5) under ``out``; returns the index's path."""
    run = Path(run)
    run = run.parent if run.name == "run.h5" else run
    ck = pick(run, round_)
    meta = checkpoint.read_meta(ck)
    cfg = config.from_dict(meta["config"])
    dims = shape(cfg.data)
    if dims is None:
        raise ConfigError(f"the input shape of data.name={cfg.data.name!r} cannot be told without its files "
                          f"(data.root={cfg.data.root!r})")
    template = models.architecture(cfg.model, dims.in_shape, dims.n_classes)
    layout = Layout(template)
    ex = ExportDir(Path(out) if out is not None else RunDir(run).export)
    files: dict[str, Any] = {"clients": {}, "per_client": {}, "shared": {}}

    def save(sd: dict[str, torch.Tensor], path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(sd, path)
        return str(path.relative_to(ex.root))

    for r in range(len(np.asarray(meta["starts"])) - 1):
        part = checkpoint.read_part(ck, r)
        for i, cid in enumerate(np.asarray(part["ids"]).tolist()):
            bufs = part["buffers"][i] if part["buffers"].shape[1] else None
            files["clients"][str(cid)] = save(_state_dict(template, layout, part["params"][i], bufs), ex.client(cid))
            for field, rows in part["algo"].items():
                if torch.is_tensor(rows) and rows.dim() == 2 and rows.shape[1] == layout.P:
                    files["per_client"].setdefault(field, {})[str(cid)] = save(
                        _state_dict(template, layout, rows[i], None), ex.client(cid, field))
    for field, v in meta["algo"].items():
        if torch.is_tensor(v) and v.dim() in (1, 2) and v.shape[-1] == layout.P:
            rows = [(None, v)] if v.dim() == 1 else list(enumerate(v))
            files["shared"][field] = [save(_state_dict(template, layout, row, None), ex.shared(field, k))
                                      for k, row in rows]
    index = {"run": str(run.resolve()), "round": int(meta["round"]) + 1, "algorithm": cfg.algorithm.name,
             "model": {"name": cfg.model.name, "in_shape": list(dims.in_shape), "n_classes": dims.n_classes,
                       "build": "mpifl.models.architecture(cfg.model, in_shape, n_classes)"},
             **files, "test_acc": _logged(run, int(meta["round"])), "config": meta["config"]}
    atomic_write_text(ex.index, json.dumps(index, indent=1) + "\n")
    return ex.index


def _logged(run: Path, t: int) -> list[float] | None:
    """The clients' test_acc the log holds for round ``t`` (0-based); None where it has no such row."""
    log = RunDir(run).log
    if not log.is_file():
        return None
    r = open_run(log)
    rows = np.flatnonzero(np.asarray(r.rounds) == t)
    if not len(rows):
        return None
    return [None if np.isnan(a) else float(a) for a in np.asarray(r.metric("test_acc"))[rows[0]]]
