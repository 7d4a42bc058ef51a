"""A page's paired comparison rendered from a per-seed record
(``<!-- generated:versus FILE x=... versus=... -->``): its numbers are the record's,
paired by seed, and a bad block is one line."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from mpifl.analysis import record
from mpifl.analysis import stats as mstats
from mpifl.docs import blocks as docs

PROV = {"mpifl": {"commit": "a" * 40, "dirty": False}, "cpu_capability": "AVX2", "device": "cpu"}
SEEDS = (0, 1, 2, 3)
# percent, per (method, clients, samples): one value per seed
VALUES = {
    ("local", 8, 10): [40.0, 42.5, 39.0, 41.0], ("local", 8, 50): [60.0, 61.0, 62.5, 59.5],
    ("fedx", 8, 10): [45.0, 46.0, 44.5, 47.5], ("fedx", 8, 50): [55.0, 57.5, 58.0, 54.0],
    ("oracle", 8, 10): [50.0, 52.0, 51.5, 50.5], ("oracle", 8, 50): [60.5, 60.0, 63.0, 59.0],
}


def _write(path) -> None:
    rows = [record.Row("table", "", m, f"data.n_clients={n}, data.train_per_client={t}", s, "final_acc", v,
                       {"algorithm.name": m, "data.n_clients": n, "data.train_per_client": t}, PROV)
            for (m, n, t), vals in VALUES.items() for s, v in zip(SEEDS, vals)]
    record.write(path, rows)


def _interval(d: list[float]) -> tuple[float, float, float]:
    d = np.asarray(d)
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return d.mean(), d.mean() - half, d.mean() + half


def _diff(method: str, base: str, t: int) -> list[float]:
    return [a - b for a, b in zip(VALUES[(method, 8, t)], VALUES[(base, 8, t)])]


@pytest.fixture
def root(tmp_path):
    (tmp_path / "data").mkdir()
    _write(tmp_path / "data" / "r.csv")
    return tmp_path


def test_the_grid_is_the_records_paired_differences(root):
    page = ("<!-- generated:versus data/r.csv x=data.train_per_client versus=local method=fedx -->\n"
            "typed\n<!-- /generated -->\n")
    fresh = docs.render(page, root)
    row = next(line for line in fresh.splitlines() if line.startswith("| fedx |"))
    for t in (10, 50):
        mean, lo, hi = _interval(_diff("fedx", "local", t))
        cell = f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}] (4)"
        assert cell in row
        # bold exactly where the interval leaves out 0
        assert (f"**{cell}**" in row) == (lo > 0 or hi < 0)
    assert row.count("**") == 4  # the data: fedx above at 10 samples, below at 50
    assert "provenance: commit aaaaaaa (16)" in fresh
    assert docs.render(fresh, root) == fresh


def test_with_a_ceiling_the_share_of_the_room_or_no_room(root):
    page = ("<!-- generated:versus data/r.csv x=data.train_per_client y=data.n_clients versus=local "
            "ceiling=oracle method=fedx -->\n<!-- /generated -->\n")
    lines = [line for line in docs.render(page, root).splitlines() if line.startswith("| fedx |")]
    assert len(lines) == 2
    gain, room = _diff("fedx", "local", 10), _diff("oracle", "local", 10)
    share = mstats.bootstrap_mean_ratio(gain, room)  # percentile bootstrap over seeds, its RNG seed fixed
    assert share[0] == pytest.approx(np.mean([g / r for g, r in zip(gain, room)]))
    assert f"| {100 * share[0]:.0f}% [{100 * share[1]:+.0f}, {100 * share[2]:+.0f}] |" in lines[0]
    _, rlo, _ = _interval(_diff("oracle", "local", 50))
    assert rlo <= 0 and lines[1].endswith("| no room |")


@pytest.mark.parametrize("block, arg, says", [
    ("versus", "data/r.csv x=data.train_per_client", "needs x=KEY and versus=NAME"),
    ("versus", "data/r.csv x=data.train_per_client versus=local colour=red", "(not colour)"),
    ("versus", "data/r.csv x=data.train_per_client versus=fedavg", "no runs of algorithm.name=fedavg"),
    ("versus", "data/r.csv x=data.train_per_client versus=local metric=best_acc", "no row of metric 'best_acc'"),
    ("means", "data/r.csv", "needs x=KEY"),
    ("means", "data/r.csv x=data.train_per_client versus=local", "(not versus)"),
    ("means", "data/r.csv x=data.train_per_client method=fedavg", "has no method fedavg"),
])
def test_a_bad_block_is_one_line(root, block, arg, says):
    with pytest.raises(ValueError) as e:
        docs.render(f"<!-- generated:{block} {arg} -->\n<!-- /generated -->\n", root)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_layout_tables_rows_against_one_row_column_by_column(tmp_path):
    """x=setting: a paper-layout record's columns (not numbers), row names with spaces."""
    vals = {("Local Only", "Dir(0.1)"): [80.0, 82.0, 81.0], ("Local Only", "Patho(3)"): [90.0, 91.0, 90.5],
            ("DPFL (B=inf)", "Dir(0.1)"): [83.0, 84.5, 84.0], ("DPFL (B=inf)", "Patho(3)"): [89.0, 91.5, 90.0]}
    rows = [record.Row("T", "t.layout.yaml", m, col, s, "best_acc", v, {"algorithm.name": "x"}, PROV)
            for (m, col), vs in vals.items() for s, v in zip((0, 1, 2), vs)]
    record.write(tmp_path / "t.csv", rows)
    page = '<!-- generated:versus t.csv x=setting versus="Local Only" metric=best_acc -->\n<!-- /generated -->\n'
    lines = docs.render(page, tmp_path).splitlines()
    assert lines[1] == "| method \\ setting | Dir(0.1) | Patho(3) |"
    row = next(line for line in lines if line.startswith("| DPFL (B=inf) |"))
    for col in ("Dir(0.1)", "Patho(3)"):
        mean, lo, hi = _interval([a - b for a, b in zip(vals[("DPFL (B=inf)", col)], vals[("Local Only", col)])])
        assert f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}] (3)" in row


def test_the_means_are_the_records_per_seed_values(root):
    """``generated:means``: each method's mean ± sample std over its seeds, per x."""
    page = "<!-- generated:means data/r.csv x=data.train_per_client method=fedx,local -->\n<!-- /generated -->\n"
    fresh = docs.render(page, root)
    rows = [line for line in fresh.splitlines() if line.startswith("| fedx |") or line.startswith("| local |")]
    assert [r.split(" |")[0] for r in rows] == ["| fedx", "| local"]  # in the order the block names them
    for row, m in zip(rows, ("fedx", "local")):
        for t in (10, 50):
            v = np.asarray(VALUES[(m, 8, t)])
            assert f"{v.mean():.2f} ± {v.std(ddof=1):.2f} [4]" in row
    assert "| oracle |" not in fresh and "provenance: commit aaaaaaa (16)" in fresh
    assert docs.render(fresh, root) == fresh


def test_the_rounds_table_is_the_mean_over_seeds_at_each_round(tmp_path):
    """``generated:rounds``: rows val_acc@R of a record (``analyze --record-rounds``)."""
    vals = {("local", 10): [30.0, 32.0, 31.0], ("local", 60): [38.0, 38.5, 37.0],
            ("oracle", 10): [40.0, 44.0, 45.0], ("oracle", 60): [48.0, 49.0, 50.5]}
    rows = [record.Row("table", "", m, "data.n_clients=8", s, f"val_acc@{r}", v, {"algorithm.name": m}, PROV)
            for (m, r), vs in vals.items() for s, v in zip((0, 1, 2), vs)]
    record.write(tmp_path / "r.csv", rows)
    page = "<!-- generated:rounds r.csv rounds=10,60 method=oracle,local -->\n<!-- /generated -->\n"
    fresh = docs.render(page, tmp_path)
    lines = [line for line in fresh.splitlines() if line.startswith("| oracle") or line.startswith("| local")]
    assert lines == [f"| {m} | data.n_clients=8 | 3 | {np.mean(vals[(m, 10)]):.2f} | {np.mean(vals[(m, 60)]):.2f} |"
                     for m in ("oracle", "local")]
    assert "provenance: commit aaaaaaa (6)" in fresh  # each run once, not once per round
    with pytest.raises(ValueError, match="no row of metric val_acc@30"):
        docs.render(page.replace("rounds=10,60", "rounds=10,30"), tmp_path)
    for bad in ("rounds=0", "rounds=", "rounds=10,x"):
        with pytest.raises(ValueError, match=r"needs rounds=R,R"):
            docs.render(page.replace("rounds=10,60", bad), tmp_path)


def test_two_records_join_with_their_shared_controls_once(root):
    """``FILE=a.csv,b.csv``: a method's record beside another's, both holding Local."""
    rows = record.read(root / "data" / "r.csv")
    record.write(root / "data" / "a.csv", [r for r in rows if r.method in ("local", "fedx")])
    record.write(root / "data" / "b.csv", [r for r in rows if r.method in ("local", "oracle")])
    one = docs.render("<!-- generated:versus data/r.csv x=data.train_per_client versus=oracle method=fedx -->\n"
                      "<!-- /generated -->\n", root)
    joined = one.replace("data/r.csv", "data/a.csv,data/b.csv")
    # the same table below the block's first line: Local's seeds counted once, not twice
    assert docs.render(joined, root).split("\n", 1)[1] == one.split("\n", 1)[1]
    assert "(4)" in one and "(8)" not in one
    moved = [dataclasses.replace(r, value=r.value + 1.0) if r.method == "local" else r
             for r in record.read(root / "data" / "b.csv")]
    record.write(root / "data" / "b.csv", moved)
    with pytest.raises(ValueError, match="disagree on local"):
        docs.render(joined, root)


def test_two_arms_of_one_method_are_compared_apart_not_pooled(tmp_path):
    """A sweep's two arms of one method (``dpfl.random_graph`` false and true,
    seeds 0-3 each; a registered algorithm's section, which the baseline does not
    read) are two rows of the block, each paired with the baseline by seed, as
    ``mpifl.analyze`` labels them; pooled they would pair one seed twice."""
    arms = {"False": [47.0, 48.5, 46.0, 49.0], "True": [20.0, 23.5, 18.0, 21.5]}
    CELL = {"data.n_clients": 8, "data.train_per_client": 10}
    rows = [record.Row("table", "", "local", "data.n_clients=8, data.train_per_client=10, dpfl.random_graph=–", s,
                       "final_acc", v, CELL | {"algorithm.name": "local"}, PROV)
            for s, v in zip(SEEDS, VALUES[("local", 8, 10)])]
    rows += [record.Row("table", "", "dpfl", f"data.n_clients=8, data.train_per_client=10, dpfl.random_graph={g}", s,
                        "final_acc", v, CELL | {"algorithm.name": "dpfl"}, PROV)
             for g, vals in arms.items() for s, v in zip(SEEDS, vals)]
    (tmp_path / "data").mkdir()
    record.write(tmp_path / "data" / "r.csv", rows)
    text = record.render_versus("data/r.csv", tmp_path, x="data.train_per_client", versus="local", methods=("dpfl",))
    for g, vals in arms.items():
        line = next(x for x in text.splitlines() if x.startswith(f"| dpfl, dpfl.random_graph={g} |"))
        mean, lo, hi = _interval([a - b for a, b in zip(vals, VALUES[("local", 8, 10)])])
        assert f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}] (4)" in line
    assert not any(x.startswith("| dpfl |") for x in text.splitlines())


def test_where_pairs_a_method_with_the_baselines_arm_at_the_named_budget(tmp_path):
    """Two arms of Local (``train.max_steps`` 0 and 1) and a method run at 0: by
    default it is paired with Local at 0 (its own setting), with ``where=
    train.max_steps=1`` with Local at 1, in the page's block and in
    ``--from-records``' points alike (``record.versus_points``, which once paired
    with whichever arm came first)."""
    arms = {"0": [40.0, 42.5, 39.0, 41.0], "1": [30.0, 31.5, 29.0, 30.5]}
    method = [45.0, 46.0, 44.5, 47.5]
    CELL = {"data.n_clients": 8, "data.train_per_client": 10}
    rows = [record.Row("table", "", "local", f"data.n_clients=8, data.train_per_client=10, train.max_steps={k}", s,
                       "final_acc", v, CELL | {"algorithm.name": "local", "train.max_steps": int(k)}, PROV)
            for k in ("1", "0") for s, v in zip(SEEDS, arms[k])]  # the arm at 1 first in the record
    rows += [record.Row("table", "", "fedx", "data.n_clients=8, data.train_per_client=10, train.max_steps=0", s,
                        "final_acc", v, CELL | {"algorithm.name": "fedx", "train.max_steps": 0}, PROV)
             for s, v in zip(SEEDS, method)]
    (tmp_path / "data").mkdir()
    record.write(tmp_path / "data" / "r.csv", rows)
    for where, arm in ((None, "0"), ("train.max_steps=1", "1")):
        opt = f" where={where}" if where else ""
        page = (f"<!-- generated:versus data/r.csv x=data.train_per_client versus=local method=fedx{opt} -->\n"
                "typed\n<!-- /generated -->\n")
        row = next(x for x in docs.render(page, tmp_path).splitlines() if x.startswith("| fedx"))
        mean, lo, hi = _interval([a - b for a, b in zip(method, arms[arm])])
        assert f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}] (4)" in row
        _, cross = record.versus_points("data/r.csv", tmp_path, x="data.train_per_client", versus="local",
                                        methods=("fedx",), where={"train.max_steps": arm} if where else None)
        assert [round(100 * p.diff.mean, 6) for c in cross for p in c.points] == [round(mean, 6)]


def test_two_sweeps_records_joined_pair_on_a_key_only_one_of_them_varies(tmp_path):
    """Record a varies nothing but the cell (Local at the default ``train.max_steps``,
    which its setting does not name); record b has Local at ``train.max_steps`` 1 and
    a method at the default, both named. Joined, the method pairs with a's Local (its
    value read from the row's config or the defaults), and with ``where`` with b's."""
    CELL = {"data.n_clients": 8, "data.train_per_client": 10}
    a = [record.Row("table", "", "local", "data.n_clients=8, data.train_per_client=10", s, "final_acc", v,
                    CELL | {"algorithm.name": "local"}, PROV) for s, v in zip(SEEDS, VALUES[("local", 8, 10)])]
    b_local = [30.0, 31.5, 29.0, 30.5]
    b = [record.Row("table", "", "local", "data.n_clients=8, data.train_per_client=10, train.max_steps=1", s,
                    "final_acc", v, CELL | {"algorithm.name": "local", "train.max_steps": 1}, PROV)
         for s, v in zip(SEEDS, b_local)]
    b += [record.Row("table", "", "fedx", "data.n_clients=8, data.train_per_client=10, train.max_steps=0", s,
                     "final_acc", v, CELL | {"algorithm.name": "fedx"}, PROV)
          for s, v in zip(SEEDS, VALUES[("fedx", 8, 10)])]
    (tmp_path / "data").mkdir()
    record.write(tmp_path / "data" / "a.csv", a)
    record.write(tmp_path / "data" / "b.csv", b)
    for where, base in ((None, VALUES[("local", 8, 10)]), ({"train.max_steps": "1"}, b_local)):
        text = record.render_versus("data/a.csv,data/b.csv", tmp_path, x="data.train_per_client", versus="local",
                                    methods=("fedx",), where=where)
        line = next(x for x in text.splitlines() if x.startswith("| fedx"))
        mean, lo, hi = _interval([m - v for m, v in zip(VALUES[("fedx", 8, 10)], base)])
        assert f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}] (4)" in line


def test_the_verdicts_grid_holds_every_methods_holm_verdict_per_cell(root):
    page = ("<!-- generated:verdicts data/r.csv x=data.train_per_client y=data.n_clients versus=local -->\n"
            "<!-- /generated -->\n")
    lines = docs.render(page, root).splitlines()
    assert lines[1].startswith("| method \\ data.n_clients x data.train_per_client | 8 x 10 | 8 x 50 |")
    for method in ("fedx", "oracle"):
        diffs = {t: _diff(method, "local", t) for t in (10, 50)}
        p = {t: stats.ttest_rel(VALUES[(method, 8, t)], VALUES[("local", 8, t)]).pvalue for t in (10, 50)}
        lo, hi = sorted(p, key=p.get)  # Holm's step-down over the method's two cells, by hand
        adj = {lo: min(1.0, 2 * p[lo])}
        adj[hi] = max(adj[lo], p[hi])
        want = {t: ("above" if np.mean(diffs[t]) > 0 else "below") if adj[t] < 0.05 else "level" for t in (10, 50)}
        row = next(line for line in lines if line.startswith(f"| {method} |"))
        cells = [c.strip() for c in row.split("|")[2:-1]]
        for cell, t in zip(cells, (10, 50)):
            text = f"{np.mean(diffs[t]):+.1f} {want[t]}"
            assert cell == (f"**{text}**" if want[t] != "level" else text)
        n = [list(want.values()).count(v) for v in ("above", "level", "below")]
        assert cells[-1] == " / ".join(map(str, n))
    text = "\n".join(lines)
    assert all(v in text for v in ("above**", "below**", " level |"))  # the data reach all three verdicts
    assert "provenance: commit aaaaaaa (24)" in text


def test_a_bad_verdicts_block_is_one_line(root):
    with pytest.raises(ValueError) as e:
        docs.render("<!-- generated:verdicts data/r.csv x=data.train_per_client versus=local -->\n"
                    "<!-- /generated -->\n", root)
    assert "needs x=KEY, y=KEY2 and versus=NAME" in str(e.value) and "\n" not in str(e.value)
