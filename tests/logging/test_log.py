"""The HDF5 log's compact N x N storage and the ``log:`` config section.

Bits: the exact comparisons are of values read back as they were written and of
mixing forms densified (the stored weights, copied): any CPU."""

import h5py
import numpy as np
import pytest
from scipy import sparse

from mpifl import config
from mpifl.errors import ConfigError
from mpifl.logging.h5 import Writer, open_run
from mpifl.logging.mixing import Dense, Grouped, Mixing, Shared, group_matrix

N = 6


def oracle_rows(group, weight):
    """Oracle's former per-row construction, the reference for the groups format."""
    m = np.zeros((len(group), len(group)), np.float32)
    for i in range(len(group)):
        m[i] = np.where(group == group[i], weight, 0.0)
        if m[i].sum() == 0:
            m[i, i] = 1.0
    return m


def test_group_matrix_matches_per_row_construction():
    group = np.array([0, 1, 2, 0, 1, 2])
    weight = np.array([0.5, 0.25, 0.0, 0.5, 0.75, 0.0])  # cluster 2 not sampled
    m = group_matrix(group, weight)
    np.testing.assert_array_equal(m, oracle_rows(group, weight))
    assert m[2, 2] == 1 and m[5, 5] == 1 and m[2, 5] == 0


def write_all(tmp, name, dense_max, flush_s=0.0):
    g = np.random.default_rng(0)
    graph = sparse.random(N, N, density=0.3, random_state=1, format="csr") + sparse.eye(N)
    graph = sparse.csr_matrix(graph.multiply(1 / graph.sum(1)))
    dense = g.random((N, N)).astype(np.float32)
    group = (np.array([0, 1, 0, 1, 2, 2]), np.array([0.5, 0.5, 0.5, 0.5, 0, 0]))
    rounds = [Dense(graph), Dense(dense), Shared(np.full(N, 1 / N)), Grouped(*group)]
    w = Writer(tmp / f"{name}.h5", {"algorithm": "x"}, {"cluster": np.zeros(N, np.int64)}, N, dense_max=dense_max,
               flush_s=flush_s)
    for t, m in enumerate(rounds):
        w.write_round(10 * t, {"wall_s": 1.0}, {"metrics/test_acc": np.full(N, t, np.float32)}, mixing=m)
        if flush_s:  # buffered: run.h5 holds none before close, open_run reads them from run.h5.rounds
            with h5py.File(tmp / f"{name}.h5", "r") as f:
                assert "rounds/round" not in f
            live = open_run(tmp / f"{name}.h5")
            assert live.rounds.tolist() == [10 * s for s in range(t + 1)] and live.metric("test_acc")[t, 0] == t
    w.close()
    expected = [graph.toarray(), dense, np.full((N, N), 1 / N), oracle_rows(*group)]
    return open_run(tmp / f"{name}.h5"), expected


@pytest.mark.parametrize("flush_s", [0.0, 1e9])
@pytest.mark.parametrize("dense_max", [2, 100])
def test_every_mixing_form_reads_back_dense(tmp_path, dense_max, flush_s):
    run, expected = write_all(tmp_path, "r", dense_max, flush_s)
    np.testing.assert_array_equal(run.metric("test_acc")[:, 0], [0, 1, 2, 3])
    assert run.rounds.tolist() == [0, 10, 20, 30]  # rows carry their round numbers
    for t, m in enumerate(expected):
        np.testing.assert_allclose(run.mixing(t), m, rtol=1e-6, atol=1e-7)
    # a compact log keeps each round's form (and its stored kind code)
    forms = [type(run.mixing_of(t)) for t in range(4)]
    assert forms == ([Dense] * 4 if dense_max >= N else [Dense, Dense, Shared, Grouped])
    keys = set(run.keys())
    assert ("graph/mixing" in keys) == (dense_max >= N)
    if dense_max < N:
        coo = run.get("graph/mixing_coo/end")
        assert coo[-1] == np.count_nonzero(expected[0]) + np.count_nonzero(expected[1])


def test_rows_read_back_across_chunks_growth_and_a_resume(tmp_path):
    """150 rounds cross the 64-row growth steps and many chunks of each row size (64
    small rows per chunk, 28 of the [N, N] ones, one per round for rows over 4 KiB);
    a resume cuts the log inside a chunk and the rounds after it are written again."""
    path = tmp_path / "r.h5"
    g = np.random.default_rng(0)
    rows = {t: {"metrics/test_acc": g.random(N).astype(np.float32), "comm/bytes_sent": g.integers(0, 1 << 40, N),
                "x/w": g.random((N, N)).astype(np.float32), "x/big": g.random((N, 700)).astype(np.float32)}
            for t in range(150)}

    def write(w, ts, shift=0.0):
        for t in ts:
            w.write_round(t, {"wall_s": t + shift}, {k: v + shift for k, v in rows[t].items()},
                          mixing=Shared(np.full(N, 1 / N)))
        w.close()

    write(Writer(path, {"algorithm": "x"}, {"cluster": np.zeros(N, np.int64)}, N), range(100), shift=7.0)
    write(Writer(path, {"algorithm": "x", "n_ranks": 1}, {}, N, keep_rounds=70), range(70, 150))
    run = open_run(path)
    assert run.rounds.tolist() == list(range(150))
    for k in rows[0]:  # rounds 0-69 from the first run (shifted), 70-149 from the resumed one
        expect = np.stack([rows[t][k] + (7 if t < 70 else 0) for t in range(150)])
        np.testing.assert_array_equal(run.get(k), expect)
    np.testing.assert_array_equal(run.get("rounds/wall_s"), np.arange(150.0) + np.where(np.arange(150) < 70, 7, 0))
    np.testing.assert_allclose(run.mixing(149), np.full((N, N), 1 / N), rtol=1e-6)


def test_every_form_encodes_decodes_and_densifies_alike():
    g = np.random.default_rng(1)
    rows = np.where(g.random((N, N)) < 0.4, g.random((N, N)), 0).astype(np.float32)
    forms = [Dense(rows), Dense(sparse.csr_matrix(rows)), Shared(g.random(N)),
             Grouped(np.array([0, 0, 1, 1, 1, 2]), np.array([0.3, 0.7, 0.2, 0.0, 0.8, 0.0]))]
    for m in forms:
        stored = m.encode()
        assert int(stored["mixing_kind"]) == m.KIND
        back = Mixing.decode(stored.__getitem__, N)
        assert type(back) is type(m)
        np.testing.assert_array_equal(back.densify(), m.densify())
    assert len({type(m).KIND for m in forms}) == 3  # one code per form
    np.testing.assert_array_equal(forms[0].densify(), rows)
    np.testing.assert_array_equal(forms[3].densify(), oracle_rows(forms[3].group, forms[3].weight))


def test_a_compact_log_laid_out_by_hand_reads_back(tmp_path):
    """The on-disk codes are fixed: 0 non-zeros, 1 one shared row, 2 groups."""
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as f:
        f["clients/cluster"] = np.zeros(3, np.int64)
        f["rounds/round"] = np.arange(3)
        g = f.create_group("graph")
        g.attrs["mixing_format"] = "compact"
        g["mixing_kind"] = np.array([0, 1, 2], np.int8)
        g["mixing_shared"] = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.25, 0.75, 0]], np.float32)
        g["mixing_group"] = np.array([[0, 0, 0], [0, 0, 0], [0, 0, 1]], np.int32)
        g["mixing_coo/row"] = np.array([0, 1, 2], np.int32)
        g["mixing_coo/col"] = np.array([0, 1, 2], np.int32)
        g["mixing_coo/val"] = np.ones(3, np.float32)
        g["mixing_coo/end"] = np.array([3, 3, 3], np.int64)
    run = open_run(path)
    np.testing.assert_array_equal(run.mixing(0), np.eye(3))
    np.testing.assert_array_equal(run.mixing(1), [[0.5, 0.5, 0]] * 3)
    np.testing.assert_array_equal(run.mixing(2), [[0.25, 0.75, 0], [0.25, 0.75, 0], [0, 0, 1]])


@pytest.mark.parametrize("key", ["log.every", "log.dense_max"])
def test_log_section_rejects_non_positive(key):
    with pytest.raises(ConfigError, match=key):
        config.load(None, [f"{key}=0"])
    assert getattr(config.load(None, [f"{key}=3"]).log, key.split(".")[1]) == 3


def every_dataset(path):
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda k, d: out.update({k: d[()]}) if isinstance(d, h5py.Dataset) else None)
        return out, dict(f.attrs)


@pytest.mark.parametrize("dense_max", [2, 100])
def test_rounds_of_a_killed_buffered_writer_read_back_and_are_adopted_on_resume(tmp_path, dense_max):
    """log.flush_s > 0 with the writer gone without closing (a SIGKILL): every round
    appended to run.h5.rounds reads back through open_run as the unbuffered log
    holds it, a record cut short is ignored, and the next writer (a resume) moves
    the rounds into run.h5 before it cuts the log back to the checkpoint."""
    from mpifl.logging import pending

    g = np.random.default_rng(2)
    forms = [Dense(g.random((N, N)).astype(np.float32)), Shared(np.full(N, 1 / N)),
             Grouped(np.array([0, 1, 0, 1, 2, 2]), np.array([0.5, 0.5, 0.5, 0.5, 0, 0]))]

    def write(path, flush_s, close):
        w = Writer(path, {"algorithm": "x"}, {"cluster": np.zeros(N, np.int64)}, N, dense_max=dense_max,
                   flush_s=flush_s)
        for t in range(9):
            w.write_round(t, {"wall_s": 0.5 * t}, {"metrics/test_acc": g.random(N).astype(np.float32),
                                                   "comm/bytes_sent": g.integers(0, 1 << 40, N),
                                                   "x/w": g.random((N, N))},
                          mixing=forms[t % 3], once={"x/lia": g.random((N, 3))} if t == 4 else None,
                          attrs={"x_budget": np.float32(t) / 3, "x_splits": [t, t + 1]} if t % 4 == 3 else None)
        if close:
            w.close()
        return w

    g = np.random.default_rng(2)
    write(tmp_path / "plain.h5", 0.0, close=True)
    g = np.random.default_rng(2)
    killed = write(tmp_path / "run.h5", 1e9, close=False)  # never closed: what a kill leaves on disk
    side = pending.rounds_path(tmp_path / "run.h5")
    assert side.stat().st_size > 0
    want, want_attrs = every_dataset(tmp_path / "plain.h5")
    with h5py.File(tmp_path / "run.h5", "r") as f:
        assert "rounds/round" not in f  # run.h5 itself holds no round
    run = open_run(tmp_path / "run.h5")
    assert run.rounds.tolist() == list(range(9))
    for k, v in want.items():
        np.testing.assert_array_equal(run.get(k), v, err_msg=k)
        assert run.get(k).dtype == v.dtype, k
    for t in range(9):
        np.testing.assert_array_equal(run.mixing(t), open_run(tmp_path / "plain.h5").mixing(t))
    assert run.attrs["x_splits"] == want_attrs["x_splits"] and run.attrs["x_budget"] == want_attrs["x_budget"]
    assert type(run.attrs["x_budget"]) is type(want_attrs["x_budget"])  # its dtype kept (float32)
    # a record cut short (a kill inside the append, a full disk) and anything after it are ignored
    with open(side, "ab") as f:
        f.write(pending.encode({"t": 9, "rounds": {}, "rows": {}, "mixing": None, "once": {}, "attrs": {}},
                               False)[:-3])
    assert open_run(tmp_path / "run.h5").rounds.tolist() == list(range(9))
    del killed
    # the resume after a checkpoint of round 5: rounds 0-5 kept, in run.h5 itself, the file gone
    w = Writer(tmp_path / "run.h5", {"algorithm": "x", "n_ranks": 1}, {}, N, dense_max=dense_max, keep_rounds=6)
    w.close()
    assert not side.exists()
    got, _ = every_dataset(tmp_path / "run.h5")
    assert got["rounds/round"].tolist() == list(range(6))
    for k, v in want.items():
        if k.startswith(("metrics/", "comm/", "x/w", "rounds/")):
            np.testing.assert_array_equal(got[k], v[:6], err_msg=k)


def test_a_fresh_start_forgets_the_pending_rounds_of_the_run_it_replaces(tmp_path):
    from mpifl.logging import pending

    path = tmp_path / "run.h5"
    w = Writer(path, {"algorithm": "x"}, {"cluster": np.zeros(N, np.int64)}, N, flush_s=1e9)
    for t in range(3):
        w.write_round(t, {"wall_s": 1.0}, {"metrics/test_acc": np.full(N, t, np.float32)})
    assert pending.rounds_path(path).stat().st_size > 0
    Writer(path, {"algorithm": "x"}, {"cluster": np.zeros(N, np.int64)}, N).close()
    assert not pending.rounds_path(path).exists() and open_run(path).n_rounds == 0


def test_a_damaged_pending_round_is_named_and_a_resume_goes_on(tmp_path):
    """A whole record of run.h5.rounds changed after it was written (a bit flip) makes
    open_run raise Corrupt naming the file, where a cut last record is only left out;
    the resume, whose checkpoint precedes those rounds, drops them and goes on."""
    from mpifl.logging import pending
    from mpifl.logging.h5 import Corrupt

    path = tmp_path / "run.h5"
    w = Writer(path, {"algorithm": "x"}, {"cluster": np.zeros(N, np.int64)}, N, flush_s=1e9)
    for t in range(3):
        w.write_round(t, {"wall_s": 1.0}, {"metrics/test_acc": np.full(N, t, np.float32)})
    w.flush()  # rounds 0-2 in run.h5 (as before a checkpoint), 3-5 waiting
    for t in range(3, 6):
        w.write_round(t, {"wall_s": 1.0}, {"metrics/test_acc": np.full(N, t, np.float32)})
    side = pending.rounds_path(path)
    good = side.read_bytes()
    assert open_run(path).rounds.tolist() == list(range(6))
    side.write_bytes(good[:-5])  # the last record cut short: left out
    assert open_run(path).rounds.tolist() == list(range(5))
    bad = bytearray(good)
    bad[len(good) // 2] ^= 0x10  # a bit of the middle record
    side.write_bytes(bytes(bad))
    with pytest.raises(Corrupt, match=r"run\.h5\.rounds.*record 2"):
        _ = open_run(path).rounds
    w2 = Writer(path, {"algorithm": "x", "n_ranks": 1}, {}, N, keep_rounds=3)
    w2.close()
    assert not side.exists() and open_run(path).rounds.tolist() == [0, 1, 2]


@pytest.mark.parametrize("flush_s", [0.0, 1e9])
def test_rounds_done_reads_one_snapshot_of_a_live_log(tmp_path, monkeypatch, flush_s):
    """A live writer's log changes between two opens (a flush moves rounds from
    run.h5.rounds into run.h5): a count from one open indexed into the next made a
    sweep driver probing another driver's point die of an IndexError."""
    from mpifl.logging import h5

    path = tmp_path / "run.h5"
    w = Writer(path, {"algorithm": "x"}, {"cluster": np.zeros(N, np.int64)}, N, flush_s=flush_s)
    for t in range(3):
        w.write_round(2 * t, {"wall_s": 1.0}, {"metrics/test_acc": np.full(N, t, np.float32)})
    run = open_run(path)
    opens = []
    real = h5.Run._file

    def counted(self):
        opens.append(1)
        return real(self)

    monkeypatch.setattr(h5.Run, "_file", counted)
    assert run.rounds_done == 5 and len(opens) == 1
    w.close()


def test_a_row_no_write_reached_reads_as_missing_not_as_zero(tmp_path):
    """Per-round datasets grow ahead of the rounds written (64 rows at a time); a row
    the file holds but no write reached (there, or in a file whose process was
    killed before its chunk was flushed while rounds/round's extent was) must read
    as nan, the mark of a round not evaluated, never as an accuracy of 0."""
    path = tmp_path / "r.h5"
    w = Writer(path, {"algorithm": "x"}, {}, N)
    for t in range(3):
        w.write_round(t, {"wall_s": 1.0}, {"metrics/test_acc": np.full(N, 0.5, np.float32),
                                           "comm/bytes_sent": np.ones(N, np.int64)})
    w.flush()
    with h5py.File(path, "r", locking=False) as f:
        acc, sent = f["metrics/test_acc"], f["comm/bytes_sent"]
        assert acc.shape[0] > 3  # grown ahead of the rounds written
        assert np.isnan(acc[3:]).all() and (acc[:3] == 0.5).all()
        assert np.isnan(acc.fillvalue) and sent.fillvalue == 0  # integers keep 0: no nan to mark them
    w.close()
    assert open_run(path).get("metrics/test_acc").shape[0] == 3
