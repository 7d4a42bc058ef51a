"""The time course and best-validation accuracy of ``analyze --versus``
(mpifl/analysis/course.py): the rounds a record carries, Local+ES, the paired
difference per round on tiny real runs read back by hand with h5py, and records
made before these metrics still rendering."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpifl import analyze as an
from mpifl import config
from mpifl.analysis import course, record
from mpifl.analysis.summary import early_stopped
from mpifl.docs import blocks as docs

ROUNDS = 4
TINY = {"run": {"rounds": ROUNDS, "threads": 1},
        "data": {"name": "synthetic", "n_samples": 300, "n_clients": 6, "n_clusters": 3},
        "model": {"hidden": [8]}}
SEEDS = (0, 1, 2)


def test_the_rounds_a_record_carries_are_the_fixed_ones_a_run_reached_and_its_last():
    def rule(n: int, missing: tuple[int, ...] = ()) -> list[int]:
        curve = np.array([math.nan if r + 1 in missing else 0.5 for r in range(n)])
        return course.course_rounds(np.arange(n), curve)

    assert rule(150) == [10, 30, 60, 100, 150]
    assert rule(60) == [10, 30, 60] and rule(45) == [10, 30, 45] and rule(2) == [2]
    assert rule(150, missing=(10, 150)) == [30, 60, 100, 149]  # not evaluated: not carried; the last evaluated is


def test_early_stopping_takes_the_test_accuracy_at_the_first_best_validation_round():
    test = np.array([0.1, 0.5, 0.4, 0.3, 0.2])
    val = np.array([0.2, 0.6, 0.6, np.nan, 0.1])
    assert early_stopped(test, val) == 0.5
    assert math.isnan(early_stopped(test, np.full(5, np.nan)))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Local and Oracle, 3 seeds each, 4 rounds of tiny real runs (this process, one rank)."""
    from mpifl.comm import world
    from mpifl.run import runtime

    root = tmp_path_factory.mktemp("course")
    for algo in ("local", "oracle"):
        for seed in SEEDS:
            raw = {k: dict(v) for k, v in TINY.items()}
            raw["run"].update(seed=seed, name=f"{algo}-{seed}", out_dir=str(root / "runs"))
            raw["algorithm"] = {"name": algo}
            runtime.run(config.from_dict(raw), world())
    return root


def _by_hand(root: Path, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean test acc per round, mean val acc per round, per-client test at best val)."""
    with h5py.File(root / "runs" / name / "run.h5", "r") as f:
        n = f["rounds/round"].shape[0]
        test, val = f["metrics/test_acc"][:n], f["metrics/val_acc"][:n]
    best = test[np.nanargmax(val, axis=0), np.arange(test.shape[1])]
    return test.mean(1), val.mean(1), best


def test_the_course_and_best_validation_on_real_runs(sweep, tmp_path):
    out = tmp_path / "a"
    assert an.main([str(sweep), "--out", str(out), "--heatmaps", "none", "--x", "data.train_per_client",
                    "--versus", "local", "--record", str(tmp_path / "r.csv")]) == 0
    hand = {f"{a}-{s}": _by_hand(sweep, f"{a}-{s}") for a in ("local", "oracle") for s in SEEDS}
    rows = list(csv.DictReader((out / "course.csv").open()))
    assert [int(r["round"]) for r in rows] == list(range(1, ROUNDS + 1)) and {r["method"] for r in rows} == {"oracle"}
    for r in rows:
        t = int(r["round"]) - 1
        d = [hand[f"oracle-{s}"][0][t] - hand[f"local-{s}"][0][t] for s in SEEDS]
        assert float(r["diff_mean"]) == pytest.approx(np.mean(d), abs=1e-6) and r["n_seeds"] == "3"
        assert float(r["ci_low"]) <= float(r["diff_mean"]) <= float(r["ci_high"])
    (best,) = list(csv.DictReader((out / "best.csv").open()))
    es = {s: hand[f"local-{s}"][0][int(np.nanargmax(hand[f"local-{s}"][1]))] for s in SEEDS}
    want = np.mean([hand[f"oracle-{s}"][2].mean() - es[s] for s in SEEDS])
    assert float(best["best_minus_es"]) == pytest.approx(want, abs=1e-6)
    fell = np.mean([hand[f"oracle-{s}"][2].mean() - hand[f"oracle-{s}"][0][-1] for s in SEEDS])
    assert float(best["best_minus_final"]) == pytest.approx(fell, abs=1e-6)
    assert (out / "course.png").stat().st_size > 1000 and "local+ES" in (out / "best.md").read_text()
    # the record: es_acc and the course at the rounds the rule gives (a 4-round run: its last only)
    got = {(r.method, r.seed, r.metric): r.value for r in record.read(tmp_path / "r.csv")}
    assert got[("local", 1, "es_acc")] == pytest.approx(100 * es[1], abs=1e-9)
    assert got[("oracle", 2, f"test_acc@{ROUNDS}")] == pytest.approx(100 * hand["oracle-2"][0][-1], abs=1e-9)
    assert not any(m.startswith("test_acc@") and m != f"test_acc@{ROUNDS}" for _, _, m in got)
    # and the pages' blocks render the same numbers from the record
    page = (f"<!-- generated:best r.csv x=data.train_per_client versus=local -->\n<!-- /generated -->\n"
            f"<!-- generated:course r.csv x=data.train_per_client versus=local rounds=10,{ROUNDS} -->\n"
            "<!-- /generated -->\n")
    text = docs.render(page, tmp_path)
    assert f"{100 * want:+.2f}" in text and f"| round {ROUNDS} |" in text and "round 10" not in text
    d = np.mean([hand[f"oracle-{s}"][0][-1] - hand[f"local-{s}"][0][-1] for s in SEEDS])
    course_line = [x for x in text.splitlines() if x.startswith("| oracle | 0 | ") and x.count("|") == 4]
    assert len(course_line) == 1 and course_line[0].startswith(f"| oracle | 0 | {100 * d:+.2f} [")


def test_a_record_made_before_says_what_is_not_in_it(tmp_path):
    prov = {"mpifl": {"commit": "a" * 40, "dirty": False}, "cpu_capability": "AVX2", "device": "cpu"}
    rows = [record.Row("table", "", m, "", s, metric, v + s, {"algorithm.name": m, "data.train_per_client": 10}, prov)
            for m, v in (("local", 50.0), ("dpfl", 40.0)) for s in SEEDS
            for metric, v in (("final_acc", v), ("best_acc", v + 5 + 0.5 * s))]
    record.write(tmp_path / "old.csv", rows)
    page = ("<!-- generated:best old.csv x=data.train_per_client versus=local -->\n<!-- /generated -->\n"
            "<!-- generated:course old.csv x=data.train_per_client versus=local -->\n<!-- /generated -->\n")
    text = docs.render(page, tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("| dpfl |"))
    assert line.endswith("| not in this record |") and "+5.50 [" in line  # best - final: 5 + 0.5 s, s = 0..2
    assert "The time course (test accuracy at rounds 10, 30, 60, 100, 150) is not in this record" in text
    with pytest.raises(ValueError, match="needs x=KEY and versus=NAME"):
        docs.render("<!-- generated:best old.csv x=data.train_per_client -->\n<!-- /generated -->\n", tmp_path)
