"""FedeRiCo against FedAvg and Local on built-in data, 8 clients in 2/3/4 label
groups, several seeds: runs ``python -m mpifl.main`` per cell (skipping complete
runs) and prints the markdown table recorded in docs/reproductions/federico.md.

    python -m bench.federico_groups jobs/federico-digits.yaml --seeds 0 1 2 --ranks 1

Reported per cell: mean over seeds (± std over seeds) of the final round's test
accuracy averaged over clients, and for FedeRiCo the weight a client puts on the
clients of its own true group at the last round (mean over clients and seeds),
and, since a model may end up serving another group than its owner's, the weight
on the models of its group, a model belonging to the group whose clients put the
most weight on it in total (the same mean).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

from mpifl.logging.h5 import open_run

ALGOS = ("fedavg", "local", "federico")


def run_dir(out: Path, stem: str, g: int, s: int, algo: str) -> Path:
    return out / f"{stem}-g{g}-s{s}-{algo}"


def complete(path: Path, rounds: int) -> bool:
    try:
        return open_run(path).n_rounds == rounds
    except (FileNotFoundError, OSError, KeyError):
        return False


def own_group_weight(path: Path) -> float:
    r = open_run(path)
    w = r.get("federico/client_weights")[-1]
    cl = r.get("clients/cluster")
    return float((w * (cl[:, None] == cl[None, :])).sum(1).mean())


def own_group_model_weight(path: Path) -> float:
    r = open_run(path)
    w = r.get("federico/client_weights")[-1]
    cl = r.get("clients/cluster")
    groups = np.unique(cl)
    model_group = groups[np.argmax([w[cl == g].sum(0) for g in groups], axis=0)]  # [N]
    return float((w * (cl[:, None] == model_group[None, :])).sum(1).mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--groups", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--out", default="results")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("overrides", nargs="*", help="section.key=value for every run")
    a = ap.parse_args()
    import yaml

    cfg = yaml.safe_load(Path(a.config).read_text())
    rounds = a.rounds or cfg["run"]["rounds"]
    stem = cfg["run"]["name"]
    out = Path(a.out)
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    for g in a.groups:
        for s in a.seeds:
            for algo in ALGOS:
                d = run_dir(out, stem, g, s, algo)
                if complete(d, rounds):
                    continue
                cmd = [sys.executable, "-m", "mpifl.main", a.config, f"data.n_clusters={g}", f"run.seed={s}",
                       f"algorithm.name={algo}", f"run.name={d.name}", f"run.out_dir={out}", f"run.rounds={rounds}",
                       "run.threads=1", *a.overrides]
                if a.ranks > 1:
                    cmd = [mpiexec, "-n", str(a.ranks), *cmd]
                print("$", " ".join(cmd), flush=True)
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)

    print(f"\n{stem}: final-round test accuracy (%), mean over clients; mean ± std over seeds {a.seeds}; "
          f"{rounds} rounds\n")
    print("| groups | FedAvg | Local | FedeRiCo | FedeRiCo own-group weight | weight on own group's models |")
    print("|---|---|---|---|---|---|")
    for g in a.groups:
        cells = []
        for algo in ALGOS:
            accs = [100 * np.nanmean(open_run(run_dir(out, stem, g, s, algo)).metric("test_acc")[-1])
                    for s in a.seeds]
            cells.append(f"{np.mean(accs):.2f} ± {np.std(accs):.2f}")
        wg = [own_group_weight(run_dir(out, stem, g, s, "federico")) for s in a.seeds]
        cells.append(f"{np.mean(wg):.3f} (min seed {np.min(wg):.3f})")
        wm = [own_group_model_weight(run_dir(out, stem, g, s, "federico")) for s in a.seeds]
        cells.append(f"{np.mean(wm):.3f} (min seed {np.min(wm):.3f})")
        print(f"| {g} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
