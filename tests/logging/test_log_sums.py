"""The CRC-32 of every dataset of a closed run.h5 (mpifl.logging.sums): a flip
that HDF5's Fletcher-32 cannot see (an int64 0 read as -1) is reported as
corrupt, a scan of flips over the whole file changes no value silently, and a
log reopened by a writer (resume, extension) is sealed again when it closes.

Bits: the exact comparisons are of a log's values read back before and after a flip
(stored values): any CPU."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from mpifl.logging import sums
from mpifl.logging.h5 import Corrupt, Writer, open_run
from mpifl.logging.mixing import Dense

N, R, C = 6, 5, 4


def _log(path: Path, rounds: range = range(R), keep: int | None = None) -> Path:
    """A log of ``rounds`` with the datasets of a run: clients (label_hist with zeros),
    per-round metrics, a dense mixing matrix with zeros, a dataset written once."""
    g = np.random.default_rng(0)
    hist = g.integers(0, 3, (N, C)) * (g.random((N, C)) < 0.5)
    w = Writer(path, {"algorithm": "x", "n_ranks": 1}, {"cluster": np.arange(N) % 2, "label_hist": hist}, N,
               keep_rounds=keep)
    for t in rounds:
        mix = np.where(np.arange(N)[:, None] % 2 == np.arange(N) % 2, 2.0 / N, 0.0).astype(np.float32)
        w.write_round(t, {"wall_s": 1.0 + t}, {"metrics/test_acc": g.random(N), "metrics/skipped": np.zeros(N, int)},
                      mixing=Dense(mix), once={"x/once": g.random(20)} if t == 1 else None)
    w.close()
    return path


def _everything(path: Path) -> dict[str, np.ndarray]:
    run = open_run(path)
    out = {k: run.get(k) for k in run.keys()}
    out.update({f"mixing[{t}]": run.mixing(t) for t in range(run.n_rounds)})
    return out


def _zero_entry_offset(path: Path, key: str) -> int:
    """The file offset of a 0 in the first chunk of the int64 dataset ``key``."""
    with h5py.File(path, "r") as f:
        ds = f[key]
        assert ds.dtype == np.int64 and ds.fletcher32
        flat = ds[()].ravel()
        return ds.id.get_chunk_info(0).byte_offset + 8 * int(np.flatnonzero(flat == 0)[0])


def test_a_zero_read_as_minus_one_passes_fletcher32_and_fails_the_crc(tmp_path):
    path = _log(tmp_path / "run.h5")
    at = _zero_entry_offset(path, "clients/label_hist")
    data = bytearray(path.read_bytes())
    data[at:at + 8] = b"\xff" * 8  # every 16-bit word 0x0000 -> 0xFFFF: Fletcher-32's sums do not move
    bad = tmp_path / "bad.h5"
    bad.write_bytes(bytes(data))
    with h5py.File(bad, "r") as f:  # HDF5 alone reads it, silently
        assert (f["clients/label_hist"][()] == -1).sum() == 1
    with pytest.raises(Corrupt, match=r"^/clients/label_hist fails its CRC-32: the file changed"):
        open_run(bad).get("clients/label_hist")


@pytest.mark.slow  # a few hundred opens of the log
def test_a_scan_of_16_byte_flips_over_the_log_changes_nothing_silently(tmp_path):
    path = _log(tmp_path / "run.h5")
    good, data = _everything(path), path.read_bytes()
    bad = tmp_path / "bad.h5"
    silent, noticed = [], 0
    for at in range(0, len(data) - 16, max(16, len(data) // 400 // 16 * 16)):
        flipped = bytearray(data)
        flipped[at:at + 16] = bytes(b ^ 0xFF for b in flipped[at:at + 16])
        bad.write_bytes(bytes(flipped))
        try:
            got = _everything(bad)
        except Exception:  # noqa: BLE001 - noticed: Corrupt, or HDF5 refusing its own damaged metadata
            noticed += 1
            continue
        if got.keys() != good.keys() or any(not np.array_equal(got[k], good[k], equal_nan=True) for k in good):
            silent.append(at)
    assert silent == [], f"offsets whose flip changed a value without notice: {silent}"
    assert noticed > 0


def test_a_reopened_log_drops_its_sums_and_is_sealed_again_at_close(tmp_path):
    path = _log(tmp_path / "run.h5", range(3))
    with h5py.File(path, "r") as f:
        assert sums.ATTR in f["metrics/test_acc"].attrs and sums.ATTR in f["clients/label_hist"].attrs
    w = Writer(path, {"algorithm": "x", "n_ranks": 1}, {}, N, keep_rounds=2)  # resume after round 2
    with h5py.File(path, "r", locking=False) as f:  # committed by the cut: no stale sum on changed datasets
        assert not any(sums.ATTR in f[k].attrs for k in ("metrics/test_acc", "rounds/round", "graph/mixing"))
    w.write_round(2, {"wall_s": 3.0}, {"metrics/test_acc": np.full(N, 0.5), "metrics/skipped": np.zeros(N, int)})
    w.close()
    run = open_run(path)
    assert run.get("rounds/round").tolist() == [0, 1, 2] and run.get("metrics/test_acc")[2].tolist() == [0.5] * N
    with h5py.File(path, "r") as f:
        assert all(sums.intact(f[k]) and sums.ATTR in f[k].attrs for k in ("metrics/test_acc", "graph/mixing"))


def test_the_sums_kept_while_writing_are_those_of_the_bytes_read_back(tmp_path):
    """Rows a round did not write (zeros), flushes of several rounds, a resumed
    writer appending to an earlier one's rows, the compact mixing's lists."""
    path = tmp_path / "run.h5"
    for first, keep in ((0, None), (3, 3)):
        w = Writer(path, {"algorithm": "x", "n_ranks": 1}, {"cluster": np.arange(N) % 2}, N, dense_max=2,
                   flush_s=0.0 if first else 1e9, keep_rounds=keep)
        for t in range(first, first + 4):
            rows = {"metrics/test_acc": np.full(N, t / 10)}
            if t % 3 == 1:  # a dataset only some rounds write
                rows["x/sometimes"] = np.full((N, 2), t, np.int64)
            w.write_round(t, {"wall_s": 1.0}, rows, mixing=Dense(np.eye(N, dtype=np.float32)))
        w.close()
    with h5py.File(path, "r") as f:
        stored = {}
        f.visititems(lambda name, o: stored.update({name: int(o.attrs[sums.ATTR])})
                     if isinstance(o, h5py.Dataset) else None)
        assert stored == {name: sums.crc32(f[name]) for name in stored}
        assert f["x/sometimes"][()][:, 0, 0].tolist()[:5] == [0, 1, 0, 0, 4]
    assert open_run(path).get("rounds/round").tolist() == list(range(7))
