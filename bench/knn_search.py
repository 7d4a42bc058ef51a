"""kNN-Per's neighbour search: ``torch.cdist`` + ``topk`` batched over a rank's
clients (what ``mpifl.algorithms.knn_per`` runs) against scikit-learn's
``NearestNeighbors`` fitted per client, on the same embeddings.

    python bench/knn_search.py                 # a few datastore sizes, 1 thread
    python bench/knn_search.py --threads 2 --clients 100 --train 500 --queries 100

Both are exact searches; the script checks they return the same neighbour
distances, then prints the median time of one full search (every client's
queries against its own datastore) over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
from sklearn.neighbors import NearestNeighbors

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def torch_search(store: torch.Tensor, query: torch.Tensor, k: int) -> torch.Tensor:
    """[m, b, k] squared distances of the k nearest entries (mpifl's kNN-Per path)."""
    d2 = torch.cdist(query, store).square_()
    return torch.topk(d2, k, dim=-1, largest=False).values


def sklearn_search(store: np.ndarray, query: np.ndarray, k: int, algorithm: str) -> np.ndarray:
    out = []
    for s, q in zip(store, query):
        nn = NearestNeighbors(n_neighbors=k, algorithm=algorithm).fit(s)
        dist, _ = nn.kneighbors(q)
        out.append(dist ** 2)
    return np.stack(out)


def timed(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    ap.add_argument("--train", type=int, nargs="+", default=[60, 500])
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--dim", type=int, default=128, help="embedding width (digits MLP [128, 128]: 128)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    print(f"# load average {os.getloadavg()[0]:.2f}, {a.threads} thread(s), d={a.dim}, k={a.k}, "
          f"{a.queries} queries/client; median of {a.repeat}")
    print("| clients | train/client | torch cdist+topk | sklearn brute | sklearn kd_tree | sklearn auto |")
    print("|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for m in a.clients:
        for n in a.train:
            store = torch.randn(m, n, a.dim, generator=gen).relu_()  # ReLU features, as the body's
            query = torch.randn(m, a.queries, a.dim, generator=gen).relu_()
            ref = torch_search(store, query, a.k).numpy()
            s_np, q_np = store.numpy().astype(np.float64), query.numpy().astype(np.float64)
            row = [timed(lambda s=store, q=query: torch_search(s, q, a.k), a.repeat)]
            for algo in ("brute", "kd_tree", "auto"):
                got = sklearn_search(s_np, q_np, a.k, algo)
                assert np.allclose(got, ref, rtol=1e-3, atol=1e-3), algo
                row.append(timed(lambda algo=algo, s=s_np, q=q_np: sklearn_search(s, q, a.k, algo), a.repeat))
            print(f"| {m} | {n} | " + " | ".join(f"{1e3 * t:.1f} ms" for t in row) + " |", flush=True)


if __name__ == "__main__":
    main()
