"""Where FedeRiCo's weight goes in the room sweep: per cell, the last round's
``/federico/client_weights`` split into the client itself, its group-mates and the
other groups, and the share of its sampled ``/federico/neighbours`` in its own group
(mean over clients and seeds). docs/reproductions/federico.md, "Where collaboration
must pay".

    python bench/room_weights.py results/room-seeds
"""

from __future__ import annotations

import argparse
import glob
from pathlib import Path

import numpy as np

from mpifl.logging.h5 import open_run


def shares(log: Path) -> tuple[float, float, float, float]:
    """(self, group-mates, other groups, neighbours in own group) of one run's last round."""
    r = open_run(log)
    cl = r.get("clients/cluster")
    w = np.asarray(r.get("federico/client_weights")[-1], float)
    nb = np.asarray(r.get("federico/neighbours")[-1])
    same = cl[:, None] == cl[None, :]
    eye = np.eye(len(cl), dtype=bool)
    own = np.mean([np.mean(cl[row[row >= 0]] == cl[i]) for i, row in enumerate(nb)])
    return (float(np.diag(w).mean()), float((w * (same & ~eye)).sum(1).mean()), float((w * ~same).sum(1).mean()),
            float(own))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path, help="the room-seeds sweep directory")
    a = ap.parse_args()
    print("| clients | samples | self | group-mates | other groups | neighbours in own group | runs |")
    print("|---|---|---|---|---|---|---|")
    for n in (8, 20, 100):
        for tpc in (10, 50, 400):
            pattern = f"runs/*federico_n_clients-{n}_train_per_client-{tpc}_seed-*/run.h5"
            logs = sorted(glob.glob(str(a.sweep / pattern)))
            if logs:
                m = np.mean([shares(Path(p)) for p in logs], axis=0)
                print(f"| {n} | {tpc} | {m[0]:.2f} | {m[1]:.2f} | {m[2]:.2f} | {m[3]:.2f} | {len(logs)} |")


if __name__ == "__main__":
    main()
