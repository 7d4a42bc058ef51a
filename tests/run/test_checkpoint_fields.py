"""A checkpoint written before a State field existed still resumes: the new field
keeps the value ``init`` gave it (fedavg_ft gained its best-validation fields).

Bits: the one exact comparison is of a model saved and loaded back (a copy): any
CPU."""

import hashlib
import json

import numpy as np
import torch
from helpers import DEVICE

from mpifl import config, models
from mpifl.algorithms import fedavg_ft
from mpifl.algorithms.base import Context
from mpifl.comm import Comm, solo
from mpifl.data import build
from mpifl.paths import RunDir
from mpifl.run import checkpoint
from mpifl.train import Clients


def test_state_field_missing_from_an_older_checkpoint_keeps_its_initial_value(tmp_path):
    cfg = config.load(None, ["data.name=synthetic", "data.n_samples=200", "data.n_clients=3", "data.partition=iid",
                             "model.hidden=[8]", "algorithm.name=fedavg_ft", "fedavg_ft.start=best_val"])
    comm = Comm(3, solo())
    data = build(cfg.data, 0, comm.local_ids)
    c = Clients(models.build(cfg.model, data.in_shape, data.n_classes, 0), data, cfg.train, DEVICE, 0)
    ctx = Context(cfg, comm, c, data)
    state = fedavg_ft.init(ctx)
    fedavg_ft.round(ctx, state, 0)
    path = checkpoint.save(RunDir(tmp_path), ctx, state, 0)
    meta = torch.load(path / checkpoint.META, weights_only=False)
    for k in ("best", "best_acc", "best_round"):  # as an mpifl before best_val wrote it
        del meta["algo"][k]
    torch.save(meta, path / checkpoint.META)
    manifest = json.loads((path / checkpoint.MANIFEST).read_text())  # as that mpifl's manifest would say
    data = (path / checkpoint.META).read_bytes()
    manifest["files"][checkpoint.META] = [len(data), hashlib.sha256(data).hexdigest()]
    (path / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    fresh = fedavg_ft.init(ctx)
    assert checkpoint.load(path, ctx, fresh) == 0
    assert torch.equal(fresh.model, state.model) and fresh.best is None and fresh.best_round == -1
    assert np.isfinite(fedavg_ft.evaluate(ctx, state, 0)["test_acc"]).all()
