"""pFedLIA pieces serially: clustering helpers, the noisy_clusters partition,
config checks, and an end-to-end run on tiny synthetic data.

Bits: the exact comparisons are of collaborator masks and cluster labels (booleans,
integers) only."""

import h5py
import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from mpifl.algorithms.pfedlia import _set_labels, optics_clusters, two_means
from mpifl.comm import world
from mpifl.config import from_dict
from mpifl.data import build as build_data
from mpifl.data.partition import label_groups
from mpifl.errors import ConfigError
from mpifl.run.runtime import run


def _block_influence(truth: np.ndarray, seed: int) -> np.ndarray:
    """Rows like LIA's: positive for same-cluster columns, negative elsewhere, noisy."""
    g = np.random.default_rng(seed)
    same = truth[:, None] == truth[None, :]
    return np.where(same, 60.0, -140.0) + g.normal(0, 10, same.shape)


def test_optics_recovers_blocks_and_noise_becomes_singletons():
    truth = np.repeat(np.arange(4), 6)
    I = _block_influence(truth, 0)
    labels = optics_clusters(I, min_samples=2, xi=0.7, metric="euclidean")
    assert adjusted_rand_score(truth, labels) == 1.0
    assert labels[0] == 0 and set(labels) == set(range(labels.max() + 1))  # numbered by first appearance
    odd = np.vstack([I, np.full((1, I.shape[1]), 500.0)])  # a row far from every other
    labels = optics_clusters(np.hstack([odd, np.zeros((len(odd), 1))]), min_samples=2, xi=0.7, metric="euclidean")
    assert np.sum(labels == labels[-1]) == 1


def test_two_means_takes_the_high_group_and_always_self():
    row = np.array([50.0, 55.0, -100.0, -120.0, -110.0, 60.0])
    mask, inside = two_means(row, 0, seed=1)
    np.testing.assert_array_equal(mask, [True, True, False, False, False, True])
    assert inside
    mask, inside = two_means(row, 2, seed=1)  # client 2 scored itself low: added, reported
    assert mask[2] and mask[0] and not inside


def test_set_labels_groups_equal_collaborator_sets():
    c = np.array([[1, 1, 0], [1, 1, 0], [0, 1, 1]], bool)
    np.testing.assert_array_equal(_set_labels(c), [0, 0, 1])


def test_noisy_clusters_adds_one_outside_label_to_about_half():
    cfg = from_dict({"data": {"name": "synthetic", "partition": "noisy_clusters", "n_clients": 40,
                              "n_clusters": 5, "n_samples": 8000}})
    d = build_data(cfg.data, 0, np.arange(40))
    groups = label_groups(10, 5, 0)
    extra = []
    for c in range(40):
        labels = set(np.flatnonzero(d.label_hist[c]))
        own = set(groups[d.cluster[c]])
        assert own <= labels
        extra.append(len(labels - own))
    assert set(extra) <= {0, 1}
    assert 10 <= sum(extra) <= 30  # probability 0.5 over 40 clients
    clean = from_dict({"data": {**cfg.to_dict()["data"], "partition": "clusters"}})
    np.testing.assert_array_equal(d.cluster, build_data(clean.data, 0, np.arange(40)).cluster)


@pytest.mark.parametrize("key,value", [("pfedlia.mode", "ring"), ("pfedlia.fraction", 0.0),
                                       ("pfedlia.min_samples", 1), ("pfedlia.warmup_rounds", 30),
                                       ("pfedlia.lia_epochs", 0), ("pfedlia.xi", 1.0),
                                       ("pfedlia.metric", "manhattan")])
def test_bad_pfedlia_config_names_the_key(key, value):
    section, leaf = key.split(".")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        from_dict({"algorithm": {"name": "pfedlia"}, "run": {"rounds": 30}, section: {leaf: value}})


@pytest.mark.parametrize("mode", ["central", "p2p"])
def test_end_to_end_clusters_and_logs(tmp_path, mode):
    cfg = from_dict({
        "run": {"seed": 1, "rounds": 8, "threads": 1, "out_dir": str(tmp_path), "name": mode},
        "data": {"name": "synthetic", "partition": "clusters", "n_clients": 12, "n_clusters": 3, "n_samples": 2400},
        "model": {"hidden": [32]},
        "algorithm": {"name": "pfedlia"},
        "pfedlia": {"mode": mode, "warmup_rounds": 4, "fraction": 0.5, "lia_epochs": 10, "lia_batch": 32},
    })
    log = run(cfg, world().Split(world().Get_rank()))
    with h5py.File(log) as f:
        truth = f["clients/cluster"][:]
        assert f["lia/influence"].shape == (12, 12) and f["lia/influence"].attrs["round"] == 4
        assert f.attrs["lia_ari"] == 1.0  # three well separated blob clusters
        if mode == "central":
            assert adjusted_rand_score(truth, f["lia/cluster"][:]) == 1.0
        else:
            np.testing.assert_array_equal(f["lia/collaborators"][:], truth[:, None] == truth[None, :])
        assert f["graph/mixing"].shape == (8, 12, 12)
        assert f.attrs["lia_bytes"] > 0 and f.attrs["lia_seconds"] > 0


@pytest.mark.parametrize("metric", ["cosine", "correlation"])
def test_scale_free_metric_clusters_rows_by_shape_not_size(metric):
    # Eq. 1 sums over D_i^val, so a client with three times the validation data has
    # a row about three times as large: euclidean groups by size, cosine by shape
    truth = np.repeat(np.arange(3), 8)
    scale = np.tile([1.0, 3.0], 12)[:, None]
    I = _block_influence(truth, 2) * scale
    assert adjusted_rand_score(truth, optics_clusters(I, 2, 0.7, metric)) == 1.0
    assert adjusted_rand_score(truth, optics_clusters(I, 2, 0.7, "euclidean")) < 1.0
