"""Values are checked on read: a chunk of run.h5 changed after it was written fails
its Fletcher-32 checksum, and a metric no run produces (an accuracy outside
[0, 1], a negative or infinite loss, nan in an evaluated round) keeps the run out
of mpifl.analyze's tables with one line naming the dataset, round and value."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from mpifl import analyze as an
from mpifl import config
from mpifl.analysis import summary as sm
from mpifl.logging.h5 import Corrupt, Writer, open_run

N, R = 5, 4
EVALUATED = (0, 2, 3)  # round index 1 is not evaluated (run.eval_every)


def _metrics(t: int) -> dict[str, np.ndarray]:
    ev = t in EVALUATED
    full = (lambda v: np.full(N, v if ev else np.nan))
    return {"metrics/train_loss": np.r_[np.nan, np.full(N - 1, 0.7)],  # client 0 not sampled
            "metrics/val_loss": full(0.6), "metrics/val_acc": full(0.5),
            "metrics/test_loss": full(0.65), "metrics/test_acc": full(0.25 + 0.1 * t)}


def _log(path: Path, change=None, n_test=None) -> Path:
    """A log of R rounds; ``change(t, rows)`` edits a round's rows before it is written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = config.from_dict({"run": {"rounds": R, "name": path.parent.name}, "data": {"n_clients": N}})
    clients = {"cluster": np.zeros(N, np.int64), "n_val": np.full(N, 10),
               "n_test": np.full(N, 10) if n_test is None else np.asarray(n_test)}
    w = Writer(path, {"algorithm": "fedavg", "seed": 0, "n_clients": N, "config_yaml": cfg.to_yaml()}, clients, N)
    for t in range(R):
        rows = _metrics(t)
        if change is not None:
            change(t, rows)
        w.write_round(t, {"wall_s": 1.0}, rows)
    w.close()
    return path


def _analyze(root: Path) -> tuple[dict, list[str]]:
    lines: list[str] = []
    res = an.analyze([root], root / "out", heatmaps="none", echo=lambda *a, **k: lines.append(a[0]))
    return res, [ln for ln in lines if ln.startswith("skipped")]


def _set(t0: int, key: str, client: int, value: float):
    def change(t, rows):
        if t == t0:
            rows[key][client] = value
    return change


def test_plausible_logs_pass_including_the_nan_a_run_writes(tmp_path):
    """nan where nothing was measured: an unevaluated round, a client that did not
    train, a client without test data."""
    _log(tmp_path / "a" / "run.h5", n_test=[10, 10, 10, 10, 0], change=lambda t, rows: [
        rows[k].__setitem__(4, np.nan) for k in ("metrics/test_acc", "metrics/test_loss")])
    s = sm.summarize(tmp_path / "a" / "run.h5")
    assert s.final_acc == pytest.approx(0.25 + 0.1 * 3)
    res, skipped = _analyze(tmp_path)
    assert len(res["runs"]) == 1 and skipped == []


@pytest.mark.parametrize(("t", "key", "client", "value", "why"), [
    (2, "metrics/test_acc", 3, -6.2, "outside [0, 1]"),
    pytest.param(3, "metrics/val_acc", 0, 1.5, "outside [0, 1]", marks=pytest.mark.slow),
    (0, "metrics/test_loss", 1, -0.25, "outside [0, inf)"),
    # one case of each kind of range in the fast tier, the others in the slow one
    pytest.param(2, "metrics/train_loss", 2, np.inf, "outside [0, inf)", marks=pytest.mark.slow),
    (3, "metrics/test_acc", 4, np.nan, "in an evaluated round"),
    pytest.param(0, "metrics/val_loss", 2, np.nan, "in an evaluated round", marks=pytest.mark.slow),
])
def test_an_implausible_value_keeps_the_run_out_of_the_table_in_one_line(tmp_path, t, key, client, value, why):
    good = _log(tmp_path / "good" / "run.h5")
    bad = _log(tmp_path / "bad" / "run.h5", change=_set(t, key, client, value))
    with pytest.raises(sm.Implausible):
        sm.summarize(bad)
    res, skipped = _analyze(tmp_path)
    assert [r.path for r in res["runs"]] == [good] and [p for p, _ in res["skipped"]] == [bad]
    assert skipped == [f"skipped {bad}: implausible value: /{key} holds {value:g} at round {t + 1} "
                       f"(client {client}), {why}"]


def test_every_implausible_value_is_counted_in_the_one_line(tmp_path):
    def change(t, rows):
        rows["metrics/test_acc"][:2] = 7.0 if t in EVALUATED else np.nan

    bad = _log(tmp_path / "bad" / "run.h5", change=change)
    with pytest.raises(sm.Implausible, match=r"/metrics/test_acc holds 7 at round 1 \(client 0\), outside "
                                             r"\[0, 1\]; 5 more such value\(s\)$"):
        sm.summarize(bad)


def _flip(path: Path, key: str, row: int, client: int, bit: int = 0) -> float:
    """Flip one bit of the stored value [row, client] of ``key`` in the file (a
    little-endian float64 in an uncompressed chunk); returns the value it then reads as."""
    with h5py.File(path, "r") as f:
        ds = f[key]
        info = ds.id.get_chunk_info_by_coord((0, 0))
        assert row < ds.chunks[0] and ds.dtype == np.float64 and not ds.compression
        at = info.byte_offset + 8 * (row * ds.shape[1] + client) + bit // 8
        was = float(ds[row, client])
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0] ^ (1 << (bit % 8))
        f.seek(at)
        f.write(bytes([b]))
    flipped = np.frombuffer(np.float64(was).tobytes(), np.uint64)[0] ^ np.uint64(1 << bit)
    return float(np.frombuffer(flipped.tobytes(), np.float64)[0])


@pytest.mark.parametrize("bit", [0, 63])  # still a plausible value (last mantissa bit), and the sign
def test_a_bit_flipped_in_a_metric_chunk_fails_its_checksum(tmp_path, bit):
    good = _log(tmp_path / "good" / "run.h5")
    bad = _log(tmp_path / "bad" / "run.h5")
    reads_as = _flip(bad, "metrics/test_acc", 2, 3, bit)
    assert reads_as != 0.25 + 0.2 and (0 <= reads_as <= 1) == (bit == 0)
    with pytest.raises(Corrupt, match=r"^/metrics/test_acc fails its checksum"):
        open_run(bad).metric("test_acc")
    res, skipped = _analyze(tmp_path)
    assert [r.path for r in res["runs"]] == [good]
    assert skipped == [f"skipped {bad}: corrupt: /metrics/test_acc fails its checksum: the file changed after it "
                       f"was written (a bit flip or a damaged disk or copy)"]


def test_a_bit_flipped_in_a_gzipped_chunk_fails_zlibs_checksum(tmp_path):
    path = tmp_path / "run.h5"
    w = Writer(path, {"n_ranks": 1}, {"cluster": np.zeros(N, np.int64)}, N)
    w.write_round(0, {"wall_s": 1.0}, {"x/big": np.tile(np.arange(200, dtype=np.float32), (N, 1))})
    w.close()
    with h5py.File(path, "r") as f:
        assert f["x/big"].compression == "gzip"
        info = f["x/big"].id.get_chunk_info(0)
    for at in range(0, info.size, 7):  # every 7th byte of the chunk, one at a time
        data = bytearray(path.read_bytes())
        data[info.byte_offset + at] ^= 0x10
        bad = tmp_path / "bad.h5"
        bad.write_bytes(bytes(data))
        with pytest.raises(Corrupt, match=r"^/x/big fails its checksum"):
            open_run(bad).get("x/big")


def test_every_chunked_dataset_of_a_run_log_carries_a_checksum(tmp_path):
    from mpifl.logging.mixing import Dense

    path = tmp_path / "run.h5"
    w = Writer(path, {"n_ranks": 1}, {"cluster": np.zeros(N, np.int64), "label_hist": np.ones((N, 3))}, N,
               dense_max=2)  # compact mixing: the 1-D non-zero lists too
    for t in range(2):
        w.write_round(t, {"wall_s": 1.0}, {**_metrics(t), "x/big": np.ones((N, 200), np.float32)},
                      mixing=Dense(np.eye(N)), once={"x/once": np.arange(100.0), "x/scalar": np.float64(t)})
    w.close()
    unchecked, gzipped = [], []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: (gzipped if obj.compression == "gzip" else unchecked).append(name)
                     if isinstance(obj, h5py.Dataset) and obj.shape and not obj.fletcher32 else None)
    assert unchecked == []
    assert set(gzipped) == {"x/big", "x/once", *(f"graph/mixing_coo/{k}" for k in ("row", "col", "val"))}


def test_a_corrupt_chunk_met_while_drawing_heatmaps_costs_that_run_its_heatmaps(tmp_path, monkeypatch):
    """Heatmaps read rounds the summary did not (the first and middle ones)."""
    log = _log(tmp_path / "a" / "run.h5")

    def corrupt(run, *a, **k):
        raise Corrupt("/graph/mixing fails its checksum: ...")

    monkeypatch.setattr(an, "plot_heatmaps", corrupt)
    lines: list[str] = []
    res = an.analyze([tmp_path], tmp_path / "out", echo=lambda *a, **k: lines.append(a[0]))
    assert len(res["runs"]) == 1 and (tmp_path / "out" / "table.md").is_file()
    assert f"no heatmaps of {log}: corrupt: /graph/mixing fails its checksum: ..." in lines


def test_load_sweep_leaves_out_what_analyze_leaves_out(tmp_path):
    pytest.importorskip("pandas")
    from mpifl import results

    good = _log(tmp_path / "good" / "run.h5")
    bad = _log(tmp_path / "bad" / "run.h5", change=_set(3, "metrics/test_acc", 2, -6.2))
    with pytest.warns(UserWarning, match=r"implausible value: /metrics/test_acc holds -6\.2 at round 4"):
        frame = results.load_sweep(tmp_path)
    assert [Path(p).parent.name for p in frame["path"]] == [good.parent.name]
    assert [p for p, _ in frame.attrs["skipped"]] == [str(bad)]
