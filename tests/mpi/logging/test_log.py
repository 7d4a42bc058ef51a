"""Logging under MPI: compact N x N storage gathered from every rank reads
back as the dense log does; ``log.every`` thins rows without changing results; every
log records its provenance (mpifl.run.provenance).

Bits: the one exact comparison is of Local's mixing rows read back as the identity
(stored values, no arithmetic): any CPU. Compact against dense logs is compared
within tolerances."""

import json

import h5py
import numpy as np
import pytest
import torch

from mpifl import config
from mpifl.logging.h5 import open_run
from mpifl.logging.mixing import Dense, Grouped, Shared
from mpifl.run import provenance, runtime

SMALL = {"data.name": "synthetic", "data.n_samples": 800, "data.n_clients": 8, "data.n_clusters": 2,
         "model.hidden": "[8]", "run.threads": 1, "run.rounds": 4, "algorithm.fraction": 0.5}


def run(mpi, tmp, name, **over):
    args = {**SMALL, "run.out_dir": str(tmp), "run.name": name, **over}
    cfg = config.load(None, [f"{k}={v}" for k, v in args.items()], n_ranks=mpi.Get_size())
    runtime.run(cfg, mpi)
    mpi.Barrier()
    return open_run(tmp / name)


@pytest.mark.parametrize("algo", ["local", "oracle", "fedavg"])
def test_compact_mixing_reads_back_as_dense(mpi, shared_tmp, algo):
    dense = run(mpi, shared_tmp, f"{algo}-dense", **{"algorithm.name": algo})
    compact = run(mpi, shared_tmp, f"{algo}-compact", **{"algorithm.name": algo, "log.dense_max": 4})
    assert compact.n_rounds == dense.n_rounds == 4
    with h5py.File(compact.path, "r", locking=False) as f:
        assert f["graph"].attrs["mixing_format"] == "compact"
        assert "graph/mixing" not in f  # no dense N x N dataset
        kinds = set(f["graph/mixing_kind"][:].tolist())
    assert kinds == {"local": {Dense.KIND}, "oracle": {Grouped.KIND}, "fedavg": {Shared.KIND}}[algo]
    for t in range(4):
        m = compact.mixing(t)
        np.testing.assert_allclose(m, dense.mixing(t), rtol=1e-6)
        np.testing.assert_allclose(m.sum(1), 1.0, rtol=1e-5)
    if algo == "local":
        assert np.array_equal(compact.mixing(2), np.eye(8))
    np.testing.assert_allclose(compact.metric("test_acc"), dense.metric("test_acc"), rtol=1e-5)


def test_log_every_thins_rows_not_results(mpi, shared_tmp):
    full = run(mpi, shared_tmp, "every1", **{"algorithm.name": "oracle", "run.rounds": 5})
    thin = run(mpi, shared_tmp, "every2", **{"algorithm.name": "oracle", "run.rounds": 5, "log.every": 2})
    assert full.rounds.tolist() == [0, 1, 2, 3, 4]
    assert thin.rounds.tolist() == [1, 3, 4]  # every 2nd round and always the last
    keep = [1, 3, 4]
    for key in ("metrics/test_acc", "metrics/train_loss", "comm/bytes_recv"):
        np.testing.assert_allclose(thin.get(key), full.get(key)[keep], rtol=1e-5)
    for i, t in enumerate(keep):
        np.testing.assert_allclose(thin.mixing(i), full.mixing(t))


def test_every_log_records_its_provenance(mpi, shared_tmp):
    """Every rank's host is gathered into rank 0's log; a resumed start on the same
    code and machine keeps one provenance, no ``earlier`` starts."""
    log = run(mpi, shared_tmp, "origin", **{"algorithm.name": "fedavg", "run.rounds": 2})
    p = json.loads(log.attrs["provenance"])
    assert p["hosts"] == list(dict.fromkeys(mpi.allgather(provenance.host())))
    assert p["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert p["device"] == log.attrs["device"] and p["versions"] == json.loads(log.attrs["versions"])
    assert p["mpifl"]["commit"] and p["sweep"] is None
    longer = run(mpi, shared_tmp, "origin", **{"algorithm.name": "fedavg", "run.rounds": 3})
    again = json.loads(longer.attrs["provenance"])
    assert longer.n_rounds == 3 and "earlier" not in again and again["hosts"] == p["hosts"]
