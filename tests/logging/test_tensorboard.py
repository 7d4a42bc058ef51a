"""TensorBoard events (mpifl/logging/tensorboard.py): log.tensorboard writes each
round's scalars and the clients' test accuracies as a histogram under <run>/tb/
while the run goes; `python -m mpifl.results tensorboard` writes the same events
for finished runs; read back with TensorBoard's own EventAccumulator. Without
TensorBoard, asking for it is one line."""

from __future__ import annotations

import numpy as np
import pytest
from test_extend import _cfg

from mpifl import config
from mpifl.comm import world
from mpifl.errors import ConfigError
from mpifl.logging import tensorboard as tb
from mpifl.logging.h5 import open_run
from mpifl.paths import RunDir
from mpifl.results import main as results_main
from mpifl.run import runtime


def _events(folder) -> dict:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    ea.Reload()
    out = {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}
    out[tb.HISTOGRAM] = [(e.step, e.histogram_value.num, e.histogram_value.sum)
                         for e in ea.Histograms(tb.HISTOGRAM)]
    return out


@pytest.mark.slow  # a 4-round run and TensorBoard's reader: seconds
def test_a_run_writes_its_rounds_live_and_results_writes_the_same_afterwards(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    cfg = _cfg(tmp_path / "runs", 4, **{"log.tensorboard": True, "algorithm.name": "cfl", "cfl.warmup_rounds": 1})
    runtime.run(cfg, world())
    live = _events(RunDir(cfg.run_dir).tb)
    run = open_run(cfg.run_dir)
    acc, loss, sent = run.metric("test_acc"), run.metric("train_loss"), run.get("comm/bytes_sent")
    assert [s for s, _ in live["test/acc"]] == [1, 2, 3, 4]  # rounds from 1
    np.testing.assert_allclose([v for _, v in live["test/acc"]], acc.mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose([v for _, v in live["train/loss"]], np.nanmean(loss, axis=1), rtol=1e-6)
    np.testing.assert_allclose([v for _, v in live["traffic/bytes_sent"]], sent.sum(axis=1), rtol=1e-6)
    assert any(tag.startswith("cfl/") for tag in live)  # the algorithm's own per-round logs
    assert [n for _, n, _ in live[tb.HISTOGRAM]] == [6.0] * 4  # one value per client
    np.testing.assert_allclose([s for _, _, s in live[tb.HISTOGRAM]], acc.sum(axis=1), rtol=1e-6)

    out = tmp_path / "tb"
    assert results_main(["tensorboard", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert "wrote 1 run(s)" in capsys.readouterr().out
    after = _events(out / "r")
    assert after.keys() == live.keys()
    for tag in live:
        np.testing.assert_allclose(np.array(after[tag], float), np.array(live[tag], float), rtol=1e-6, err_msg=tag)
    # written again into the same folder: refused, each round would show twice
    assert results_main(["tensorboard", str(tmp_path / "runs"), "--out", str(out)]) == 2
    assert "already holds files" in capsys.readouterr().err


def test_a_sweeps_runs_are_named_by_their_swept_values():
    assert tb.run_name({"algorithm.name": "local", "run.seed": 0}, "000_x") == "algorithm.name=local,run.seed=0"
    assert tb.run_name({"base": "../jobs/quickstart.yaml", "algorithm.name": None}, "x") == \
        "base=quickstart,algorithm.name=~"
    assert tb.run_name(None, "r") == "r"


def test_scalars_leave_out_rounds_not_evaluated_and_sum_traffic():
    rows = {"metrics/test_acc": np.full(3, np.nan), "metrics/train_loss": np.array([1.0, 2.0, 3.0]),
            "comm/bytes_sent": np.array([4, 4, 4]), "clients/cluster": np.zeros(3), "fedem/weights": np.ones((3, 2)),
            "cfl/split": np.array([0.0, 1.0, 1.0])}
    assert tb.scalars(rows) == {"train/loss": 2.0, "traffic/bytes_sent": 12.0, "cfl/split": 2 / 3}


def test_without_tensorboard_asking_for_it_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tb, "installed", lambda: False)
    with pytest.raises(ConfigError) as e:
        config.load(None, ["log.tensorboard=true"])
    assert str(e.value) == "log.tensorboard=true " + tb.MISSING
    config.load(None, ["log.tensorboard=false"])  # not asked for: nothing needed
    assert results_main(["tensorboard", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install -e '.[tb]'" in err


@pytest.mark.parametrize("kind", ["file", "link out", "link in"])
def test_a_tb_folder_follows_the_checkpoint_folders_rules(tmp_path, kind):
    """A run being extended whose ``tb`` is a regular file, or a link out of the run
    directory: refused in one line before any round (exit 2), the file and the
    foreign folder left as they were; a link to a folder inside the run is its own."""
    pytest.importorskip("tensorboard")
    runtime.run(_cfg(tmp_path / "runs", 1), world())
    rd = RunDir(tmp_path / "runs" / "r")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    if kind == "file":
        rd.tb.write_text("not mpifl's")
    elif kind == "link out":
        rd.tb.symlink_to(foreign)
    else:
        (rd.root / "events").mkdir()
        rd.tb.symlink_to(rd.root / "events")
    extended = _cfg(tmp_path / "runs", 2, **{"log.tensorboard": True})
    if kind == "link in":
        runtime.run(extended, world())
        assert list((rd.root / "events").iterdir())
        return
    with pytest.raises(ConfigError) as e:
        runtime.run(extended, world())
    assert "\n" not in str(e.value) and str(e.value).startswith(f"TensorBoard folder {str(rd.tb)!r} is ")
    assert list(foreign.iterdir()) == [] and open_run(rd.root).rounds.tolist() == [0]
    if kind == "file":
        assert rd.tb.read_text() == "not mpifl's"
