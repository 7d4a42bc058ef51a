"""What each run spent, from its log: the engine counts every optimizer step and
the samples in it (``/train/steps``, ``/train/samples``), the algorithm declares
the samples it chooses collaborators on, and ``analyze --versus`` names every
setting that differs between the compared methods beside both budgets.

Bits: the exact comparisons are of step and sample counts (integers) only."""

from __future__ import annotations

import numpy as np
import pytest

from mpifl import analyze as an
from mpifl.analysis import budget
from mpifl.logging.h5 import open_run
from tests.helpers import reference_runs, shared_tmp

SIZES = (20, 40)
ROUNDS = 3


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Local and DPFL at the defaults (DPFL's tau_init 10 and tau_train 5 epochs
    against train.local_epochs 1), over two training-set sizes."""
    root = shared_tmp(tmp_path_factory) / "budget_sweep"
    jobs = {f"{a}-{n}": [f"algorithm.name={a}", f"data.train_per_client={n}", f"run.rounds={ROUNDS}",
                         "data.n_clients=4", "run.threads=1"] for a in ("local", "dpfl") for n in SIZES}
    reference_runs(jobs, root / "runs", n=1)
    return root


def test_the_engine_counts_every_batch_a_client_trains_on(sweep):
    for n in SIZES:
        local, dpfl = (open_run(sweep / "runs" / f"{a}-{n}" / "run.h5") for a in ("local", "dpfl"))
        n_train = local.get("clients/n_train")
        one_epoch = -(-n_train // 32)  # batches of train.batch_size 32
        np.testing.assert_array_equal(local.get("train/steps"), np.tile(one_epoch, (ROUNDS, 1)))
        np.testing.assert_array_equal(local.get("train/samples"), np.tile(n_train, (ROUNDS, 1)))
        steps = dpfl.get("train/steps")
        np.testing.assert_array_equal(steps[0], 10 * one_epoch)  # tau_init
        np.testing.assert_array_equal(steps[1:], 5 * local.get("train/steps")[1:])  # tau_train
        np.testing.assert_array_equal(dpfl.get("train/samples")[1:], 5 * local.get("train/samples")[1:])


def test_versus_names_the_settings_that_differ_and_shows_the_budgets(sweep, tmp_path, capsys):
    assert an.main([str(sweep), "--out", str(tmp_path / "a"), "--heatmaps", "none",
                    "--x", "data.train_per_client", "--versus", "local"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("Settings that differ from local"):]
    assert "  - dpfl.tau_train: 5 | –\n" in block and "  - dpfl.tau_init: 10 | –\n" in block
    assert "algorithm.name: dpfl | local" in block
    assert "data.train_per_client" not in block  # the same cells for both: no difference
    steps = next(line for line in block.splitlines() if "budget steps/round after" in line)
    assert steps.endswith("(5.00x)")
    runs = an.read([sweep])[0]
    val = np.mean([r.budget["select_samples"] for r in runs if r.config["algorithm.name"] == "dpfl"])
    n_val = np.mean([open_run(r.path).get("clients/n_val").mean() for r in runs
                     if r.config["algorithm.name"] == "dpfl"])
    assert val == n_val > 0  # DPFL's rewards: its validation split
    assert all(r.budget["select_samples"] == 0 for r in runs if r.config["algorithm.name"] == "local")
    assert (tmp_path / "a" / "settings.md").read_text() in out
    rows = (tmp_path / "a" / "budget.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * len(SIZES)  # a row per method and cell


def test_fedfomo_declares_the_share_it_holds_out_of_training():
    from mpifl.algorithms import fedfomo_params as fomo

    got = budget.selection_samples({"algorithm.name": "fedfomo", "fedfomo.val_frac": 0.25},
                                   np.array([1, 2, 10, 400]), np.zeros(4))
    np.testing.assert_array_equal(got, [0, 1, 2, 100])
    assert fomo.held_out(0.25, 400) == 100
    none = budget.selection_samples({"algorithm.name": "federico"}, np.array([10]), np.array([5]))
    np.testing.assert_array_equal(none, [0])


def test_a_page_renders_the_budget_from_the_record(sweep, tmp_path):
    """``--record`` keeps each run's budget (``budget:*`` rows) and the page's
    ``generated:budget`` block shows, per method and cell, the runs' mean: the
    five-fold steps of DPFL at the defaults cannot be left off a page."""
    from mpifl.analysis.summary import metric_value
    from mpifl.docs import blocks

    (tmp_path / "data").mkdir()
    rec = tmp_path / "data" / "r.csv"
    assert an.main([str(sweep), "--out", str(tmp_path / "a"), "--heatmaps", "none", "--x", "data.train_per_client",
                    "--versus", "local", "--record", str(rec)]) == 0
    page = "<!-- generated:budget data/r.csv x=data.train_per_client -->\ntyped\n<!-- /generated -->\n"
    text = blocks.render(page, tmp_path)
    runs = an.read([sweep])[0]
    for r in runs:
        n, name = r.config["data.train_per_client"], r.config["algorithm.name"]
        line = next(x for x in text.splitlines() if x.startswith(f"| {name} | {n} | 1 |"))
        assert f"| {budget._fmt(metric_value(r, 'budget:steps'))} |" in line
        assert metric_value(r, "budget:steps") == r.budget["steps"]
    dpfl = [r for r in runs if r.config["algorithm.name"] == "dpfl"]
    local = {r.config["data.train_per_client"]: r for r in runs if r.config["algorithm.name"] == "local"}
    assert all(r.budget["steps_round"] == 5 * local[r.config["data.train_per_client"]].budget["steps_round"]
               for r in dpfl)


def test_dpfl_chooses_on_its_validation_split_unless_its_graph_is_drawn():
    n_val = np.array([7, 70, 875])
    chosen = budget.selection_samples({"algorithm.name": "dpfl"}, np.array([10, 50, 400]), n_val)
    drawn = budget.selection_samples({"algorithm.name": "dpfl", "dpfl.random_graph": True}, np.array([10, 50, 400]),
                                     n_val)
    np.testing.assert_array_equal(chosen, n_val)
    np.testing.assert_array_equal(drawn, [0, 0, 0])
