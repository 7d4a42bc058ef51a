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
    from mpifl.algorithms._declared import declared

    fomo = declared("fedfomo")
    got = budget.selection_samples({"algorithm.name": "fedfomo", "fedfomo.val_frac": 0.25},
                                   np.array([1, 2, 10, 400]), np.zeros(4))
    np.testing.assert_array_equal(got, [0, 1, 2, 100])
    assert fomo.held_out(0.25, 400) == 100
    none = budget.selection_samples({"algorithm.name": "federico"}, np.array([10]), np.array([5]))
    np.testing.assert_array_equal(none, [0])
