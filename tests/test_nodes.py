"""Several nodes, simulated on one machine: MPICH's ``MPIR_CVAR_NUM_CLIQUES=K``
splits ``MPI_COMM_TYPE_SHARED`` into K node-local groups (ranks dealt round-robin,
node = rank % K), so the node-local rules and MPI's node-aware algorithms run as on
K nodes. A run's log does not depend on the layout: bit for bit the same on 1 or
2 ranks of one node as on 8 or 16 ranks over 4 nodes, at the same threads per rank.

Bits: the runs compared are launches on one machine with one thread per rank
(``run.threads=1``), MLPs on their batched path, every sum over clients in client
order: the same bits on every layout, on whichever CPU runs them all; runs on two
CPU kinds are not compared."""

import numpy as np
import pytest
from helpers import launch

from mpifl.logging.h5 import open_run

pytestmark = pytest.mark.slow  # every test launches mpiexec

# where the ranks are and how long rounds took: the only records allowed to differ
PLACEMENT = {"clients/rank", "clients/node", "rounds/wall_s", "rounds/comm_s", "rounds/compute_s"}


def _run(tmp_path, args: list[str], name: str, n: int, nodes: int = 0):
    env = {"MPIR_CVAR_NUM_CLIQUES": str(nodes)} if nodes else {}
    res = launch([*args, f"run.out_dir={tmp_path}", f"run.name={name}", "run.threads=1"], n=n, env=env, timeout=600)
    assert res.returncode == 0, res.stderr
    return open_run(tmp_path / name)


def _assert_bitwise(a, b) -> None:
    keys = set(a.keys()) - PLACEMENT
    assert keys == set(b.keys()) - PLACEMENT and a.n_rounds == b.n_rounds
    for k in sorted(keys):
        x, y = a.get(k), b.get(k)
        assert x.shape == y.shape, k
        if not np.array_equal(x, y, equal_nan=True):  # how far apart, for a GPU's report
            d = np.abs(x.astype(float) - y.astype(float))
            raise AssertionError(f"{k} differs: max |a - b| {np.nanmax(d):.3g}, {np.mean(d > 0):.1%} of values")


def _assert_nodes(run, n: int, nodes: int) -> None:
    rank = run.get("clients/rank")
    assert run.attrs["n_ranks"] == n and run.attrs["n_nodes"] == nodes
    assert np.array_equal(run.get("clients/node"), rank % nodes)  # MPICH's cliques: round-robin


def test_the_quickstart_on_16_ranks_over_4_nodes_equals_2_ranks_bit_for_bit(tmp_path):
    two = _run(tmp_path, ["jobs/quickstart.yaml"], "n2", 2)
    spread = _run(tmp_path, ["jobs/quickstart.yaml"], "n16k4", 16, nodes=4)
    assert two.n_rounds == 30 and np.array_equal(two.get("clients/node"), np.zeros(20))
    _assert_nodes(spread, 16, 4)
    _assert_bitwise(two, spread)


@pytest.mark.parametrize("job", [["jobs/federico-mnist1d.yaml", "run.rounds=20"],
                                 ["jobs/dpfl-mnist1d-patho.yaml", "run.rounds=3", "data.n_clients=8"]],
                         ids=["federico", "dpfl"])
def test_point_to_point_algorithms_on_8_ranks_over_4_nodes_equal_1_rank(tmp_path, job):
    one = _run(tmp_path, job, "n1", 1)
    spread = _run(tmp_path, job, "n8k4", 8, nodes=4)
    _assert_nodes(spread, 8, 4)
    assert spread.get("comm/models_recv").sum() > 0  # models did travel point to point
    _assert_bitwise(one, spread)
