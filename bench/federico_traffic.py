"""Check a FedeRiCo run log's traffic against the plan: every round every client
receives exactly k models (pulled neighbours); its other model-sized traffic is
the weighted gradients pushed back to it, one per client that sampled it.

    python -m bench.federico_traffic results/<run>
"""

from __future__ import annotations

import sys

import numpy as np

from mpifl.logging.h5 import open_run


def main(path: str) -> int:
    r = open_run(path)
    P = int(r.attrs["n_params"])
    S = r.get("federico/neighbours")
    R, N, k = S.shape
    m, b, s = r.get("comm/models_recv"), r.get("comm/bytes_recv"), r.get("comm/bytes_sent")
    indeg = np.stack([np.bincount(S[t].ravel(), minlength=N) for t in range(R)])
    checks = {
        "models_recv == k, every round and client": (m == k).all(),
        "bytes_recv == (k + times sampled) * 4P": (b == (k + indeg) * 4 * P).all(),
        "bytes_sent == (k + times sampled) * 4P": (s == (k + indeg) * 4 * P).all(),
        f"sum of bytes_recv per round == 2 N k 4P = {2 * N * k * 4 * P}": (b.sum(1) == 2 * N * k * 4 * P).all(),
    }
    print(f"{path}: {r.attrs['n_ranks']} rank(s), {R} rounds, N={N}, k={k}, P={P} ({4 * P} bytes per model)")
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    print(f"  round 0 bytes_recv per client: {b[0].tolist()}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
