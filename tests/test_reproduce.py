"""mpifl.analysis.record and mpifl.reproduce on a shrunk record: tiny synthetic runs, 2 rounds,
2 methods x 3 seeds, re-made in this process (the CLI's warm workers: the slow test).

Bits: 'bitwise' verdicts compare a record made here with its re-run here (the same
code, machine and settings), so they hold on any CPU; a record from another CPU kind
need not re-run bitwise, and mpifl.reproduce names that difference."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from mpifl import analyze as an
from mpifl import config, reproduce
from mpifl.analysis import record
from mpifl.comm import world
from mpifl.docs import blocks as docs
from mpifl.run import runtime
from mpifl.sweep import status as sweep_status
from tests.helpers import launch

TINY = {"run": {"rounds": 2, "threads": 1, "device": "cpu"},
        "data": {"name": "synthetic", "n_samples": 300, "n_clients": 6, "n_clusters": 3}, "model": {"hidden": [8]}}
LAYOUT = {"title": "tiny", "metric": "final_acc", "columns": {"synthetic": {"data.name": "synthetic"}},
          "rows": {"Local": {"algorithm.name": "local"}, "FedAvg": {"algorithm.name": "fedavg"}}}


def in_process(sw, parallel: int) -> None:
    """The record's runs made again here, as --local would (a complete one is kept)."""
    for p in sw.points:
        if not sweep_status.is_complete(p.config):
            runtime.run(p.config, world())


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The record of 6 runs, and one reproduce of it (its output lines and exit status)."""
    root = tmp_path_factory.mktemp("record")
    for algo in ("local", "fedavg"):
        for seed in (0, 1, 2):
            raw = {**{k: dict(v) for k, v in TINY.items()}, "algorithm": {"name": algo}}
            raw["run"].update(seed=seed, name=f"{algo}-{seed}", out_dir=str(root / "runs"))
            runtime.run(config.from_dict(raw), world())
    (root / "tiny.layout.yaml").write_text(yaml.safe_dump(LAYOUT, sort_keys=False))
    an.analyze([root / "runs"], root / "analysis", heatmaps="none", echo=lambda *a, **k: None,
               layouts=[root / "tiny.layout.yaml"], record=root / "tiny.csv")
    said = []
    rc = reproduce.reproduce(root / "tiny.csv", out=root / "again", echo=said.append, run_points=in_process)
    return root, said, rc


def _shifted(root, name: str, by: list[float]):
    """A copy of the record with seed i's values moved by ``by[i]``."""
    rows = [dataclasses.replace(r, value=r.value + by[r.seed]) for r in record.read(root / "tiny.csv")]
    record.write(root / name, rows)
    return root / name


def test_the_record_holds_each_seed_with_its_config_and_provenance(made):
    root, _, _ = made
    rows = record.read(root / "tiny.csv")
    assert [(r.method, r.seed) for r in rows] == [(m, s) for m in ("Local", "FedAvg") for s in (0, 1, 2)]
    assert all(r.metric == "final_acc" and r.setting == "synthetic" and 0 <= r.value <= 100 for r in rows)
    assert rows[4].config["run.seed"] == 1 and rows[0].config["algorithm.name"] == "local"
    assert "algorithm.name" not in rows[4].config  # fedavg is the default: the config holds what differs
    assert "run.name" not in rows[0].config and "run.out_dir" not in rows[0].config
    assert rows[0].provenance["cpu_capability"] and "hosts" not in rows[0].provenance
    # the table a page renders from the record is the table analyze made from the logs
    assert record.render(root / "tiny.csv").split("\n\n")[:2] == \
        (root / "analysis" / "tiny.md").read_text().split("\n\n")[:2]


def test_a_rerun_with_the_same_code_here_is_bitwise(made):
    _, said, rc = made
    assert rc == 0
    assert [line.split()[0] for line in said if line.startswith(reproduce.VERDICTS)] == ["bitwise", "bitwise"]
    assert any(line.startswith("provenance: commit") and line.endswith(": same") for line in said), said
    assert "provenance: versions same" in said


def test_seed_noise_is_within_and_a_shift_differs(made):
    root, _, _ = made
    said = []
    noisy = _shifted(root, "noisy.csv", [0.01, -0.02, 0.015])
    assert reproduce.reproduce(noisy, out=root / "again", echo=said.append, run_points=in_process) == 0
    verdicts = [line for line in said if line.startswith(reproduce.VERDICTS)]
    assert [v.split()[0] for v in verdicts] == ["within", "within"] and "95% interval [" in verdicts[0]
    said.clear()
    moved = _shifted(root, "moved.csv", [-1.0, -1.1, -0.9])
    assert reproduce.reproduce(moved, n_cells=1, out=root / "again", echo=said.append, run_points=in_process) == 1
    verdicts = [line for line in said if line.startswith(reproduce.VERDICTS)]
    assert len(verdicts) == 1 and verdicts[0].startswith("differs  Local / synthetic")
    assert "+1.000 points" in verdicts[0]


def test_the_table_wide_line_counts_exclusions_and_holds_them_to_5_percent_together(made):
    root, said, _ = made
    assert said[-1].startswith("mpifl.reproduce: table-wide: 0 of 2 cell metric(s) exclude 0")  # bitwise: p 1
    out = []
    reproduce.reproduce(_shifted(root, "moved2.csv", [-1.0, -1.1, -0.9]), out=root / "again", echo=out.append,
                        run_points=in_process)
    assert "2 of 2 cell metric(s) exclude 0 at 95% (0.1 expected" in out[-1]
    assert out[-1].endswith("a difference the table's tests together find")
    # 20 cells of which one p = 0.03: outside 95% alone, not with the other 19 held to 5% together
    line = reproduce.table_line([(f"c{i}", 0.03 if i == 0 else 0.5) for i in range(20)])
    assert "1 of 20 cell metric(s)" in line and "smallest Holm-adjusted p 0.6 (c0)" in line
    assert line.endswith("no difference the table's tests together find at 5%")


def test_paired_p_agrees_with_the_interval_and_holm_adjusts_step_down():
    import math

    from mpifl.analysis.stats import holm, paired_interval, paired_p

    for diffs in ([0.1, -0.2, 0.15], [1.0, 1.1, 0.9], [0.3, 0.5, 0.2, 0.6], [2.0, -1.0]):
        _, low, high, _ = paired_interval(diffs)
        assert (paired_p(diffs) < 0.05) == (low > 0 or high < 0), diffs
    assert paired_p([0.0, 0.0]) == 1.0 and paired_p([0.5, 0.5]) == 0.0 and math.isnan(paired_p([1.0]))
    assert holm([0.01, 0.04, 0.03, math.nan]) == pytest.approx([0.03, 0.06, 0.06, math.nan], nan_ok=True)
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def test_a_page_shows_its_record_and_the_check_sees_a_changed_number(made, tmp_path):
    root, _, _ = made
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tiny.csv").write_text((root / "tiny.csv").read_text())
    page = "# page\n\n<!-- generated:record data/tiny.csv -->\nold\n<!-- /generated -->\n"
    fresh = docs.render(page, tmp_path)
    assert "| Local | " in fresh and "provenance: commit " in fresh and docs.render(fresh, tmp_path) == fresh
    cell = next(line for line in fresh.splitlines() if line.startswith("| Local | "))
    typed = fresh.replace(cell, cell.replace(".", ",", 1))  # one number typed by hand
    assert docs.render(typed, tmp_path) == fresh != typed


def test_a_bad_record_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "r.csv").write_text("method,seed\nfedavg,0\n")
    assert reproduce.main([str(tmp_path / "r.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "lacks the column(s) table, layout, setting" in err


@pytest.mark.slow
def test_the_command_remakes_a_cell_on_warm_workers_bit_for_bit(made, tmp_path):
    root, _, _ = made
    res = launch([str(root / "tiny.csv"), "--cells", "1", "--parallel", "2", "--out", str(tmp_path)], n=0,
                 module="mpifl.reproduce")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "bitwise  Local / synthetic (final_acc): 3 seed(s) equal bit for bit" in res.stdout
    assert "0 differs (of 1 cell(s))" in res.stdout
    assert len(list((tmp_path / "reproduce" / "runs").iterdir())) == 3  # the first cell's runs only


def test_versus_shows_which_verdicts_the_rerun_keeps(made):
    root, _, _ = made
    said = []
    assert reproduce.reproduce(root / "tiny.csv", out=root / "again", echo=said.append, run_points=in_process,
                               versus="Local") == 0
    lines = [line for line in said if line.startswith("versus ")]
    assert len(lines) == 1 and lines[0].startswith("versus   FedAvg - Local / synthetic: record ")
    assert "(moved)" not in lines[0]
    assert "mpifl.reproduce: versus Local: 1 of 1 verdict(s) the same on the re-run" in said
    # Local's recorded values far above the re-made ones: FedAvg is below Local on the record, not on the re-run
    rows = [dataclasses.replace(r, value=r.value + (50.0 + r.seed if r.method == "Local" else 0.0))
            for r in record.read(root / "tiny.csv")]
    record.write(root / "local-up.csv", rows)
    said.clear()
    assert reproduce.reproduce(root / "local-up.csv", out=root / "again", echo=said.append, run_points=in_process,
                               versus="Local") == 1  # Local's cell differs: the exit status is the cells'
    (line,) = [x for x in said if x.startswith("versus ")]
    assert " below; re-run " in line and line.endswith("(moved)") and "record -5" in line, line
    assert "mpifl.reproduce: versus Local: 0 of 1 verdict(s) the same on the re-run; moved: FedAvg / synthetic" in said


def test_versus_a_method_the_record_lacks_is_refused_before_any_run(made, capsys):
    root, _, _ = made
    assert reproduce.main([str(root / "tiny.csv"), "--versus", "Oracle", "--out", str(root / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "mpifl.reproduce: error: --versus 'Oracle': no such method in the chosen cells (they hold: Local, " \
        "FedAvg)" and not (root / "none").exists()


def test_a_record_of_several_metrics_is_judged_metric_by_metric(made):
    """analyze --record without a layout writes every metric of a run (final, tail and
    best accuracy, plain and weighted): each is compared with the re-run's own value
    of that metric, not with another metric's."""
    root, _, _ = made
    an.analyze([root / "runs"], root / "analysis-all", heatmaps="none", echo=lambda *a, **k: None,
               record=root / "all.csv")
    rows = record.read(root / "all.csv")
    metrics = list(dict.fromkeys(r.metric for r in rows))
    assert len(metrics) > 1 and len({r.value for r in rows if r.seed == 0 and r.method == rows[0].method}) > 1
    said = []
    assert reproduce.reproduce(root / "all.csv", out=root / "again", echo=said.append, run_points=in_process) == 0
    verdicts = [line for line in said if line.startswith(reproduce.VERDICTS)]
    assert len(verdicts) == 2 * len(metrics) and all(v.startswith("bitwise") for v in verdicts), verdicts
    assert {v.split("(")[1].split(")")[0] for v in verdicts} == set(metrics)
    assert said[-2].endswith(f"(of {2 * len(metrics)} cell metrics in 2 cell(s))")
    assert said[-1].startswith(f"mpifl.reproduce: table-wide: 0 of {2 * len(metrics)} cell metric(s)")


def _edited(root, name: str, edit) -> object:
    """A copy of the record with ``edit(rows)`` applied to its CSV rows (lists of cells, the header first)."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO((root / "tiny.csv").read_text())))
    edit(rows)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (root / name).write_text(buf.getvalue())
    return root / name


def _config_col(rows) -> int:
    return rows[0].index("config")


BAD_RECORDS = {
    "a list config": (lambda rows: rows[1].__setitem__(_config_col(rows), "[1,2]"),
                      "line 2: column config holds list, where a record holds a JSON object"),
    "a null config": (lambda rows: rows[3].__setitem__(_config_col(rows), "null"),
                      "line 4: column config holds NoneType"),
    "a list provenance": (lambda rows: rows[6].__setitem__(rows[0].index("provenance"), "[1]"),
                          "line 7: column provenance holds list"),
    "a field past csv's limit": (lambda rows: rows[2].__setitem__(rows[0].index("table"), "x" * 131_073),
                                 "line 3: field larger than field limit (131072)"),
    "a seed of 5,000 digits": (lambda rows: rows[1].__setitem__(rows[0].index("seed"), "9" * 5000),
                               "line 2: column seed or value is not a number"),
    "one run as three seeds": (lambda rows: [r.__setitem__(_config_col(rows), rows[1][_config_col(rows)])
                                             for r in rows[2:4]],
                               "a Local / synthetic row of seed 1 holds the config of run.seed=0"),
    "a seed twice": (lambda rows: rows.insert(2, list(rows[1])), "Local / synthetic holds seed 0 twice for final_acc"),
    "a config main refuses": (lambda rows: rows[6].__setitem__(_config_col(rows), json.dumps(
        {**json.loads(rows[6][_config_col(rows)]), "run.rounds": -1})),
        "a run of the record is refused before any is made: run.rounds=-1"),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_a_record_is_checked_whole_before_any_run_is_made(made, tmp_path, capsys, case):
    root, _, _ = made
    edit, want = BAD_RECORDS[case]
    bad = _edited(root, "bad.csv", edit)
    assert reproduce.main([str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("mpifl.reproduce: error: ") and want in err, err
    assert not (tmp_path / "reproduce").exists()  # no run folder made


def test_more_runs_than_max_runs_are_refused_until_allowed(made, tmp_path, capsys):
    root, _, _ = made
    assert reproduce.main([str(root / "tiny.csv"), "--out", str(tmp_path), "--max-runs", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("2 cell(s) are 6 runs, more than --max-runs 5; pass --max-runs 6 to make them all, or "
                        "--cells K for the first K") and not (tmp_path / "reproduce").exists()
    said = []
    assert reproduce.reproduce(root / "tiny.csv", out=tmp_path, echo=said.append, run_points=in_process,
                               max_runs=6) == 0


def test_ctrl_c_is_one_line(made, tmp_path, capsys, monkeypatch):
    root, _, _ = made

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce, "rerun", interrupted)
    assert reproduce.main([str(root / "tiny.csv"), "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err.strip()
    assert err == (f"mpifl.reproduce: stopped (Ctrl-C); the runs complete under {tmp_path / 'reproduce'} are kept, "
                   f"and the same command makes only the rest")


def test_the_training_is_recorded_and_named_where_it_differs(made):
    root, said, _ = made
    rows = record.read(root / "tiny.csv")
    assert rows[0].provenance["train"] == {"path": "batched", "threads": 1, "conv_kernel": None}
    assert "provenance: training batched, 1 thread in the record, batched, 1 thread here: same" in said
    fused = {**rows[0].provenance, "train": {"path": "batched", "threads": 1, "conv_kernel": "fused",
                                             "conv_flags": "-O3", "compiler": "c++ 12"}}
    plain = {**rows[0].provenance, "train": {"path": "batched", "threads": 1, "conv_kernel": "torch"}}
    lines = reproduce.compare_provenance([fused], [plain])
    assert ("provenance: training batched, fused conv (c++ 12; -O3), 1 thread in the record, batched, torch conv, "
            "1 thread here: differs") in lines
    assert [ln.endswith(": same") for ln in lines[:2]] == [True, True]  # commit, CPU capability
