"""Per-round time and peak memory of FedAvg, Local and each seed method against the
number of clients N, the growth fitted to them (N, N log N or N^2), a figure, and
the largest N each method runs at within a round time limit. A measurement for
Performance V (bench/README.md), not a test.

    python bench/cost_vs_n.py --clients 100 1000 10000 --ranks 2 --out /tmp/cost
    python bench/cost_vs_n.py --plot /tmp/cost/cost.json --figure docs/figures/cost_vs_n.png

Setting: the room's model and optimizer (MLP 784-64-10, Adam lr 1e-3, batch 20,
one local epoch a round) on ``synthetic`` data of the same shape (784 inputs, 10
classes, 4 clusters), ``--samples`` samples a client (60% train, 20% val, 20%
test) whatever N, so a point's data grows with N alone; each method at its
defaults but DPFL at the room's one local epoch (``tau_init``, ``tau_train`` 1) and
the budget ``--dpfl-budget`` (0.1N: the paper's setting; with inf its round 0 is
N^2 pairs), pFedLIA with one warm-up round (its LIA round is round 2). Each point
is ``mpiexec -n RANKS python -m mpifl.main``, one thread a rank, ``--rounds``
rounds, evaluation in the last; times are the log's ``/rounds/wall_s`` (max over
ranks), memory the largest rank's peak resident set (``os.wait4``'s ru_maxrss).

A point whose fitted time a round (or first round) would pass ``--limit`` seconds,
or whose peak memory extrapolated linearly would pass 60% of the memory available,
is not run (the line says which), and one that passes the time is stopped; the
largest N a method reaches is where its fit meets the limit, or the largest N run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from max_clients import available_bytes  # noqa: E402 - bench/ is not a package

from mpifl.logging.h5 import open_run  # noqa: E402 - after the sys.path line

METHODS = {
    "fedavg": [], "local": [], "federico": [], "fedc2i": [],
    "pfedlia": ["pfedlia.warmup_rounds=1", "pfedlia.fraction=1.0"],
    "dpfl": ["dpfl.tau_init=1", "dpfl.tau_train=1"],
}
GROWTH = {"N": lambda n: n, "N log N": lambda n: n * np.log(n), "N^2": lambda n: n * n}


def point(method: str, n: int, a, out: Path) -> dict:
    """One run: its rounds' seconds, peak RSS of the largest rank, or why it stopped."""
    args = ["data.name=synthetic", f"data.n_samples={a.samples * n}", "data.synthetic_dim=784",
            "data.n_clusters=4", f"data.n_clients={n}", "data.val_frac=0.2", "data.test_frac=0.2",
            "model.name=mlp", "model.hidden=[64]", "train.optimizer=adam", "train.lr=0.001", "train.batch_size=20",
            "train.local_epochs=1", f"algorithm.name={method}", f"run.rounds={a.rounds}", "run.threads=1",
            f"run.eval_every={a.rounds}", "run.checkpoint_every=0", "run.keep_final_checkpoint=false",
            f"run.out_dir={out}", f"run.name={method}-{n}", *METHODS[method],
            *([f"dpfl.budget={a.dpfl_budget}"] if method == "dpfl" else [])]
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(a.ranks), sys.executable, "-m", "mpifl.main", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    limit = a.limit * a.rounds + 120  # every round at the limit, and the start
    status, usage, stopped = None, None, False
    while status is None:
        pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            status, usage = st, ru
            break
        if time.perf_counter() - t0 > limit:
            os.killpg(proc.pid, signal.SIGKILL)
            stopped = True
        time.sleep(0.5)
    wall = time.perf_counter() - t0
    rec = {"method": method, "N": n, "process_s": round(wall, 1), "peak_rss_gib": round(usage.ru_maxrss / 2**20, 3)}
    if stopped or os.waitstatus_to_exitcode(status) != 0:
        rec["stopped"] = "time limit" if stopped else proc.stderr.read()[-500:]
        return rec
    rec["round_s"] = [round(float(x), 3) for x in open_run(out / f"{method}-{n}").get("rounds/wall_s")]
    return rec


def typical(rec: dict) -> float:
    """The round a method's growth is fitted on: pFedLIA's LIA round (round 2, the
    one-off N^2 step; its others are FedAvg's), else the median of the rounds after
    the first (DPFL's first is its BGGC, reported in its own column)."""
    if rec["method"] == "pfedlia":
        return rec["round_s"][1]
    return float(np.median(rec["round_s"][1:])) if len(rec["round_s"]) > 1 else rec["round_s"][0]


def fit(ns: list[int], ts: list[float]) -> tuple[str, float, float]:
    """The growth among GROWTH whose one-constant fit t = c f(N) has the smallest
    squared error in log t; (name, c, the log-log slope of the points)."""
    ns_, ts_ = np.asarray(ns, float), np.asarray(ts, float)
    best = None
    for name, f in GROWTH.items():
        c = float(np.exp(np.mean(np.log(ts_) - np.log(f(ns_)))))
        err = float(np.sum((np.log(ts_) - np.log(c * f(ns_))) ** 2))
        if best is None or err < best[3]:
            best = (name, c, 0.0, err)
    slope = float(np.polyfit(np.log(ns_), np.log(ts_), 1)[0]) if len(ns) > 1 else math.nan
    return best[0], best[1], slope


def largest(name: str, c: float, limit: float) -> float:
    """The N at which c f(N) reaches ``limit``."""
    lo, hi = 1.0, 1e9
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if c * GROWTH[name](mid) < limit else (lo, mid)
    return lo


def too_big(done: list[dict], n: int, a) -> str | None:
    """Why N = n would not fit, from the points below it: its steady round or its
    first round (DPFL's BGGC, N^2 models moved) fitted past the limit, or its peak
    memory, extrapolated linearly in N, past 60% of the memory available now on
    all ranks together (the OOM killer takes a rank, and maybe a neighbour's job)."""
    ns = [r["N"] for r in done]
    for what, ts in (("round", [typical(r) for r in done]), ("first round", [r["round_s"][0] for r in done])):
        name, c, _ = fit(ns, ts)
        if c * GROWTH[name](n) > a.limit:
            return f"its {what}, fitted {name}, would take {c * GROWTH[name](n):.0f} s, over the {a.limit:.0f} s limit"
    slope, icpt = np.polyfit(ns, [r["peak_rss_gib"] for r in done], 1)
    need = a.ranks * (slope * n + icpt)
    have = available_bytes() / 2**30
    if need > 0.6 * have:
        return (f"its peak memory, linear in N, would be {need:.1f} GiB on {a.ranks} ranks, "
                f"over 60% of {have:.1f} available")
    return None


def measure(a) -> list[dict]:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # The runs are scratch: only their timings are kept, in cost.json (a sweep of N left GBs behind).
    with tempfile.TemporaryDirectory(prefix="mpifl-cost-") as tmp:
        runs = Path(tmp)
        recs: list[dict] = []
        for method in a.methods:
            done: list[dict] = []
            for n in sorted(a.clients):
                why = too_big(done, n, a) if len(done) >= 2 else None
                if why:
                    rec = {"method": method, "N": n, "stopped": f"not run: {why}"}
                    recs.append(rec)
                    print(json.dumps(rec), flush=True)
                    continue
                rec = point(method, n, a, runs)
                recs.append(rec)
                print(json.dumps(rec), flush=True)
                if "round_s" in rec:
                    done.append(rec)
            (out / "cost.json").write_text(json.dumps(recs, indent=1))
    return recs


def table(recs: list[dict], limit: float) -> str:
    lines = ["| method | N | s a round (each round; the last evaluates) | fitted on s | peak RSS GiB (largest rank) "
             "| over FedAvg |", "|---|---|---|---|---|---|"]
    base = {r["N"]: typical(r) for r in recs if r["method"] == "fedavg" and "round_s" in r}
    order = list(dict.fromkeys(r["method"] for r in recs))
    for r in sorted(recs, key=lambda r: (order.index(r["method"]), r["N"])):
        if "round_s" not in r:
            lines.append(f"| {r['method']} | {r['N']:,} | - | {r['stopped']} | - | - |")
            continue
        ratio = f"{typical(r) / base[r['N']]:.1f}x" if r["N"] in base else "-"
        each = " / ".join(f"{x:.2f}" for x in r["round_s"])
        lines.append(f"| {r['method']} | {r['N']:,} | {each} | {typical(r):.2f} | "
                     f"{r['peak_rss_gib']:.2f} | {ratio} |")
    lines += ["", "| method | fitted growth (steady round) | log-log slope | N at a round of "
              f"{limit:.0f} s (from the fit) |", "|---|---|---|---|"]
    for m in dict.fromkeys(r["method"] for r in recs):
        ok = [r for r in recs if r["method"] == m and "round_s" in r]
        if len(ok) < 2:
            continue
        name, c, slope = fit([r["N"] for r in ok], [typical(r) for r in ok])
        lines.append(f"| {m} | {name} | {slope:.2f} | {largest(name, c, limit):,.0f} |")
    return "\n".join(lines)


def plot(recs: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for m in dict.fromkeys(r["method"] for r in recs):
        ok = [r for r in recs if r["method"] == m and "round_s" in r]
        if not ok:
            continue
        ax.plot([r["N"] for r in ok], [typical(r) for r in ok], "o-", label=m)
    ax.set(xscale="log", yscale="log", xlabel="clients N", ylabel="seconds a round (pFedLIA: its LIA round)",
           title="Cost against N (2 ranks, MLP 784-64-10, Adam)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", nargs="+", type=int, default=[100, 1000, 10000])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dpfl-budget", default="0.1N")
    ap.add_argument("--limit", type=float, default=600.0, help="seconds a round at most")
    ap.add_argument("--out", default="/tmp/mpifl-cost")
    ap.add_argument("--plot", help="a cost.json to tabulate and draw instead of measuring")
    ap.add_argument("--figure", help="where the figure goes (with --plot)")
    a = ap.parse_args()
    recs = json.loads(Path(a.plot).read_text()) if a.plot else measure(a)
    print(table(recs, a.limit))
    if a.figure:
        plot(recs, a.figure)


if __name__ == "__main__":
    main()
