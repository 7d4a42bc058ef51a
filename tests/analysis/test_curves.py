"""python -m mpifl.analyze --x KEY: per-method curves over a swept key and the
crossover against a baseline, on hand-written logs whose accuracies are known."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from mpifl import analyze as an
from mpifl import config
from mpifl.analysis import curves as cv
from mpifl.analysis import tables
from mpifl.logging.h5 import Writer

N = 6
SIZES = (10, 20, 40, 80, 160)
SEEDS = (0, 1, 2)
NOISE = {0: -0.01, 1: 0.0, 2: 0.01, 3: 0.0}  # per seed: std over seeds 0-2 0.01


def truth(algo: str, n: int) -> float:
    """Local grows with the data; Oracle is flat at 0.8, so it beats Local up to
    40 samples, ties at 80 and loses at 160; FedAvg never beats Local; FedProx
    beats it everywhere."""
    local = 0.5 + 0.1 * math.log2(n / 10)
    return {"local": local, "oracle": 0.8, "fedavg": 0.3, "fedprox": local + 0.05}[algo]


def write(path: Path, algo: str, n: int, seed: int, lr: float = 0.05, shift: float = 0.0, rounds: int = 2) -> None:
    path.parent.mkdir(parents=True)
    cfg = config.from_dict({"run": {"rounds": 2, "seed": seed, "name": path.parent.name},
                            "data": {"name": "synthetic", "n_clients": N, "train_per_client": n},
                            "train": {"lr": lr}, "algorithm": {"name": algo}})
    w = Writer(path, {"algorithm": algo, "seed": seed, "n_clients": N, "config_yaml": cfg.to_yaml()},
               {"cluster": np.arange(N) % 2, "n_test": np.full(N, 10)}, N)
    acc = truth(algo, n) + NOISE[seed] + shift
    for t in range(rounds):  # per client around the mean: the client mean is acc at the last round
        test = np.full(N, acc if t == 1 else 0.1) + np.array([-0.02, 0.02, 0, 0, -0.01, 0.01])
        w.write_round(t, {"wall_s": 1.0}, {"metrics/test_acc": test, "metrics/val_acc": test})
    w.close()


@pytest.fixture(scope="module")
def runs(sweep, tmp_path_factory) -> list:
    return an.analyze([sweep], tmp_path_factory.mktemp("out"), heatmaps="none", echo=quiet)["runs"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("regime") / "runs"
    for algo in ("local", "oracle", "fedavg", "fedprox"):
        for n in SIZES:
            for s in SEEDS:
                write(root / f"{algo}-{n}-{s}" / "run.h5", algo, n, s)
    return root.parent


def quiet(*a, **k) -> None:
    pass


def grouping(runs: list) -> cv.Grouping:
    return cv.Grouping(tables.varying_keys(runs), tables.setting, tables.NOT_APPLICABLE)


def test_one_curve_per_method_with_mean_and_std_over_seeds(runs):
    keys, cs = cv.curves(runs, "data.train_per_client", grouping(runs))
    assert keys == ["algorithm.name"]
    by = {c.label: c for c in cs}
    assert set(by) == {"local", "oracle", "fedavg", "fedprox"}
    for algo, c in by.items():
        assert c.x == list(map(float, SIZES)) and all(s == list(SEEDS) for s in c.seeds)
        for x, m, s in zip(c.x, c.mean, c.std):
            vals = [truth(algo, int(x)) + NOISE[k] for k in SEEDS]
            assert m == pytest.approx(np.mean(vals)) and s == pytest.approx(np.std(vals, ddof=1))


def test_crossover_is_the_last_size_above_and_the_first_after_it_not(runs):
    keys, cs = cv.curves(runs, "data.train_per_client", grouping(runs))
    got = {c.method: c for c in cv.crossovers(keys, cs, "local")}
    assert set(got) == {"oracle", "fedavg", "fedprox"}
    assert [s for _, s, _ in got["oracle"].signs] == ["above", "above", "above", "level", "below"]
    assert (got["oracle"].last_above, got["oracle"].no_longer) == (40, 80)
    assert (got["fedavg"].last_above, got["fedavg"].no_longer) == (None, 10)
    assert (got["fedprox"].last_above, got["fedprox"].no_longer) == (160, None)
    assert "above up to data.train_per_client=40, no longer at 80" in got["oracle"].sentence("data.train_per_client")
    assert "never above" in got["fedavg"].sentence("data.train_per_client")
    assert "above up to the largest" in got["fedprox"].sentence("data.train_per_client")
    only = cv.crossovers(keys, cs, "local", ["oracle"])
    assert [c.method for c in only] == ["oracle"]


def curve(label: str, by_x: dict[float, dict[int, float]], y: float | None = None) -> cv.Curve:
    c = cv.Curve((label,), label, y=y)
    for x, vals in sorted(by_x.items()):
        c.x.append(x)
        c.seeds.append(sorted(vals))
        c.values.append([vals[s] for s in sorted(vals)])
        c.mean.append(float(np.mean(c.values[-1])))
        c.std.append(float(np.std(c.values[-1], ddof=1)))
    return c


def test_the_paired_interval_is_students_t_on_the_differences():
    from mpifl.analysis.stats import paired_interval, verdict

    mean, low, high, n = paired_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t_{0.975, 2}, sd 1
    assert (mean, n) == (2.0, 3) and low == pytest.approx(2 - half) and high == pytest.approx(2 + half)
    assert verdict(low, high) == "level"
    assert paired_interval([0.5, math.nan])[:2] == (0.5, 0.5) or math.isnan(paired_interval([0.5, math.nan])[1])
    assert paired_interval([0.5])[3] == 1 and math.isnan(paired_interval([0.5])[1])
    assert verdict(0.1, 0.2) == "above" and verdict(-0.2, -0.1) == "below" and verdict(math.nan, math.nan) == "level"


def test_a_gain_smaller_than_the_seeds_spread_but_on_every_seed_is_above():
    base = {0: 0.70, 1: 0.80, 2: 0.90}  # the seeds differ by 10 points: the old std rule said level
    m = curve("m", {1.0: {s: v + g for (s, v), g in zip(base.items(), (0.010, 0.012, 0.011))},
                    2.0: {s: v + g for (s, v), g in zip(base.items(), (0.03, -0.04, 0.02))},
                    3.0: {s: v - g for (s, v), g in zip(base.items(), (0.020, 0.021, 0.022))}})
    b = curve("b", {1.0: base, 2.0: base, 3.0: base})
    x = cv.compare(m, b)
    assert [(p.x, p.verdict, p.n) for p in x.points] == [(1.0, "above", 3), (2.0, "level", 3), (3.0, "below", 3)]
    assert x.points[0].diff.mean == pytest.approx(0.011) and 0 < x.points[0].diff.low < 0.011
    assert (x.last_above, x.no_longer) == (1.0, 2.0)


def test_only_seeds_both_have_are_paired():
    m = curve("m", {1.0: {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.1}})
    b = curve("b", {1.0: {0: 0.4, 1: 0.5, 2: 0.6}})  # seed 3 missing: its 0.1 must not count
    (p,) = cv.compare(m, b).points
    assert p.seeds == [0, 1, 2] and p.diff.mean == pytest.approx(0.1)


def test_the_share_of_the_room_per_seed_and_no_room_where_the_ceiling_is_not_above():
    b = curve("local", {1.0: {0: 0.50, 1: 0.60, 2: 0.55}, 2.0: {0: 0.80, 1: 0.82, 2: 0.81}})
    top = curve("oracle", {1.0: {0: 0.70, 1: 0.82, 2: 0.73}, 2.0: {0: 0.81, 1: 0.80, 2: 0.82}})
    m = curve("m", {1.0: {0: 0.60, 1: 0.72, 2: 0.64}, 2.0: {0: 0.82, 1: 0.83, 2: 0.80}})
    p1, p2 = cv.compare(m, b, top).points
    rooms, gains = [0.20, 0.22, 0.18], [0.10, 0.12, 0.09]
    assert p1.room.mean == pytest.approx(np.mean(rooms)) and p1.room.low > 0
    assert p1.share.mean == pytest.approx(np.mean([g / r for g, r in zip(gains, rooms)]))
    assert p1.share.low < p1.share.mean < p1.share.high
    assert p2.room is not None and p2.share is None  # oracle is level with local at x=2: no room


def _two_lrs(tmp_path: Path, sizes: tuple[int, ...]) -> tuple[list[str], list[cv.Curve]]:
    """Local and Oracle logs at train.lr 0.05 and 0.5, where Local is 0.3 higher at lr 0.5
    everywhere (Oracle never beats it there): the grouping keys and the curves."""
    for lr, shift in ((0.05, 0.0), (0.5, 0.3)):
        for algo in ("local", "oracle"):
            for n in sizes:
                for s in SEEDS:
                    write(tmp_path / "runs" / f"{algo}-{lr}-{n}-{s}" / "run.h5", algo, n, s, lr,
                          shift if algo == "local" else 0.0)
    res = an.analyze([tmp_path / "runs"], tmp_path / "out", heatmaps="none", echo=quiet)
    return cv.curves(res["runs"], "data.train_per_client", grouping(res["runs"]))


@pytest.mark.slow
def test_the_baseline_is_taken_from_the_same_setting_of_other_keys(tmp_path):
    keys, cs = _two_lrs(tmp_path, (10, 80))
    assert keys == ["algorithm.name", "train.lr"]
    got = {c.method: c for c in cv.crossovers(keys, cs, "local")}
    assert set(got) == {"oracle, train.lr=0.05", "oracle, train.lr=0.5"}
    assert all(c.baseline == "local, " + c.method.split(", ")[1] for c in got.values())
    assert (got["oracle, train.lr=0.05"].last_above, got["oracle, train.lr=0.05"].no_longer) == (10, 80)
    assert (got["oracle, train.lr=0.5"].last_above, got["oracle, train.lr=0.5"].no_longer) == (None, 10)


def test_log_axis_only_across_a_decade():
    assert cv.log_x([25, 50, 400]) and cv.log_x([10, 100])
    assert not cv.log_x([100, 400, 700]) and not cv.log_x([0, 10, 100]) and not cv.log_x([])


@pytest.mark.slow
def test_cli_writes_figure_and_tables_and_prints_the_crossover(sweep, tmp_path, capsys):
    out = tmp_path / "a"
    assert an.main([str(sweep), "--out", str(out), "--heatmaps", "none", "--x", "data.train_per_client",
                    "--versus", "local", "--method", "oracle"]) == 0
    text = capsys.readouterr().out
    assert "oracle vs local: above up to data.train_per_client=40, no longer at 80" in text
    assert "fedavg vs local" not in text
    import matplotlib.image as mpimg

    img = mpimg.imread(out / "curves_train_per_client.png")
    assert img.shape[0] >= 200 and img[..., :3].std() > 0.01
    csv_rows = (out / "curves_train_per_client.csv").read_text().splitlines()
    assert csv_rows[0] == "method,data.train_per_client,n_seeds,seeds,final_acc_mean,final_acc_std"
    assert len(csv_rows) == 1 + 4 * len(SIZES)
    md = (out / "curves_train_per_client.md").read_text()
    assert "| oracle | 80.00 ± 1.00 [3] |" in md and "no longer at 80" in md


def test_a_run_not_complete_makes_no_point_and_is_named(tmp_path):
    for s in SEEDS:
        write(tmp_path / "runs" / f"local-10-{s}" / "run.h5", "local", 10, s)
    # seed 3 stopped after its first of 2 rounds: its last logged accuracy is round 1's 0.1
    write(tmp_path / "runs" / "local-10-3" / "run.h5", "local", 10, 3, rounds=1)
    res = an.analyze([tmp_path / "runs"], tmp_path / "out", heatmaps="none", echo=quiet)
    got = cv.report(res["runs"], "data.train_per_client", grouping(res["runs"]), tmp_path / "out", echo=quiet)
    (c,) = got["curves"]
    assert c.seeds == [[0, 1, 2]] and c.mean[0] == pytest.approx(truth("local", 10))
    md = (tmp_path / "out" / "curves_train_per_client.md").read_text()
    assert "Left out, not complete (1): local-10-3 (1/2 rounds)" in md
    only = [r for r in res["runs"] if not r.complete]
    with pytest.raises(cv.CurveError, match="no run is complete"):
        cv.curves(only, "data.train_per_client", grouping(res["runs"]))


def test_versus_where_pairs_every_method_with_the_baseline_at_the_named_setting(tmp_path, capsys):
    """``--versus-where train.lr=0.5``: Oracle at either lr is paired with Local at
    lr 0.5 (0.3 higher), not with its own lr's Local; the table and the settings
    block say so; a key the runs do not vary by, a part without ``=`` and the
    option without --versus are refused in one line."""
    keys, cs = _two_lrs(tmp_path, (10, 20))
    got = {c.method: c for c in cv.crossovers(keys, cs, "local", where={"train.lr": "0.5"})}
    assert set(got) == {"oracle, train.lr=0.05", "oracle, train.lr=0.5"}
    assert all(c.baseline == "local, train.lr=0.5" for c in got.values())
    for c in got.values():  # Oracle 0.8 against Local at lr 0.5: 0.8 and 0.9 at 10 and 20 samples
        assert [round(p.diff.mean, 6) for p in c.points] == [0.0, -0.1]
    with pytest.raises(cv.CurveError, match=r"--versus-where train.momentum: the runs do not vary by it; they "
                                            r"vary by train.lr"):
        cv.crossovers(keys, cs, "local", where={"train.momentum": "0.9"})
    base = [str(tmp_path / "runs"), "--heatmaps", "none", "--x", "data.train_per_client", "--versus", "local"]
    assert an.main([*base, "--out", str(tmp_path / "cli"), "--versus-where", "train.lr=0.5"]) == 0
    printed = capsys.readouterr().out
    assert "method minus local (its runs with train.lr=0.5, and so the ceiling's)" in printed
    assert "Settings that differ from local at train.lr=0.5" in printed
    for bad in (["--versus-where", "train.lr"], ["--versus-where", "train.lr=0.5", "--versus", "local"][:2]):
        with pytest.raises(SystemExit):
            an.main([str(tmp_path / "runs"), "--x", "data.train_per_client", *bad])


def test_cli_refuses_in_one_line(sweep, tmp_path, capsys):
    base = [str(sweep), "--out", str(tmp_path), "--heatmaps", "none"]
    assert an.main([*base, "--x", "algorithm.name"]) == 2
    assert an.main([*base, "--x", "data.train_per_client", "--versus", "nothing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "must hold numbers" in err[0] and "--versus nothing: no runs" in err[1]
    with pytest.raises(SystemExit):
        an.main([*base, "--versus", "local"])  # --versus without --x


@pytest.mark.slow
def test_cli_ceiling_and_a_second_key_write_versus_csv_and_share_heatmaps(tmp_path, capsys):
    for lr in (0.05, 0.5):
        for algo in ("local", "oracle", "fedprox"):
            for n in (10, 80):
                for s in SEEDS:
                    write(tmp_path / "runs" / f"{algo}-{lr}-{n}-{s}" / "run.h5", algo, n, s, lr)
    write(tmp_path / "runs" / "fedprox-unfinished" / "run.h5", "fedprox", 10, 3, 0.05, rounds=1)
    out = tmp_path / "a"
    assert an.main([str(tmp_path / "runs"), "--out", str(out), "--heatmaps", "none", "--x", "data.train_per_client",
                    "--y", "train.lr", "--versus", "local", "--ceiling", "oracle"]) == 0
    text = capsys.readouterr().out
    assert "Left out, not complete (1): fedprox-unfinished (1/2 rounds)" in text
    import csv

    rows = list(csv.DictReader((out / "versus.csv").open()))
    assert list(rows[0]) == ["method", "train.lr", "x", "n_seeds", "seeds", "diff_mean", "ci_low", "ci_high",
                             "verdict", "p", "p_holm", "verdict_holm", "split_modes", "room", "room_low", "room_high",
                             "gain_share", "gain_low", "gain_high"]
    got = {(r["method"], r["train.lr"], r["x"]): r for r in rows}
    assert set(got) == {(m, lr, x) for m in ("oracle", "fedprox") for lr in ("0.05", "0.5") for x in ("10", "80")}
    small = got["fedprox", "0.05", "10"]  # fedprox = local + 0.05, oracle - local = 0.3 at 10 samples
    assert small["n_seeds"] == "3" and small["verdict"] == "above"
    assert float(small["diff_mean"]) == pytest.approx(0.05, abs=1e-6)
    assert float(small["gain_share"]) == pytest.approx(0.05 / 0.3, rel=1e-4)
    assert got["fedprox", "0.5", "80"]["gain_share"] == "no room"  # oracle = local at 80 samples
    assert got["oracle", "0.5", "10"]["gain_share"] == "1"
    md = (out / "versus.md").read_text()
    assert "| fedprox | 0.05 | 10 | 3 | +5.00" in md and "no room" in md
    for m in ("oracle", "fedprox"):
        assert (out / f"share_{m}.png").stat().st_size > 1000
