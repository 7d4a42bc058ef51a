"""Corrected verdicts of ``analyze --versus``: the paired p, Holm over one method's
cells, seeds that split into modes, and the share's bootstrap interval with a floor
under the room, on synthetic per-seed values whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mpifl.analysis import curves as cv
from mpifl.analysis import stats


def curve(label: str, by_x: dict[float, dict[int, float]], y: float | None = None) -> cv.Curve:
    c = cv.Curve((label.split(",")[0],), label, y=y)
    for x, vals in sorted(by_x.items()):
        c.add(x, sorted(vals), [vals[s] for s in sorted(vals)])
    return c


def test_a_split_into_two_modes_is_flagged_and_normal_noise_rarely_is():
    assert stats.split_modes([25.0, 25.4, 47.1, 46.9, 47.4])  # pFedLIA's 25 x 10 cell
    assert stats.split_ratio([25.0, 25.4, 47.1, 46.9, 47.4]) > 50
    assert not stats.split_modes([1.0, 2.0, 3.0, 4.0, 5.0])  # evenly spread: gaps of one spread
    assert not stats.split_modes([0.0, 10.0, 10.0])  # three values: no side of two with a spread
    assert stats.split_modes([0.0, 0.0, 1.0, 1.0])  # no spread inside the modes, a gap between them
    with_nan = [np.nan, 1.0, 1.1, 5.0, 5.2, 5.1]
    assert stats.split_ratio(with_nan) == stats.split_ratio(with_nan[1:])  # NaN left out
    rng = np.random.default_rng(7)
    for n, most in ((5, 0.02), (10, 0.001)):  # the rates the rule's comment states (1 in 90 at 5 values)
        rate = np.mean([stats.split_modes(rng.standard_normal(n)) for _ in range(20000)])
        assert rate < most, (n, rate)
    rate5 = np.mean([stats.split_modes(rng.standard_normal(5)) for _ in range(20000)])
    assert rate5 > 0.004  # the rule is not blind either: heavy gaps of 5 normal values do occur


def test_holm_runs_over_one_methods_cells_and_can_take_a_verdict_back():
    seeds = range(5)
    base = {x: {s: 0.5 + 0.01 * s for s in seeds} for x in (1.0, 2.0, 3.0)}
    # a: one clear gain and two marginal ones (p between 0.01 and 0.05); b: one marginal only
    noise = [0.02, -0.02, 0.01, -0.01, 0.0]
    a = curve("a", {1.0: {s: base[1.0][s] + 0.20 + 0.001 * s for s in seeds},
                    2.0: {s: base[2.0][s] + 0.021 + noise[s] for s in seeds},
                    3.0: {s: base[3.0][s] + 0.022 + noise[s] for s in seeds}})
    b = curve("b", {1.0: {s: base[1.0][s] + 0.021 + noise[s] for s in seeds}})
    local = curve("local", base)
    cross = cv.crossovers(["algorithm.name"], [a, b, local], "local")
    pa = {p.x: p for p in cross[0].points}
    (pb,) = cross[1].points
    ps = [pa[x].p for x in (1.0, 2.0, 3.0)]
    assert all(p.verdict == "above" for p in pa.values()) and 0.01 < ps[1] < 0.05
    assert [pa[x].p_holm for x in (1.0, 2.0, 3.0)] == pytest.approx(stats.holm(ps))
    assert pa[1.0].holm_verdict == "above" and pa[2.0].holm_verdict == "level" and pa[3.0].holm_verdict == "level"
    # b's family is its one cell: the same marginal difference keeps its verdict
    assert pb.p_holm == pytest.approx(pb.p) and pb.holm_verdict == "above"
    assert "above (Holm: level)" in cross[0].sentence("x")


def test_with_a_second_key_the_family_is_every_cell_of_the_method():
    seeds = range(4)
    cs = []
    for yv in (8.0, 20.0):
        cs.append(curve(f"local, data.n_clients={yv:g}", {1.0: {s: 0.5 + 0.01 * s for s in seeds}}, y=yv))
        cs.append(curve(f"m, data.n_clients={yv:g}", {1.0: {s: 0.53 + 0.01 * s + 0.004 * (-1) ** s for s in seeds}},
                        y=yv))
    cross = cv.crossovers(["algorithm.name"], cs, "local")
    (p1,), (p2,) = (c.points for c in cross)
    assert p1.family == p2.family == "m"
    assert p1.p_holm == pytest.approx(min(1.0, 2 * p1.p))  # two equal p-values: each times 2


def test_the_share_is_a_bootstrap_over_seeds_and_not_given_under_the_floor():
    seeds = range(5)
    local = {s: 0.5 for s in seeds}
    big = {s: 0.7 + 0.01 * s for s in seeds}  # a room of 20-24 points
    small = {s: 0.515 + 0.002 * s for s in seeds}  # 1.5-2.3 points: above 0, under the 2-point floor
    m = {s: 0.6 for s in seeds}
    for top, want in ((big, None), (small, cv.SMALL_ROOM), (local, cv.NO_ROOM)):
        (p,) = cv.compare(curve("m", {1.0: m}), curve("local", {1.0: local}), curve("oracle", {1.0: top})).points
        if want is None:
            shares = [0.1 / (top[s] - 0.5) for s in seeds]
            assert p.share.mean == pytest.approx(np.mean(shares))
            assert min(shares) <= p.share.low < p.share.mean < p.share.high <= max(shares)
        else:
            assert p.share is None and p.no_share == want
    ratio = stats.bootstrap_mean_ratio([1.0, 2.0, 0.5, 1.5, 1.0], [1.0, 1.0, 2.0, 0.5, 1.0])
    assert ratio == stats.bootstrap_mean_ratio([1.0, 2.0, 0.5, 1.5, 1.0], [1.0, 1.0, 2.0, 0.5, 1.0])  # fixed seed
    assert ratio[1] < ratio[0] < ratio[2] and math.isnan(stats.bootstrap_mean_ratio([1.0], [2.0])[1])


def test_the_heatmap_hatches_level_cells_and_names_its_axes_in_clients_per_group(tmp_path, monkeypatch):
    seeds = range(5)
    cs = []
    for yv in (8.0, 100.0):
        base = {s: 0.5 + 0.01 * s for s in seeds}
        gain = 0.2 if yv == 100.0 else 0.0  # above at 25 a group, level at 2
        cs += [curve(f"local, data.n_clients={yv:g}", {10.0: base}, y=yv),
               curve(f"oracle, data.n_clients={yv:g}", {10.0: {s: v + 0.3 + 0.001 * s for s, v in base.items()}},
                     y=yv),
               curve(f"m, data.n_clients={yv:g}", {10.0: {s: v + gain + 0.01 * (-1) ** s for s, v in base.items()}},
                     y=yv)]
    cross = cv.crossovers(["algorithm.name"], cs, "local", ["m"], "oracle")
    seen = {}

    def keep(plt, fig, ax, path, xlabel, ylabel, title, legend=True):
        seen.update(xlabel=xlabel, ylabel=ylabel, yticks=[t.get_text() for t in ax.get_yticklabels()],
                    hatched=[(p.get_y() + 0.5) for p in ax.patches if p.get_hatch()],
                    texts=[t.get_text() for t in ax.texts])
        plt.close(fig)
        return path

    monkeypatch.setattr(cv, "finish", keep)
    cv.share_heatmaps(tmp_path, "data.train_per_client", "data.n_clients", cross, "oracle", groups=4)
    assert seen["xlabel"].startswith("training samples per client")
    assert seen["ylabel"] == "clients per group (data.n_clients / 4 groups)" and seen["yticks"] == ["2", "25"]
    assert seen["hatched"] == [0.0]  # row 0 (2 a group): level, hatched; 25 a group: above, not
    assert any("level" in t for t in seen["texts"]) and any("above" in t for t in seen["texts"])


def test_groups_are_read_from_the_configs_defaults_filling_in():
    assert cv.groups_of([{"data.partition": "permuted_clusters"}, {"data.partition": "permuted_clusters"}]) == 4
    assert cv.groups_of([{"data.partition": "iid"}]) is None
    assert cv.groups_of([{"data.partition": "clusters", "data.n_clusters": 2},
                         {"data.partition": "clusters", "data.n_clusters": 4}]) is None
    assert cv.axis("data.n_clients", [8.0, 20.0], None) == ("data.n_clients", ["8", "20"])
    # stand-in domains (data without domains of its own) are n_clusters groups; recorded ones are not
    assert cv.groups_of([{"data.partition": "domains", "data.name": "fashionmnist", "data.n_clusters": 4}]) == 4
    assert cv.groups_of([{"data.partition": "domains", "data.name": "digit5", "data.n_clusters": 4}]) is None


def test_analyze_from_records_writes_the_corrected_table_and_the_heatmap(tmp_path, capsys):
    from mpifl import analyze as an
    from mpifl.analysis import record

    prov = {"mpifl": {"commit": "a" * 40, "dirty": False}, "cpu_capability": "AVX2", "device": "cpu"}
    rows = []
    for n in (8, 100):
        for s in range(5):
            for m, v in (("local", 50.0 + s), ("oracle", 60.0 + s + 0.1 * (s % 2)), ("fedx", 55.0 + s + 0.3 * s)):
                rows.append(record.Row("table", "", m, f"data.n_clients={n}", s, "final_acc", v,
                                       {"algorithm.name": m, "data.n_clients": n, "data.train_per_client": 10,
                                        "data.partition": "permuted_clusters"}, prov))
    record.write(tmp_path / "r.csv", rows)
    out = tmp_path / "out"
    assert an.main([str(tmp_path / "r.csv"), "--from-records", "--x", "data.train_per_client", "--y",
                    "data.n_clients", "--versus", "local", "--ceiling", "oracle", "--out", str(out)]) == 0
    import csv

    got = list(csv.DictReader((out / "versus.csv").open()))
    assert {r["method"] for r in got} == {"oracle", "fedx"} and all(r["verdict_holm"] == "above" for r in got)
    fedx = next(r for r in got if r["method"] == "fedx")
    assert float(fedx["gain_share"]) == pytest.approx(np.mean([(5 + 0.3 * s) / (10 + 0.1 * (s % 2)) for s in range(5)]))
    assert (out / "share_fedx.png").stat().st_size > 1000
    assert an.main([str(tmp_path / "r.csv"), "--from-records", "--x", "data.train_per_client", "--versus",
                    "fedavg", "--out", str(out)]) == 2
    assert "no runs of algorithm.name=fedavg" in capsys.readouterr().err
