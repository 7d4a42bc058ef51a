"""The partition and each client's samples do not depend on the number of ranks:
every rank's clients get exactly what a one-process build gives them.

Bits: two builds in one process (a rank's clients, and all clients as one process
builds them) on one CPU: the arrays are the same pool's samples, equal on any CPU."""

import numpy as np
import pytest

from mpifl import config
from mpifl.comm import Comm
from mpifl.data import build
from mpifl.data.partition import PARTITIONS


@pytest.mark.parametrize("partition", sorted(PARTITIONS))
def test_local_clients_match_a_serial_build(mpi, partition):
    n = 8
    cfg = config.load(None, ["data.name=digits", "data.subsample=0.5", f"data.partition={partition}",
                             f"data.n_clients={n}", "data.n_clusters=2", "data.min_client_size=5"],
                      n_ranks=mpi.Get_size()).data
    comm = Comm(n, mpi)
    mine = build(cfg, 3, comm.local_ids)
    ref = build(cfg, 3, np.arange(n))
    np.testing.assert_array_equal(mine.sizes, ref.sizes)
    np.testing.assert_array_equal(mine.cluster, ref.cluster)
    np.testing.assert_array_equal(mine.label_hist, ref.label_hist)
    for k, c in enumerate(comm.local_ids):
        for s in range(3):
            a, b = mine.offsets[k, s], ref.offsets[c, s]
            m = ref.sizes[c, s]
            np.testing.assert_array_equal(mine.x[a:a + m], ref.x[b:b + m])
            np.testing.assert_array_equal(mine.y[a:a + m], ref.y[b:b + m])
    # and every rank agrees on what it computed for all clients
    sig = (ref.sizes.tobytes(), ref.cluster.tobytes(), ref.label_hist.tobytes())
    assert all(s == sig for s in mpi.allgather(sig))


@pytest.mark.parametrize("source", ["split", "test_set"])
def test_fixed_train_size_draws_the_same_samples_on_any_number_of_ranks(mpi, source):
    """data.train_per_client: a client's draw depends on (seed, client) alone, so
    each rank's clients hold what a one-process build gives them."""
    n = 8
    data = ["data.name=mnist1d", "data.n_samples=1000"] if source == "test_set" else ["data.name=digits"]
    cfg = config.load(None, [*data, f"data.test_source={source}", "data.partition=clusters",
                             f"data.n_clients={n}", "data.n_clusters=2", "data.train_per_client=17"],
                      n_ranks=mpi.Get_size()).data
    comm = Comm(n, mpi)
    mine = build(cfg, 5, comm.local_ids)
    ref = build(cfg, 5, np.arange(n))
    assert (ref.sizes[:, 0] == 17).all()
    np.testing.assert_array_equal(mine.sizes, ref.sizes)
    np.testing.assert_array_equal(mine.label_hist, ref.label_hist)
    for k, c in enumerate(comm.local_ids):
        for s in range(3):
            a, b, m = mine.offsets[k, s], ref.offsets[c, s], ref.sizes[c, s]
            np.testing.assert_array_equal(mine.x[a:a + m], ref.x[b:b + m])
            np.testing.assert_array_equal(mine.y[a:a + m], ref.y[b:b + m])
    assert len(set(mpi.allgather(ref.label_hist.tobytes()))) == 1
