"""Where a method's weight goes in the room sweep: per cell, the last round's
weights split into the client itself, its group-mates and the other groups, and the
share of the clients it chose in its own group (mean over clients and seeds).
FedeRiCo: ``/federico/client_weights`` and its sampled ``/federico/neighbours``;
DPFL: the mixing matrix ``/graph/mixing`` (its aggregation weights over the graph)
and ``/dpfl/collaborators``; FedC2I: ``/graph/mixing``, its client-level influence
vectors a_i (it weighs every client, so it has no chosen set); FedFomo (a baseline):
``/graph/mixing`` (row i: its weights w_i over the M candidates it downloaded, or e_i where
none helped) and ``/fedfomo/candidates``.
docs/reproductions/federico.md, dpfl.md and fedc2i.md, "Where collaboration must pay";
docs/reproductions/room.md, "The baselines".

    python bench/room_weights.py results/room-seeds
    python bench/room_weights.py results/room-seeds --method dpfl
    python bench/room_weights.py results/room-seeds --method fedc2i
    python bench/room_weights.py results/room-baselines --method fedfomo
"""

from __future__ import annotations

import argparse
import glob
from pathlib import Path

import numpy as np

from mpifl.logging.h5 import open_run


def shares(log: Path, method: str = "federico") -> tuple[float, float, float, float]:
    """(self, group-mates, other groups, chosen clients in own group) of one run's last round."""
    r = open_run(log)
    cl = r.get("clients/cluster")
    if method == "federico":
        w = np.asarray(r.get("federico/client_weights")[-1], float)
        chosen = [row[row >= 0] for row in np.asarray(r.get("federico/neighbours")[-1])]
    elif method == "dpfl":  # a client averages the models of the collaborators its graph gives it
        w = np.asarray(r.get("graph/mixing")[-1], float)
        chosen = [np.flatnonzero(row) for row in np.asarray(r.get("dpfl/collaborators")[-1])]
    elif method == "fedfomo":  # its weights over the M models it downloaded this round
        w = np.asarray(r.get("graph/mixing")[-1], float)
        chosen = [row[row >= 0] for row in np.asarray(r.get("fedfomo/candidates")[-1])]
    else:  # FedC2I: every client weighed by its influence a_i[j]; no set is chosen
        w = np.asarray(r.get("graph/mixing")[-1], float)
        chosen = []
    same = cl[:, None] == cl[None, :]
    eye = np.eye(len(cl), dtype=bool)
    # a client that chose nobody (DPFL may leave a client alone) has no share: left out
    own = (np.nanmean([np.mean(cl[c] == cl[i]) if len(c) else np.nan for i, c in enumerate(chosen)])
           if chosen else np.nan)
    return (float(np.diag(w).mean()), float((w * (same & ~eye)).sum(1).mean()), float((w * ~same).sum(1).mean()),
            float(own))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path, help="the room-seeds (or room-baselines) sweep directory")
    ap.add_argument("--method", choices=("federico", "dpfl", "fedc2i", "fedfomo"), default="federico")
    a = ap.parse_args()
    chosen = {"federico": "neighbours", "dpfl": "collaborators", "fedfomo": "candidates"}.get(a.method, "chosen")
    print(f"| clients | samples | self | group-mates | other groups | {chosen} in own group | runs |")
    print("|---|---|---|---|---|---|---|")
    for n in (8, 20, 100):
        for tpc in (10, 50, 400):
            pattern = f"runs/*algorithm-{a.method}_n_clients-{n}_train_per_client-{tpc}_seed-*/run.h5"
            logs = sorted(glob.glob(str(a.sweep / pattern)))
            if logs:
                m = np.mean([shares(Path(p), a.method) for p in logs], axis=0)
                own = "-" if np.isnan(m[3]) else f"{m[3]:.2f}"
                print(f"| {n} | {tpc} | {m[0]:.2f} | {m[1]:.2f} | {m[2]:.2f} | {own} | {len(logs)} |")


if __name__ == "__main__":
    main()
