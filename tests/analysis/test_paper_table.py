"""Tables in a paper's layout: runs land in the cell of their row and column, the
cell's mean ± std is over seeds, the paper's figure and the verdict sit beside it."""

from pathlib import Path

import numpy as np
import pytest

from mpifl import analyze as an
from mpifl import config
from mpifl.analysis import summary as sm
from mpifl.analysis.paper_table import LayoutError, cells, load_layout, render


def summary(seed: int, acc: float, **sections) -> sm.Summary:
    cfg = sm.flatten(config.load(None, [f"{s}.{k}={v}" for s, kv in sections.items() for k, v in kv.items()]
                                 + [f"run.seed={seed}", "pfedlia.warmup_rounds=1"]).to_dict())
    return sm.Summary(Path("x"), f"r{seed}", cfg, seed, 1, 1, 0, acc, acc, acc, acc, acc, acc,
                      np.zeros(2), np.zeros(1))


LAYOUT = """
title: T
metric: final_acc
columns:
  Patho: {data.partition: clusters}
  Noisy: {data.partition: noisy_clusters}
rows:
  FedAvg: {algorithm.name: fedavg}
  Ours: {algorithm.name: pfedlia, pfedlia.mode: central}
paper:
  FedAvg: {Patho: [60.0, 5.0], Noisy: [66.0, 5.0]}
  Ours: {Patho: [99.0, 0.2], Noisy: [82.0, 3.0]}
"""


@pytest.fixture
def layout(tmp_path):
    f = tmp_path / "t.layout.yaml"
    f.write_text(LAYOUT)
    return load_layout(f)


def test_cells_hold_their_runs_and_the_table_shows_paper_and_verdict(layout):
    runs = [summary(s, a, algorithm={"name": "fedavg"}, data={"partition": "clusters"})
            for s, a in ((0, 0.60), (1, 0.70))]
    runs += [summary(s, a, algorithm={"name": "pfedlia"}, data={"partition": "clusters"})
             for s, a in ((0, 0.95), (1, 0.97))]
    runs += [summary(0, 0.90, algorithm={"name": "pfedlia"}, data={"partition": "noisy_clusters"})]
    runs += [summary(0, 0.5, algorithm={"name": "local"}, data={"partition": "clusters"})]  # in no row
    got, notes = cells(layout, runs)
    assert sorted(got) == [("FedAvg", "Patho"), ("Ours", "Noisy"), ("Ours", "Patho")]
    assert got[("FedAvg", "Patho")].seeds == [0, 1]
    assert len(notes) == 1 and "no row" in notes[0]
    md = render(layout, runs)
    # FedAvg Patho: mean 65.00, sample std 7.07, within the paper's 60 +- 5? 65 - 60 = 5 <= 5: yes
    assert "| FedAvg | 65.00 ± 7.07 [2] (paper 60.00 ± 5.00) = | not run (paper 66.00 ± 5.00) |" in md
    # Ours Patho: 96.00 vs 99 +- 0.2: 3 points below
    assert "96.00 ± 1.41 [2] (paper 99.00 ± 0.20) -3.00" in md
    assert "90.00 [1] (paper 82.00 ± 3.00) +8.00" in md
    assert "- Patho: ours Ours > FedAvg; paper Ours > FedAvg (same order)" in md


@pytest.mark.parametrize("text,where", [
    ("rows: {A: {algorithm.name: fedavg}}\ncolumns: {B: {run.seed: 0}}\nmetric: acc", "metric='acc'"),
    ("rows: {A: {algorithm.name: fedavg}}\ncolumns: {B: {run.seed: 0}}\npaper: {Z: {B: [1, 2]}}", "paper.Z"),
    ("rows: {A: {algorithm.name: fedavg}}\ncolumns: {B: {run.seed: 0}}\npaper: {A: {B: [1]}}", "paper.A.B"),
    ("rows: []\ncolumns: {B: {run.seed: 0}}", "rows"),
    ("rows: {A: {algorithm.name: fedavg}}\ncolumns: {B: {run.seed: 0}}\nextra: 1", "unknown key 'extra'"),
])
def test_a_bad_layout_is_one_line_naming_the_key(tmp_path, text, where):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(LayoutError) as e:
        load_layout(f)
    assert where in str(e.value) and "\n" not in str(e.value)


def test_analyze_cli_renders_a_layout_and_refuses_a_bad_one(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rows: 1")
    assert an.main([str(tmp_path), "--layout", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "rows must map labels" in capsys.readouterr().err


def test_an_unfinished_run_is_shown_waiting_not_averaged_in(layout):
    done = [summary(s, a, algorithm={"name": "fedavg"}, data={"partition": "clusters"})
            for s, a in ((0, 0.60), (1, 0.70))]
    mid = summary(2, 0.10, algorithm={"name": "fedavg"}, data={"partition": "clusters"})
    mid.rounds_done, mid.rounds_planned = 12, 20
    alone = summary(0, 0.20, algorithm={"name": "pfedlia"}, data={"partition": "clusters"})
    alone.rounds_done, alone.rounds_planned = 3, 20
    got, _ = cells(layout, [*done, mid, alone])
    assert got[("FedAvg", "Patho")].values == [60.0, 70.0]
    assert got[("FedAvg", "Patho")].unfinished == ["r2 (12/20 rounds)"]
    md = render(layout, [*done, mid, alone])
    assert "| FedAvg | 65.00 ± 7.07 [2] +1 unfinished (paper 60.00 ± 5.00) = |" in md
    assert "| Ours | 1 unfinished (paper 99.00 ± 0.20) |" in md
    assert "- unfinished, not averaged: r0 (3/20 rounds) in Ours / Patho" in md
    # the mid-run 10% must not reach the order line either: Ours has no finished run
    assert "ours FedAvg; paper" in md


def test_a_point_that_ran_and_failed_is_told_from_one_never_run(layout, tmp_path):
    from test_sweep import _sweep_file

    from mpifl.analysis.paper_table import failed_points
    from mpifl.sweep import rundirs as sweep_rundirs
    from mpifl.sweep import spec as sweep_spec
    from mpifl.sweep.status import mark_finished

    grid = {"algorithm.name": ["fedavg", "pfedlia"], "data.partition": ["clusters", "noisy_clusters"]}
    sets = {"data.n_clusters": 4, "data.n_clients": 8, "pfedlia.warmup_rounds": 1}
    s = sweep_spec.load(_sweep_file(tmp_path, grid, set=sets), out_dir=str(tmp_path / "out"))
    sweep_rundirs.write(s, tmp_path)
    mark_finished(s, 0, 2)  # fedavg, clusters: a user error before any round
    mark_finished(s, 1, 0)  # fedavg, noisy: exited 0 (its log is elsewhere): not failed
    mark_finished(s, 2, 75)  # pfedlia, clusters: preempted, not failed
    mark_finished(s, 3, 1)  # pfedlia, noisy: crashed, its partial log read as unfinished
    mid = summary(0, 0.10, algorithm={"name": "pfedlia"}, data={"partition": "noisy_clusters"})
    mid.path, mid.rounds_done, mid.rounds_planned = s.points[3].config.run_dir / "run.h5", 2, 20
    failed = failed_points([s.root])
    assert [(f.name, f.rc) for f in failed] == [(s.points[0].name, 2), (s.points[3].name, 1)]
    md = render(layout, [mid], failed=failed)
    assert "| FedAvg | failed (exit 2) (paper 60.00 ± 5.00) | not run (paper 66.00 ± 5.00) |" in md
    assert "| Ours | not run (paper 99.00 ± 0.20) | failed (exit 1) (paper 82.00 ± 3.00) |" in md
    assert failed_points([tmp_path]) == []  # not a sweep directory


ARI_LAYOUT = """
title: Cluster recovery
metric: ari
columns:
  Patho: {data.partition: clusters}
rows:
  Ours: {algorithm.name: pfedlia, pfedlia.mode: central}
  FeSEM: {algorithm.name: fesem}
ari:
  Ours: lia.cluster
  FeSEM: fesem.cluster
"""


def test_a_cluster_recovery_table_scores_each_rows_own_clustering_and_its_record_renders_it(tmp_path):
    from mpifl.analysis import record

    f = tmp_path / "ari.layout.yaml"
    f.write_text(ARI_LAYOUT)
    lay = load_layout(f)
    runs = []
    # each run also holds the other row's source: the table must take its own row's
    for seed, (ours, fesem) in enumerate(((1.0, 0.8), (0.5, 0.6))):
        r = summary(seed, 0.9, algorithm={"name": "pfedlia"}, data={"partition": "clusters"})
        r.ari = {"lia.cluster": ours, "fesem.cluster": 0.01, "graph.mixing": 0.0}
        q = summary(seed, 0.9, algorithm={"name": "fesem"}, data={"partition": "clusters"})
        q.ari = {"fesem.cluster": fesem, "lia.cluster": 0.02}
        runs += [r, q]
    lost = summary(2, 0.9, algorithm={"name": "fesem"}, data={"partition": "clusters"})
    lost.ari = {"graph.mixing": 0.3}  # no clustering of its own: named, not counted as a seed
    got, notes = cells(lay, [*runs, lost])
    assert got[("Ours", "Patho")].values == [1.0, 0.5] and got[("FeSEM", "Patho")].values == [0.8, 0.6]
    assert notes == ["r2 (seed 2) has no clustering 'fesem.cluster' to score (it has: graph.mixing)"]
    md = render(lay, runs)
    # mean and sample std of (1.0, 0.5) and of (0.8, 0.6), as they are, not in %
    assert f"| Ours | 0.750 ± {np.std([1.0, 0.5], ddof=1):.3f} [2] |" in md
    assert f"| FeSEM | 0.700 ± {np.std([0.8, 0.6], ddof=1):.3f} [2] |" in md
    assert "Ours: `lia.cluster`; FeSEM: `fesem.cluster`" in md
    rec = tmp_path / "ari.csv"
    record.write(rec, record.layout_rows(f, lay, runs))
    back = record.read(rec)
    assert [(r.method, r.metric, r.value) for r in back] == [
        ("Ours", "ari:lia.cluster", 1.0), ("Ours", "ari:lia.cluster", 0.5),
        ("FeSEM", "ari:fesem.cluster", 0.8), ("FeSEM", "ari:fesem.cluster", 0.6)]
    assert record.render(rec, tmp_path).startswith(md)  # the page shows what analyze printed


@pytest.mark.parametrize("extra,where", [
    ("", "ari: mapping every row"),
    ("ari: {Ours: lia.cluster}", "ari: mapping every row"),
    ("ari: {Ours: lia.cluster, FeSEM: 3}", "ari: mapping every row"),
    ("ari: {Ours: lia.cluster, FeSEM: fesem.cluster}\npaper: {Ours: {Patho: [1, 0]}}", "paper figures"),
])
def test_a_bad_cluster_recovery_layout_is_one_line(tmp_path, extra, where):
    f = tmp_path / "bad.yaml"
    f.write_text("metric: ari\ncolumns: {Patho: {data.partition: clusters}}\n"
                 "rows: {Ours: {algorithm.name: pfedlia}, FeSEM: {algorithm.name: fesem}}\n" + extra)
    with pytest.raises(LayoutError) as e:
        load_layout(f)
    assert where in str(e.value) and "\n" not in str(e.value)
    g = tmp_path / "acc.yaml"
    g.write_text("columns: {Patho: {data.partition: clusters}}\nrows: {Ours: {algorithm.name: pfedlia}}\n"
                 "ari: {Ours: lia.cluster}")
    with pytest.raises(LayoutError, match="for metric=ari only"):
        load_layout(g)
