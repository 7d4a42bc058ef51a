"""python -m mpifl.analyze on logs written by real short runs (complete, in
progress and killed) and on hand-written logs holding the seed algorithms' extras.

Bits: the one exact comparison is of a hand-written log's mixing rows read back from
its compact and dense forms (stored values): any CPU."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from mpifl import analyze as an
from mpifl import config
from mpifl.analysis import plots, tables
from mpifl.analysis import summary as sm
from mpifl.logging.h5 import Writer, open_run
from mpifl.logging.mixing import Dense

ROOT = Path(__file__).resolve().parent.parent
TINY = {
    "run": {"rounds": 3, "threads": 1},
    "data": {"name": "synthetic", "n_samples": 300, "n_clients": 6, "n_clusters": 3},
    "model": {"hidden": [8]},
}


def _cfg(**sections) -> config.Config:
    raw = {k: dict(v) for k, v in TINY.items()}
    for sec, vals in sections.items():
        raw.setdefault(sec, {}).update(vals)
    return config.from_dict(raw)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """2 algorithms x 2 seeds of real runs (this process, one rank)."""
    from mpifl.comm import world
    from mpifl.run import runtime

    root = tmp_path_factory.mktemp("sweep")
    for algo in ("fedavg", "oracle"):
        for seed in (0, 1):
            runtime.run(_cfg(run={"seed": seed, "name": f"{algo}-{seed}", "out_dir": str(root / "runs")},
                             algorithm={"name": algo}), world())
    return root


def _png_ok(path: Path) -> None:
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] >= 200 and img.shape[1] >= 200, (path, img.shape)
    assert img[..., :3].std() > 0.01, f"{path} is blank"


def _by_hand(path: Path, window: int = 10) -> dict:
    """Independent reading of one log with h5py: final, tail (last ``window`` evaluated
    rounds), weighted, best-val."""
    with h5py.File(path, "r") as f:
        n = f["rounds/round"].shape[0]
        test, val = f["metrics/test_acc"][:n], f["metrics/val_acc"][:n]
        w = f["clients/n_test"][()].astype(float)
    last = max(t for t in range(n) if not np.isnan(test[t]).all())
    best = test[np.nanargmax(np.where(np.isnan(val), -np.inf, val), axis=0), np.arange(test.shape[1])]
    evaluated = [t for t in range(n) if not np.isnan(test[t]).all()][-window:]
    tail = test[evaluated].mean(0)
    return {"final_acc": test[last].mean(), "final_acc_w": (test[last] * w).sum() / w.sum(),
            "tail_acc": tail.mean(), "tail_acc_w": (tail * w).sum() / w.sum(),
            "best_acc": best.mean(), "best_acc_w": (best * w).sum() / w.sum()}


# --------------------------------------------------------------------------- real runs


def test_table_groups_by_what_varies_with_mean_and_std_over_seeds(sweep_dir, tmp_path):
    res = an.analyze([sweep_dir], tmp_path, heatmaps="none", echo=lambda *a, **k: None)
    assert res["keys"] == ["algorithm.name"]  # seed, name, out_dir vary but are not groups
    rows = {r["algorithm.name"]: r for r in res["rows"]}
    assert set(rows) == {"fedavg", "oracle"}
    for algo, row in rows.items():
        assert row["n_seeds"] == 2 and row["seeds"] == "0 1" and row["rounds"] == "3/3"
        per_seed = [_by_hand(sweep_dir / "runs" / f"{algo}-{s}" / "run.h5") for s in (0, 1)]
        for m in sm.ACC:  # in percent
            vals = [100 * p[m] for p in per_seed]
            assert row[f"{m}_pct_mean"] == pytest.approx(np.mean(vals), abs=1e-7), m
            assert row[f"{m}_pct_std"] == pytest.approx(np.std(vals, ddof=1), abs=1e-7), m  # sample std
    # the true-cluster oracle's collaboration graph is the clusters; FedAvg's is one block
    assert rows["oracle"]["ari_graph.mixing_mean"] == pytest.approx(1.0)
    assert rows["fedavg"]["ari_graph.mixing_mean"] == pytest.approx(0.0)
    assert len((tmp_path / "runs.csv").read_text().splitlines()) == 5


def test_csv_and_markdown_tables_hold_the_same_numbers_in_the_unit_their_headers_name(sweep_dir, tmp_path):
    import csv

    an.analyze([sweep_dir], tmp_path, heatmaps="none", echo=lambda *a, **k: None)
    table = list(csv.DictReader(open(tmp_path / "table.csv")))
    assert list(table[0])[:5] == ["algorithm.name", "n_seeds", "seeds", "rounds", "final_acc_pct_mean"]
    md = [line for line in (tmp_path / "table.md").read_text().splitlines() if line.startswith("| ")]
    head = [c.strip() for c in md[0].strip("|").split("|")]
    assert "final_acc_pct" in head and "final_acc" not in head
    for line, row in zip(md[1:], table):
        cells = dict(zip(head, (c.strip() for c in line.strip("|").split("|"))))
        mean, std = map(float, cells["final_acc_pct"].split(" ± "))
        assert mean == pytest.approx(float(row["final_acc_pct_mean"]), abs=0.006)
        assert std == pytest.approx(float(row["final_acc_pct_std"]), abs=0.006)
        assert 1 < mean <= 100  # percent, not a fraction
    runs = list(csv.DictReader(open(tmp_path / "runs.csv")))
    by_algo = {a: [float(r["final_acc_pct"]) for r in runs if r["algorithm.name"] == a] for a in ("fedavg", "oracle")}
    for row in table:
        assert float(row["final_acc_pct_mean"]) == pytest.approx(np.mean(by_algo[row["algorithm.name"]]), rel=1e-5)


@pytest.mark.slow
def test_figures_are_non_empty_pngs(sweep_dir, tmp_path):
    res = an.analyze([sweep_dir], tmp_path, heatmaps="all", rounds=[1, -1], echo=lambda *a, **k: None)
    names = {p.relative_to(tmp_path).as_posix() for p in res["figures"]}
    assert {"accuracy.png", "variance.png", "ari.png"} <= names
    assert {f"heatmaps/{a}-{s}/graph_mixing.png" for a in ("fedavg", "oracle") for s in (0, 1)} <= names
    for p in res["figures"]:
        _png_ok(p)


@pytest.mark.slow
def test_cli_defaults_to_an_analysis_folder_and_reports_missing_paths(sweep_dir, tmp_path, capsys):
    one = sweep_dir / "runs" / "oracle-1"
    assert an.main([str(one)]) == 0
    assert (one / "analysis" / "table.md").is_file()
    assert "oracle" in capsys.readouterr().out
    assert an.main([str(tmp_path / "nothing")]) == 2


def test_a_folder_of_links_to_runs_is_analysed_and_a_run_linked_twice_read_once(sweep_dir, tmp_path):
    """Runs of several sweeps gathered by symbolic links (one sweep's controls beside
    another's re-run arm) are found under the links; the same run twice counts once."""
    merged = tmp_path / "merged"
    (merged / "more").mkdir(parents=True)
    for run in ("fedavg-0", "fedavg-1", "oracle-0"):
        (merged / run).symlink_to(sweep_dir / "runs" / run)
    (merged / "more" / "again").symlink_to(sweep_dir / "runs" / "fedavg-0")
    logs = sm.find_logs([merged])
    assert sorted(p.resolve() for p in logs) == sorted(
        (sweep_dir / "runs" / r / "run.h5").resolve() for r in ("fedavg-0", "fedavg-1", "oracle-0"))


@pytest.mark.slow
def test_a_run_in_progress_and_then_killed_is_analyzed_up_to_its_last_round(tmp_path):
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "mpifl.main", "run.rounds=100000", "run.eval_every=2", "run.name=long",
           f"run.out_dir={out}", "run.threads=1", "data.name=synthetic", "data.n_samples=300",
           "data.n_clients=6", "data.n_clusters=3", "model.hidden=[8]", "algorithm.name=oracle"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                if open_run(out / "long").n_rounds >= 3:
                    break
            except (OSError, KeyError):
                pass
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.2)
        live = an.analyze([out], tmp_path / "live", echo=lambda *a, **k: None)
        (r,) = live["runs"]
        assert 3 <= r.rounds_done < 100000 and not r.complete
        assert "(incomplete)" in live["rows"][0]["rounds"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    res = an.analyze([out], tmp_path / "dead", echo=lambda *a, **k: None)
    (r,) = res["runs"]
    log = open_run(out / "long")
    assert r.rounds_done == log.n_rounds >= 3 and r.rounds_planned == 100000
    # eval_every=2: rounds 2, 4, ... are evaluated; the final one is the last of them
    assert r.final_round == (log.n_rounds // 2) * 2 - 1
    assert r.final_acc == pytest.approx(_by_hand(log.path)["final_acc"])
    assert r.best_acc == pytest.approx(_by_hand(log.path)["best_acc"])
    for p in res["figures"]:
        _png_ok(p)


# --------------------------------------------------------------------------- hand-written logs


N, R, C = 6, 4, 3
CLUSTER = np.array([2, 0, 1, 0, 2, 1])  # not sorted: heatmaps must order them


def _write_log(path: Path, dense_max: int = 1024, extras: bool = True, planned: int = R + 2) -> Writer:
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = _cfg(run={"rounds": planned, "name": path.parent.name}, algorithm={"name": "oracle"})
    clients = {"cluster": CLUSTER, "n_test": np.array([10, 20, 10, 20, 10, 30])}
    w = Writer(path, {"algorithm": "oracle", "seed": 0, "n_clients": N, "config_yaml": cfg.to_yaml()}, clients, N,
               dense_max=dense_max)
    same = (CLUSTER[:, None] == CLUSTER[None, :]).astype(np.float32)
    for t in range(R):
        evaluated = t != 1  # round 1 not evaluated (eval_every)
        val = np.full(N, np.nan) if not evaluated else np.full(N, 0.5)
        test = np.full(N, np.nan) if not evaluated else np.full(N, 0.1 * (t + 1))
        if t == 2:
            val[:3] = 0.9  # clients 0-2 peak on validation at round 2
        rows = {"metrics/val_acc": val, "metrics/test_acc": test, "metrics/train_loss": np.ones(N)}
        once = {}
        if extras:
            rows["federico/client_weights"] = same / same.sum(1, keepdims=True)
            rows["dpfl/collaborators"] = same.astype(bool)
            rows["fedc2i/class_influence"] = np.repeat(same[:, :, None], 5, axis=2)
            if t == 2:
                once["lia/influence"] = same - 0.5  # signed
                once["pfedlia/cluster"] = (CLUSTER + 1) % 3  # the true clusters under other names
        w.write_round(t, {"wall_s": 1.0}, rows, mixing=Dense(same / same.sum(1, keepdims=True)), once=once)
    return w


def test_best_val_and_final_follow_their_definitions(tmp_path):
    _write_log(tmp_path / "a" / "run.h5")
    s = sm.summarize(tmp_path / "a" / "run.h5")
    assert s.rounds_done == R and s.rounds_planned == R + 2 and not s.complete
    assert s.final_round == R - 1 and s.final_acc == pytest.approx(0.1 * R)
    # clients 0-2 best on val at round 2 (test 0.3); 3-5 tie at 0.5 from round 0 on: first one (0.1)
    best = np.array([0.3, 0.3, 0.3, 0.1, 0.1, 0.1])
    w = np.array([10, 20, 10, 20, 10, 30])
    assert s.best_acc == pytest.approx(best.mean())
    assert s.best_acc_w == pytest.approx((best * w).sum() / w.sum())
    assert np.isnan(s.curve[1]) and s.curve[3] == pytest.approx(0.1 * R)


@pytest.mark.slow
def test_every_matrix_log_gets_a_heatmap_and_clusterings_an_ari(tmp_path):
    _write_log(tmp_path / "a" / "run.h5")
    run = open_run(tmp_path / "a")
    assert set(run.matrices) == {"graph/mixing", "federico/client_weights", "dpfl/collaborators",
                                   "fedc2i/class_influence", "lia/influence"}
    s = sm.summarize(run.path)
    assert s.ari == pytest.approx({"graph.mixing": 1.0, "dpfl.collaborators": 1.0, "pfedlia.cluster": 1.0})
    written = plots.plot_heatmaps(run, tmp_path / "h", rounds=[1, -1])
    assert {p.name for p in written} == {"graph_mixing.png", "federico_client_weights.png",
                                         "dpfl_collaborators.png", "fedc2i_class_influence.png",
                                         "lia_influence.png"}
    for p in written:
        _png_ok(p)


def test_compact_mixing_reads_and_plots_like_dense(tmp_path):
    _write_log(tmp_path / "d" / "run.h5", extras=False)
    _write_log(tmp_path / "c" / "run.h5", dense_max=2, extras=False)
    dense, compact = open_run(tmp_path / "d"), open_run(tmp_path / "c")
    assert "graph/mixing" not in compact.keys()  # noqa: SIM118 - a list of dataset paths
    assert "graph/mixing" in compact.matrices
    for t in (0, -1):
        np.testing.assert_array_equal(dense.row("graph/mixing", t), compact.row("graph/mixing", t))
    assert sm.summarize(compact.path).ari == sm.summarize(dense.path).ari
    (p,) = plots.plot_heatmaps(compact, tmp_path / "h", rounds=None)
    _png_ok(p)


def test_reader_cuts_to_complete_rounds_and_indexes_from_the_end(tmp_path):
    _write_log(tmp_path / "a" / "run.h5", extras=False)
    with h5py.File(tmp_path / "a" / "run.h5", "a") as f:  # a round cut short: rows past /rounds/round
        f["metrics/test_acc"].resize(R + 1, axis=0)
        f["metrics/test_acc"][R] = 7.0
    run = open_run(tmp_path / "a")
    info = run.datasets
    assert info["metrics/test_acc"].shape == (R, N) and info["metrics/test_acc"].per_round
    assert run.row("metrics/test_acc", -1) == pytest.approx(np.full(N, 0.1 * R))
    with pytest.raises(IndexError):
        run.row("metrics/test_acc", R)
    assert sm.summarize(run.path).final_acc == pytest.approx(0.1 * R)


def test_unreadable_logs_are_reported_not_fatal(tmp_path):
    _write_log(tmp_path / "good" / "run.h5", extras=False)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.h5").write_bytes(b"not hdf5")
    lines = []
    res = an.analyze([tmp_path], tmp_path / "out", heatmaps="none", echo=lambda *a, **k: lines.append(a[0]))
    assert len(res["runs"]) == 1 and len(res["skipped"]) == 1
    assert any(line.startswith(f"skipped {tmp_path / 'bad' / 'run.h5'}") for line in lines)


def _summary(seed: int, **sections) -> sm.Summary:
    cfg = sm.flatten(_cfg(**sections, run={"seed": seed, "name": f"r{seed}"}).to_dict())
    return sm.Summary(Path("x"), "x", cfg, seed, 1, 1, 0, *[0.5] * 6, np.zeros(N), np.zeros(1))


def test_grouping_keys_are_the_config_keys_that_differ(tmp_path):
    def summary(lr: float, seed: int) -> sm.Summary:
        return _summary(seed, train={"lr": lr})

    runs = [summary(lr, s) for lr in (0.1, 0.2) for s in (0, 1, 2)]
    keys = tables.varying_keys(runs)
    assert keys == ["algorithm.name", "train.lr"]
    groups = tables.group_runs(runs, keys)
    assert [g.key for g in groups] == [("fedavg", "0.1"), ("fedavg", "0.2")]
    assert all(len(g.runs) == 3 for g in groups)


def test_other_algorithms_sections_do_not_split_or_label_a_baseline():
    # a sweep over pFedLIA's metric beside FedAvg and Local: the baselines never read
    # pfedlia.*, so they form one row each, labelled "–" for that key
    runs = [_summary(s, algorithm={"name": "pfedlia"}, pfedlia={"metric": m, "warmup_rounds": 1})
            for m in ("euclidean", "cosine") for s in (0, 1)]
    runs += [_summary(s, algorithm={"name": a}, pfedlia={"metric": m})
             for a in ("fedavg", "local") for m in ("euclidean", "cosine") for s in (0, 1)]
    keys = tables.varying_keys(runs)
    assert keys == ["algorithm.name", "pfedlia.metric"]
    groups = {g.key: len(g.runs) for g in tables.group_runs(runs, keys)}
    assert groups == {("pfedlia", "euclidean"): 2, ("pfedlia", "cosine"): 2, ("fedavg", "–"): 4, ("local", "–"): 4}
    # a key only other algorithms vary is no grouping key at all
    assert tables.varying_keys([_summary(0, algorithm={"name": "fedavg"}, federico={"k": k}) for k in (2, 3)]) \
        == ["algorithm.name"]


def test_a_non_hdf5_file_is_skipped_with_one_plain_line(tmp_path, sweep_dir):
    (tmp_path / "notes.txt").write_text("not a log")
    lines = []
    res = an.analyze([tmp_path / "notes.txt", sweep_dir / "runs" / "fedavg-0"], tmp_path / "out",
                     heatmaps="none", echo=lambda *a, **k: lines.append(a[0]))
    assert len(res["runs"]) == 1
    assert f"skipped {tmp_path / 'notes.txt'}: not an HDF5 file" in lines


def test_learned_weight_graphs_are_clustered_spectrally_for_the_ari(tmp_path):
    """FedFomo's affinity / pFedGraph's graph: dense, noisy, signed weights whose
    blocks are the true clusters; spectral clustering finds them, and a graph
    that ignores the clusters scores about 0."""
    n, truth = 30, np.repeat(np.arange(3), 10)
    g = np.random.default_rng(0)
    block = (truth[:, None] == truth[None, :]) + g.uniform(-0.3, 0.4, (n, n))  # noisy, some negative
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(truth, sm.spectral(block, 3)) == 1.0
    assert abs(adjusted_rand_score(truth, sm.spectral(g.uniform(0, 1, (n, n)), 3))) < 0.2
    path = tmp_path / "f" / "run.h5"
    path.parent.mkdir(parents=True)
    cfg = _cfg(run={"rounds": 2, "name": "f"}, algorithm={"name": "fedfomo"})
    w = Writer(path, {"algorithm": "fedfomo", "seed": 0, "n_clients": n, "config_yaml": cfg.to_yaml()},
               {"cluster": truth, "n_test": np.full(n, 10)}, n)
    for t in range(2):
        w.write_round(t, {"wall_s": 1.0}, {"metrics/test_acc": np.full(n, 0.5), "metrics/val_acc": np.full(n, 0.5),
                                          "fedfomo/affinity": (block if t else -block).astype(np.float32),
                                          "pfedgraph/graph": np.full((n, n), 1 / n, np.float32)})
    w.close()
    ari = sm.summarize(path).ari
    assert ari["spectral.fedfomo.affinity"] == 1.0  # the last round's graph
    assert abs(ari["spectral.pfedgraph.graph"]) < 0.2  # nothing to find in a uniform graph


def test_a_sweep_over_job_files_is_grouped_by_file_and_algorithm(tmp_path):
    def point(name: str, base: str, algo: str, seed: int, lr: float) -> tuple[str, str, sm.Summary]:
        log = tmp_path / "sw" / "runs" / name / "run.h5"
        cfg = sm.flatten(_cfg(train={"lr": lr}, algorithm={"name": algo}, run={"seed": seed}).to_dict())
        return name, base, sm.Summary(log, name, cfg, seed, 1, 1, 0, *[0.5] * 6, np.zeros(N), np.zeros(1))

    made = [point(f"{i:03d}", base, algo, seed, lr) for i, (base, lr, algo, seed) in enumerate(
        (b, lr, a, s) for b, lr in (("../a.yaml", 0.1), ("../b.yaml", 0.2)) for a in ("oracle", "local")
        for s in (0, 1))]
    (tmp_path / "sw" / "runs").mkdir(parents=True)
    (tmp_path / "sw" / "sweep.yaml").write_text(yaml.safe_dump(
        {"points": [{"name": n, "values": {"base": b}} for n, b, _ in made]}))
    runs = []
    for _, _, r in made:
        job = sm.sweep_job(r.path)
        runs.append(sm.Summary(**{**r.__dict__, "config": {**r.config, sm.JOB: job}}))
    assert [r.config[sm.JOB] for r in runs] == ["a"] * 4 + ["b"] * 4
    keys = tables.varying_keys(runs)
    assert keys == ["algorithm.name", sm.JOB]  # train.lr follows from the file
    assert [g.key for g in tables.group_runs(runs, keys)] == [("oracle", "a"), ("local", "a"), ("oracle", "b"),
                                                          ("local", "b")]
    assert sm.sweep_job(tmp_path / "elsewhere" / "run.h5") is None


# --------------------------------------------------------------------------- figures that explain themselves


@pytest.mark.slow
@pytest.mark.parametrize("classes", [N, 10])  # as many classes as clients, and more
def test_label_hist_is_drawn_as_clients_by_classes_whatever_its_shape(tmp_path, classes):
    import matplotlib.image as mpimg

    path = tmp_path / "a" / "run.h5"
    w = _write_log(path, extras=False)
    hist = np.arange(N * classes).reshape(N, classes)
    with h5py.File(path, "a") as f:
        f["clients/label_hist"] = hist
    run = open_run(path)
    assert "clients/label_hist" not in run.matrices  # not a client-by-client matrix even when N == classes
    written = {p.name: p for p in plots.plot_heatmaps(run, tmp_path / "h", rounds=None)}
    assert set(written) == {"graph_mixing.png", "clients_label_hist.png"}
    _png_ok(written["clients_label_hist.png"])
    if classes > N:  # wider than tall: classes across, clients down
        img = mpimg.imread(written["clients_label_hist.png"])
        assert img.shape[1] > img.shape[0]
    del w


def test_group_labels_name_their_keys(tmp_path):
    runs = [_summary(0, algorithm={"name": "oracle"}, train={"lr": 0.1}),
            _summary(1, algorithm={"name": "local"}, train={"lr": 0.2})]
    keys = tables.varying_keys(runs)
    assert [g.label for g in tables.group_runs(runs, keys)] == ["algorithm.name=oracle, train.lr=0.1",
                                                            "algorithm.name=local, train.lr=0.2"]


def test_heatmap_rounds_are_numbered_from_one_and_the_missing_ones_warned_about():
    said = []
    assert plots._rounds([1, 50, -1], np.arange(30), "run x", said.append) == [0, 29]
    assert len(said) == 1 and "--rounds 50" in said[0] and "rounds 1-30" in said[0] and "left out" in said[0]
    said.clear()
    logged = np.array([1, 3, 5])  # log.every = 2: rounds 2, 4, 6
    assert plots._rounds([2, 3, -1], logged, "run x", said.append) == [0, 2]
    assert len(said) == 1 and "--rounds 3" in said[0] and "3 of them logged" in said[0]
    assert plots._rounds(None, np.arange(30), "run x", said.append) == [0, 15, 29]


def test_a_rounds_value_is_the_mean_over_clients_at_that_round_or_nan(tmp_path):
    """``val_acc@R`` / ``test_acc@R`` (a record's per-round rows): round R numbered
    from 1; NaN at a round not evaluated or not logged."""
    _write_log(tmp_path / "a" / "run.h5")
    s = sm.summarize(tmp_path / "a" / "run.h5")
    assert sm.metric_value(s, "val_acc@3") == pytest.approx(100 * (3 * 0.9 + 3 * 0.5) / 6)
    assert sm.metric_value(s, "val_acc@1") == pytest.approx(50.0)
    assert sm.metric_value(s, "test_acc@4") == pytest.approx(100 * 0.1 * 4)
    assert math.isnan(sm.metric_value(s, "val_acc@2"))  # round 2 was not evaluated
    assert math.isnan(sm.metric_value(s, f"val_acc@{R + 1}"))  # nor logged


def test_a_record_with_rounds_holds_them_per_run(tmp_path):
    from mpifl.analysis import record

    _write_log(tmp_path / "a" / "run.h5", planned=R)  # a record holds finished runs
    an.analyze([tmp_path / "a"], tmp_path / "out", heatmaps="none", echo=lambda *a, **k: None,
               record=tmp_path / "r.csv", record_rounds=(1, 3))
    got = {r.metric: r.value for r in record.read(tmp_path / "r.csv")}
    assert got["val_acc@1"] == pytest.approx(50.0) and got["val_acc@3"] == pytest.approx(70.0)
    assert "final_acc" in got and "val_acc@2" not in got


@pytest.mark.parametrize("argv, says", [(["x", "--record-rounds", "10"], "needs --record FILE"),
                                        (["x", "--record", "r.csv", "--record-rounds", "-1"], "not from the end")])
def test_record_rounds_without_a_record_or_from_the_end_is_refused(capsys, argv, says):
    with pytest.raises(SystemExit):
        an.main(argv)
    assert says in capsys.readouterr().err


def test_rounds_zero_is_refused_on_the_command_line(capsys):
    with pytest.raises(SystemExit):
        an.main(["x", "--rounds", "0,-1"])
    assert "numbered from 1" in capsys.readouterr().err


def test_a_log_older_than_a_key_reads_as_its_default(tmp_path):
    """A run logged before ``local.sampled_only`` and ``data.train_per_client``
    existed ran as their defaults say, and is grouped and matched as such."""
    cfg = _cfg(run={"name": "old"}, algorithm={"name": "local"}).to_dict()
    del cfg["local"], cfg["data"]["train_per_client"]
    path = tmp_path / "old" / "run.h5"
    path.parent.mkdir()
    w = Writer(path, {"algorithm": "local", "seed": 0, "n_clients": N, "config_yaml": yaml.safe_dump(cfg)},
               {"cluster": CLUSTER, "n_test": np.full(N, 10)}, N)
    w.write_round(0, {"wall_s": 1.0}, {"metrics/test_acc": np.full(N, 0.5), "metrics/val_acc": np.full(N, 0.5)})
    w.close()
    s = sm.summarize(path)
    assert s.config["local.sampled_only"] is False and s.config["data.train_per_client"] == 0
    new = _summary(0, algorithm={"name": "local"}, local={"sampled_only": True})
    assert tables.varying_keys([s, new]) == ["algorithm.name", "local.sampled_only"]


def _made_by(commit: str, cpu: str) -> dict:
    return {"mpifl": {"commit": commit * 40, "dirty": False}, "cpu_capability": cpu, "device": "cpu"}


def test_a_table_names_what_it_is_made_of_and_warns_when_it_mixes():
    runs = [_summary(s) for s in range(4)]
    for r, p in zip(runs, [_made_by("a", "AVX2"), _made_by("a", "AVX2"), _made_by("b", "AVX512"), {}]):
        r.provenance = p
    said = []
    line = tables.table_provenance(runs, "the table", said.append)
    assert line == ("provenance: commits aaaaaaa (2), bbbbbbb (1), unknown (1); CPU capabilities AVX2 (2), "
                    "AVX512 (1), unknown (1); devices cpu (3), unknown (1) (runs in brackets)")
    assert [s.split(" (")[0] for s in said] == [f"mpifl.analyze: warning: the table mixes runs of {n} {w}"
                                                for n, w in ((3, "commits"), (3, "CPU capabilities"), (2, "devices"))]
    said.clear()
    assert "commit aaaaaaa (2); CPU capability AVX2 (2)" in tables.table_provenance(runs[:2], "t", said.append)
    assert said == []  # one commit, one CPU, one device: nothing to warn about


@pytest.mark.slow
def test_analyze_reads_provenance_from_the_logs_and_survives_logs_without(tmp_path):
    for name, p in (("new", _made_by("c", "AVX2")), ("old", None)):
        w = _write_log(tmp_path / name / "run.h5", extras=False)
        if p is not None:
            w.set_attrs(provenance=p)
        w.close()
    said = []
    res = an.analyze([tmp_path], tmp_path / "out", heatmaps="none", echo=lambda *a, **k: said.append(a[0]))
    assert {r.name: bool(r.provenance) for r in res["runs"]} == {"new": True, "old": False}
    assert any(s.startswith("provenance: commits ccccccc (1), unknown (1); ") for s in said)
    assert "provenance" not in (tmp_path / "out" / "table.md").read_text()  # printed: the file is the table
    assert any(s.startswith("mpifl.analyze: warning: the table mixes runs of 2 commits") for s in said)


def _trained_on(kernel: str | None, threads: int = 1) -> dict:
    from mpifl.run.provenance import training

    return {**_made_by("a", "AVX2"), "train": training(kernel, threads, True)}


def test_runs_on_two_conv_kernels_are_grouped_apart_and_the_table_warns():
    """One config (train.fused_conv=auto) trained on the fused kernel where it built
    and on torch's where it did not: other sums, other numbers, so two groups, and
    the provenance line names both trainings with a warning."""
    runs = [_summary(s) for s in range(4)]
    for r, kernel in zip(runs, ["fused", "fused", "torch", "torch"]):
        r.provenance = _trained_on(kernel)
    keys = tables.varying_keys(runs)
    assert keys == ["algorithm.name", tables.KERNEL]
    assert sorted(g.key for g in tables.group_runs(runs, keys)) == [("fedavg", "fused"), ("fedavg", "torch")]
    said = []
    line = tables.table_provenance(runs, "the table", said.append)
    assert "; trainings batched, fused conv (" in line and "batched, torch conv, 1 thread (2)" in line
    assert [s.split(" (")[0] for s in said] == ["mpifl.analyze: warning: the table mixes runs of 2 trainings"]
    for r, threads in zip(runs, [1, 1, 2, 2]):  # one kernel, two thread counts: one group, still a warning
        r.provenance = _trained_on("torch", threads)
    said.clear()
    assert tables.varying_keys(runs) == ["algorithm.name"]
    tables.table_provenance(runs, "the table", said.append)
    assert said and "2 trainings (batched, torch conv, 1 thread (2), batched, torch conv, 2 threads (2))" in said[0]
    for r in runs:  # logs from before the training was recorded: left out of the line, no group, no warning
        r.provenance = _made_by("a", "AVX2")
    said.clear()
    assert "training" not in tables.table_provenance(runs, "the table", said.append) and not said
    assert tables.varying_keys(runs) == ["algorithm.name"]


@pytest.mark.slow
def test_a_folder_of_several_run_folders_is_refused_in_one_line_unless_forced(tmp_path, capsys):
    """Runs of two out_dirs under one path (two sweeps, unrelated runs under /tmp):
    one line naming them; one of them, or --force, analyzes."""
    from mpifl.comm import world
    from mpifl.run import runtime

    for where in ("a", "b"):
        runtime.run(_cfg(run={"out_dir": str(tmp_path / where), "name": "r", "rounds": 2}), world())
    capsys.readouterr()
    assert an.main([str(tmp_path), "--heatmaps", "none"]) == 2
    err = capsys.readouterr().err
    assert err == (f"mpifl.analyze: error: {tmp_path} holds runs of 2 folders ({tmp_path / 'a'}, {tmp_path / 'b'}): "
                   f"several sweeps or unrelated runs; name one (a sweep's folder, a run directory) or add --force "
                   f"to analyze them together\n")
    assert an.main([str(tmp_path / "a"), "--heatmaps", "none"]) == 0
    assert an.main([str(tmp_path), "--heatmaps", "none", "--force", "--out", str(tmp_path / "both")]) == 0
    assert "2 run(s)" in capsys.readouterr().out
