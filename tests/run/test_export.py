"""python -m mpifl.results export (mpifl/run/export.py): a run's models as state_dict
files, loaded with plain torch by docs/analysis.md's snippet to the accuracy the
log holds; --round takes only the rounds a checkpoint is kept of."""

from __future__ import annotations

import json

import numpy as np
import pytest
from doc_blocks import blocks
from helpers import REPO

from mpifl import config
from mpifl.comm import world
from mpifl.results import main
from mpifl.run import runtime

TINY = ["data.name=synthetic", "data.n_samples=600", "data.n_clients=4", "data.n_clusters=2",
        "data.partition=clusters", "model.hidden=[16]", "run.threads=1", "run.rounds=3"]


def _snippet() -> str:
    found = [b.text for b in blocks(REPO / "docs" / "analysis.md") if b.lang == "python" and "index.json" in b.text]
    assert len(found) == 1
    return found[0]


def _run(out, name: str, *extra: str):
    cfg = config.load(None, [*TINY, f"run.out_dir={out}", f"run.name={name}", *extra])
    runtime.run(cfg, world())
    return cfg.run_dir


@pytest.mark.slow
def test_the_documented_snippet_loads_each_clients_model_to_the_logged_accuracy(tmp_path, monkeypatch, capsys):
    run = _run(tmp_path / "results", "quickstart", "algorithm.name=oracle")
    assert main(["export", str(run)]) == 0
    assert "wrote the models of round 3 (4 clients, shared: models)" in capsys.readouterr().out
    index = json.loads((run / "export" / "index.json").read_text())
    assert index["round"] == 3 and sorted(index["clients"]) == ["0", "1", "2", "3"]
    assert index["shared"] == {"models": ["shared/models-00.pt", "shared/models-01.pt"]}
    monkeypatch.chdir(tmp_path)
    for k in range(4):
        ns: dict = {}
        exec(compile(_snippet().replace("k = 3", f"k = {k}"), "docs/analysis.md", "exec"), ns)  # noqa: S102
        assert np.float32(ns["acc"]) == np.float32(index["test_acc"][k]), k  # the log holds float32
    assert "logged" in capsys.readouterr().out


@pytest.mark.slow
def test_a_shared_model_evaluates_to_the_logged_accuracy_and_other_rounds_are_refused(tmp_path, capsys):
    import torch

    from mpifl.data import build
    from mpifl.models import architecture

    run = _run(tmp_path, "f", "algorithm.name=fedavg")
    assert main(["export", str(run / "run.h5"), "--round", "3", "--out", str(tmp_path / "ex")]) == 0
    index = json.loads((tmp_path / "ex" / "index.json").read_text())
    cfg = config.from_dict(index["config"])
    model = architecture(cfg.model, tuple(index["model"]["in_shape"]), index["model"]["n_classes"])
    model.load_state_dict(torch.load(tmp_path / "ex" / index["shared"]["model"][0], weights_only=True))
    data = build(cfg.data, cfg.run.seed, np.arange(4))
    for k in range(4):
        a, n = data.offsets[k, 2], data.sizes[k, 2]
        with torch.no_grad():
            acc = float((model(torch.from_numpy(data.x[a:a + n])).argmax(1).numpy() == data.y[a:a + n]).mean())
        assert np.float32(acc) == np.float32(index["test_acc"][k]), k
    capsys.readouterr()
    assert main(["export", str(run), "--round", "2"]) == 2
    assert capsys.readouterr().err == (f"mpifl.results: error: --round 2: {str(run)!r} holds the models of round(s) "
                                       f"3 only (the final round's: a finished run keeps that one alone)\n")
    bare = _run(tmp_path, "none", "algorithm.name=local", "run.keep_final_checkpoint=false")
    assert main(["export", str(bare)]) == 2
    assert "holds no checkpoint, so no models to export" in capsys.readouterr().err
