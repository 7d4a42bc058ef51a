"""Partitions: the pool's samples -> per-client index sets and true clusters.

Every partition is seeded (all draws from ``rng(seed, -1, GLOBAL, ...)``, so every
rank computes the same one), records each client's true cluster or domain (-1
where the notion does not apply), and never gives a sample to two clients.

========================  =====================================================
``iid``                   a uniform random split
``clusters``              K clusters with disjoint label sets; client c is in
                          cluster c % K (CIFAR-100 fine labels: by super-class)
``noisy_clusters``        clusters, plus with probability ``noisy_prob`` each
                          client also holds ``noisy_labels`` labels from outside
                          its cluster (pFedLIA Noisy Non-IID)
``permuted_clusters``     concept shift: an iid split, cluster c % K sees every
                          label through its own label permutation
``patho``                 ``classes_per_client`` distinct classes per client,
                          every class held by as many clients as possible (DPFL)
``dirichlet``             per class, proportions Dir(alpha) over clients, redrawn
                          until every client holds ``min_client_size`` samples
``domains``               client c in domain c % D, every client label-complete
                          (FedC2I); stand-in domains when the data has none
``feature_shift``         an iid split, client c sees domain c % K's input transform
``label_flip``            ``flip_base``'s split; a ``flip_frac`` of clients sees a
                          fixed label permutation (DPFL robustness)
========================  =====================================================

Label-sharded partitions (clusters, noisy_clusters, patho) share each label's
samples out evenly among the clients holding it, as pFedLIA's "sharded per label
into equal sizes" describes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mpifl.errors import ConfigError
from mpifl.rng import GLOBAL, rng
from mpifl.schema import DataConfig


@dataclass
class Partition:
    parts: list[np.ndarray]  # per client: indices into the pool
    cluster: np.ndarray  # [N] true cluster / domain, -1 when none
    # per-client views of the data (feature shift, label flips): (client, array) -> array
    x_fn: Callable[[int, np.ndarray], np.ndarray] | None = None
    y_fn: Callable[[int, np.ndarray], np.ndarray] | None = None


@dataclass
class PoolInfo:
    """What some partitions need beyond the labels (rows match ``y``)."""

    domain: np.ndarray | None = None  # [n] source domain of each sample
    class_groups: np.ndarray | None = None  # [n_classes] super-class of each class
    dataset: str = ""  # data.name, for defaults that depend on it


def _need_clusters(k: int, n: int) -> None:
    if k > n:
        raise ConfigError(f"data.n_clusters={k} is not allowed; must be <= data.n_clients ({n})")


def iid(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int, info: PoolInfo | None = None) -> Partition:
    perm = rng(seed, -1, GLOBAL, "partition").permutation(len(y))
    return Partition([np.sort(p) for p in np.array_split(perm, cfg.n_clients)], np.full(cfg.n_clients, -1))


def label_groups(n_classes: int, k: int, seed: int, class_groups: np.ndarray | None = None,
                 ordered: bool = False) -> list[np.ndarray]:
    """Split the labels into k disjoint groups of near-equal size, seeded (or in
    label order, ``ordered``); with ``class_groups`` whole super-classes go to a
    group (CIFAR-100, pFedLIA)."""
    def order(n: int) -> np.ndarray:
        return np.arange(n) if ordered else rng(seed, -1, GLOBAL, "label_groups").permutation(n)

    if class_groups is None:
        return [np.sort(g) for g in np.array_split(order(n_classes), k)]
    supers = order(int(class_groups.max()) + 1)
    return [np.flatnonzero(np.isin(class_groups, g)) for g in np.array_split(supers, k)]


def _check_k(k: int, n_classes: int, cfg: DataConfig, info: PoolInfo | None) -> np.ndarray | None:
    groups = info.class_groups if info is not None else None
    if groups is not None:
        n_super = int(groups.max()) + 1
        if k > n_super:
            raise ConfigError(f"data.n_clusters={k} is not allowed with data.name={cfg.name!r} and "
                              f"data.partition={cfg.partition!r}: clusters are made of whole super-classes, "
                              f"so at most {n_super} clusters")
    elif k > n_classes:
        raise ConfigError(f"data.n_clusters={k} is not allowed with data.name={cfg.name!r} and "
                          f"data.partition={cfg.partition!r}: clusters need disjoint label sets, "
                          f"so at most {n_classes} clusters")
    _need_clusters(k, cfg.n_clients)
    return groups


def _shard(y: np.ndarray, holders: list[list[int]], n: int, g: np.random.Generator) -> list[np.ndarray]:
    """Each label's samples split evenly (shuffled) among the clients holding it."""
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for label, who in enumerate(holders):
        if not who:
            continue
        pool = g.permutation(np.flatnonzero(y == label))
        for m, part in zip(who, np.array_split(pool, len(who))):
            parts[m].append(part)
    return [np.sort(np.concatenate(p)) if p else np.empty(0, np.int64) for p in parts]


def _cluster_labels(n_classes: int, cfg: DataConfig, seed: int, info: PoolInfo | None):
    k, n = cfg.n_clusters, cfg.n_clients
    groups = _check_k(k, n_classes, cfg, info)
    label_sets = label_groups(n_classes, k, seed, groups, ordered=cfg.cluster_labels == "ordered")
    cluster_of = np.arange(n) % k
    return label_sets, cluster_of


def clusters(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int, info: PoolInfo | None = None) -> Partition:
    """K clusters with disjoint label sets; client c belongs to cluster c % K, and
    the samples of a cluster's labels are shared out evenly among its clients."""
    label_sets, cluster_of = _cluster_labels(n_classes, cfg, seed, info)
    holders = [[] for _ in range(n_classes)]
    for c, labels in enumerate(label_sets):
        for label in labels:
            holders[label] = list(np.flatnonzero(cluster_of == c))
    parts = _shard(y, holders, cfg.n_clients, rng(seed, -1, GLOBAL, "partition"))
    return Partition(parts, cluster_of)


def noisy_labels(cfg: DataConfig, info: PoolInfo | None) -> int:
    """Extra labels a noisy client gets: data.noisy_labels, else pFedLIA's 1 (5 on CIFAR-100)."""
    if cfg.noisy_labels:
        return cfg.noisy_labels
    return 5 if info is not None and info.class_groups is not None else 1


def noisy_clusters(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int,
                   info: PoolInfo | None = None) -> Partition:
    """clusters + with probability ``noisy_prob`` a client also holds
    ``noisy_labels`` random labels from outside its cluster (pFedLIA)."""
    label_sets, cluster_of = _cluster_labels(n_classes, cfg, seed, info)
    extra = noisy_labels(cfg, info)
    n = cfg.n_clients
    holders: list[list[int]] = [[] for _ in range(n_classes)]
    for c, labels in enumerate(label_sets):
        for label in labels:
            holders[label] += list(np.flatnonzero(cluster_of == c))
    for i in range(n):
        g = rng(seed, -1, i, "noisy_labels")
        outside = np.setdiff1d(np.arange(n_classes), label_sets[cluster_of[i]])
        if g.random() < cfg.noisy_prob and len(outside):
            for label in g.choice(outside, min(extra, len(outside)), replace=False):
                holders[label].append(i)
    parts = _shard(y, [sorted(h) for h in holders], n, rng(seed, -1, GLOBAL, "partition"))
    return Partition(parts, cluster_of)


def label_permutations(n_classes: int, k: int, seed: int) -> np.ndarray:
    """``[k, C]``: cluster 0 sees the true labels, cluster j > 0 a seeded
    permutation with no fixed point (every label means something else)."""
    perms = np.empty((k, n_classes), np.int64)
    perms[0] = np.arange(n_classes)
    for j in range(1, k):
        g = rng(seed, -1, j, "label_permutation")
        shift = np.roll(np.arange(n_classes), -1)  # a derangement, relabelled at random
        order = g.permutation(n_classes)
        perms[j][order] = order[shift]
    return perms


def permuted_clusters(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int,
                      info: PoolInfo | None = None) -> Partition:
    """Concept shift: an iid split; cluster c % K sees every label through its own
    label permutation, so clusters disagree on what each input means."""
    k, n = cfg.n_clusters, cfg.n_clients
    _need_clusters(k, n)
    if n_classes < 2 and k > 1:
        raise ConfigError(f"data.partition={cfg.partition!r} needs at least 2 classes")
    parts = iid(y, n_classes, cfg, seed).parts
    cluster_of = np.arange(n) % k
    perms = label_permutations(n_classes, k, seed)
    return Partition(parts, cluster_of, y_fn=lambda c, labels: perms[cluster_of[c]][labels])


def patho_classes(n: int, n_classes: int, s: int, seed: int) -> list[np.ndarray]:
    """Each client's ``s`` distinct classes, every class used by as many
    clients as the others (+-1): a client takes the least-used classes, ties at random."""
    g = rng(seed, -1, GLOBAL, "patho")
    used = np.zeros(n_classes, np.int64)
    out = []
    for _ in range(n):
        key = used + g.random(n_classes)  # random tie-break below one use
        chosen = np.sort(np.argsort(key)[:s])
        used[chosen] += 1
        out.append(chosen)
    return out


def patho(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int, info: PoolInfo | None = None) -> Partition:
    """DPFL Patho(s): every client holds ``classes_per_client`` classes."""
    s, n = cfg.classes_per_client, cfg.n_clients
    if s > n_classes:
        raise ConfigError(f"data.classes_per_client={s} is not allowed with data.name={cfg.name!r}: "
                          f"it has {n_classes} classes")
    holders: list[list[int]] = [[] for _ in range(n_classes)]
    for i, classes in enumerate(patho_classes(n, n_classes, s, seed)):
        for c in classes:
            holders[c].append(i)
    parts = _shard(y, holders, n, rng(seed, -1, GLOBAL, "partition"))
    return Partition(parts, np.full(n, -1))


def dirichlet(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int, info: PoolInfo | None = None) -> Partition:
    """Per class c, proportions q_c ~ Dir(alpha) over the N clients (DPFL Dir(0.1));
    the whole draw is repeated until every client holds ``min_client_size`` samples."""
    n, alpha, need = cfg.n_clients, cfg.dirichlet_alpha, cfg.min_client_size
    if need * n > len(y):
        raise ConfigError(f"data.min_client_size={need} is not allowed with data.n_clients={n}: "
                          f"the data has only {len(y)} samples to share out")
    g = rng(seed, -1, GLOBAL, "partition")
    by_class = [np.flatnonzero(y == c) for c in range(n_classes)]
    for _ in range(1000):
        parts: list[list[np.ndarray]] = [[] for _ in range(n)]
        for idx in by_class:
            idx = g.permutation(idx)
            q = g.dirichlet(np.full(n, alpha))
            cuts = (np.cumsum(q)[:-1] * len(idx)).astype(np.int64)
            for i, part in enumerate(np.split(idx, cuts)):
                parts[i].append(part)
        sizes = np.array([sum(len(p) for p in ps) for ps in parts])
        if sizes.min() >= need:
            break
    else:
        raise ConfigError(f"data.min_client_size={need} is not reached with data.dirichlet_alpha={alpha} and "
                          f"data.n_clients={n} in 1000 draws; lower it or raise data.dirichlet_alpha")
    out = [np.sort(np.concatenate(p)) for p in parts]
    return Partition(out, np.full(n, -1))


def _domain_transform(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Domain k's view of inputs: the same labels seen through a different input
    transform (a stand-in for Digit-5's domains when they are not on disk)."""
    if k == 0:
        return x
    flat = x.reshape(len(x), -1) if x.ndim > 1 else x
    image = x.ndim >= 3  # [n, C, H, W]
    kind = (k - 1) % 4
    if kind == 0:  # mirror (images) / time reversal (signals)
        out = x[..., ::-1] if image else x[:, ::-1]
    elif kind == 1:  # inversion
        out = flat.max() + flat.min() - flat
    elif kind == 2:  # additive noise, fixed per domain
        out = flat + np.random.default_rng([seed, 17, k]).normal(0, 0.5 * flat.std(), flat.shape)
    else:  # blur: moving average along the last axis
        out = (x + np.roll(x, 1, -1) + np.roll(x, -1, -1)) / 3.0
    intensity = 1.0 + 0.1 * ((k - 1) // 4)  # domains past the fourth rescale too
    return (np.ascontiguousarray(out).reshape(x.shape) * intensity).astype(np.float32)


def feature_shift(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int,
                  info: PoolInfo | None = None) -> Partition:
    """K domains share all labels; client c is in domain c % K and sees its
    samples through domain c % K's input transform."""
    k, n = cfg.n_clusters, cfg.n_clients
    _need_clusters(k, n)
    perm = rng(seed, -1, GLOBAL, "partition").permutation(len(y))
    cluster_of = np.arange(n) % k
    parts = [np.sort(p) for p in np.array_split(perm, n)]
    return Partition(parts, cluster_of, x_fn=lambda c, x: _domain_transform(x, int(cluster_of[c]), seed))


def domains(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int, info: PoolInfo | None = None) -> Partition:
    """FedC2I: client c belongs to domain c % D and holds an even share of every
    class of that domain (label-complete clients). A dataset without recorded
    domains gets ``n_clusters`` stand-in domains (feature_shift's transforms)."""
    n = cfg.n_clients
    dom = info.domain if info is not None else None
    stand_in = dom is None
    if stand_in:
        d = cfg.n_clusters
        _need_clusters(d, n)
    else:
        d = int(dom.max()) + 1
        if d > n:
            raise ConfigError(f"data.n_clients={n} is not allowed with data.name={cfg.name!r} and "
                              f"data.partition='domains': it has {d} domains, one client each at least")
    cluster_of = np.arange(n) % d
    g = rng(seed, -1, GLOBAL, "partition")
    if stand_in:  # the stand-in domains are views of one pool: share every class over all clients
        groups = [(np.arange(n), np.ones(len(y), bool))]
    else:
        groups = [(np.flatnonzero(cluster_of == k), dom == k) for k in range(d)]
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for members, in_domain in groups:
        for c in range(n_classes):
            pool = g.permutation(np.flatnonzero((y == c) & in_domain))
            for m, part in zip(members, np.array_split(pool, len(members))):
                parts[m].append(part)
    out = [np.sort(np.concatenate(p)) if p else np.empty(0, np.int64) for p in parts]
    x_fn = (lambda c, x: _domain_transform(x, int(cluster_of[c]), seed)) if stand_in else None
    return Partition(out, cluster_of, x_fn=x_fn)


def label_flip(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int, info: PoolInfo | None = None) -> Partition:
    """``flip_base``'s split; ``round(flip_frac * N)`` seeded clients see every
    label through one fixed permutation with no fixed point (DPFL's malicious
    clients). Cluster: the base cluster (0 when it has none), + K if flipped."""
    base = PARTITIONS[cfg.flip_base](y, n_classes, cfg, seed, info)
    n = cfg.n_clients
    m = int(np.floor(cfg.flip_frac * n + 0.5))
    flipped = np.zeros(n, bool)
    flipped[rng(seed, -1, GLOBAL, "label_flip").choice(n, m, replace=False)] = True
    perm = label_permutations(n_classes, 2, seed + 1)[1]
    base_cluster = np.maximum(base.cluster, 0)
    cluster = base_cluster + (int(base_cluster.max()) + 1) * flipped
    base_y = base.y_fn

    def y_fn(c: int, labels: np.ndarray) -> np.ndarray:
        labels = labels if base_y is None else base_y(c, labels)
        return perm[labels] if flipped[c] else labels

    return Partition(base.parts, cluster, x_fn=base.x_fn, y_fn=y_fn)


PARTITIONS = {"iid": iid, "clusters": clusters, "noisy_clusters": noisy_clusters,
              "permuted_clusters": permuted_clusters, "patho": patho, "dirichlet": dirichlet,
              "domains": domains, "feature_shift": feature_shift, "label_flip": label_flip}


def partition(y: np.ndarray, n_classes: int, cfg: DataConfig, seed: int, info: PoolInfo | None = None) -> Partition:
    return PARTITIONS[cfg.partition](y, n_classes, cfg, seed, info)
