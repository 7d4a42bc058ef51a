"""The analysis of a log written by several ranks equals that of the same run
on one rank: the table does not depend on how a run was placed."""

from __future__ import annotations

import numpy as np
import pytest

from mpifl import analyze as an
from mpifl import config
from mpifl.analysis import summary
from mpifl.analysis import summary as sm
from mpifl.comm import world
from mpifl.run import runtime

TINY = {
    "run": {"rounds": 3, "threads": 1, "eval_every": 2},
    "data": {"name": "synthetic", "n_samples": 400, "n_clients": 8, "n_clusters": 2},
    "model": {"hidden": [8]},
    "algorithm": {"name": "oracle"},
}


def test_analysis_of_a_multi_rank_log_matches_one_rank(mpi, shared_tmp):
    from mpi4py import MPI

    def cfg(name: str) -> config.Config:
        return config.from_dict({**TINY, "run": {**TINY["run"], "name": name, "out_dir": str(shared_tmp)}},
                                n_ranks=mpi.Get_size())

    runtime.run(cfg("many"), world())
    if mpi.Get_rank() == 0:
        runtime.run(cfg("one"), MPI.COMM_SELF)
        many, one = sm.summarize(shared_tmp / "many" / "run.h5"), sm.summarize(shared_tmp / "one" / "run.h5")
        assert many.rounds_done == one.rounds_done == 3 and many.final_round == one.final_round == 2
        for m in summary.ACC:
            assert getattr(many, m) == pytest.approx(getattr(one, m), abs=1e-6), m
        np.testing.assert_allclose(many.client_final, one.client_final, atol=1e-6)
        assert many.ari == one.ari == pytest.approx({"graph.mixing": 1.0})
        res = an.analyze([shared_tmp], shared_tmp / "analysis", heatmaps="none", echo=lambda *a, **k: None)
        assert len(res["runs"]) == 2 and len(res["rows"]) == 1  # same config: one group of two runs
    mpi.Barrier()
