"""SIGKILL at random instants, then resume: nothing finished is lost, the end is bitwise the same.

    python bench/kill_test.py --count 50              # mpiexec -n 2, fedavg/dpfl/federico in turn
    python bench/kill_test.py --count 3 --seed 1      # what tests/test_trust.py runs

For each algorithm one uninterrupted run is the reference. Then, ``--count``
times: start the same job in a fresh run directory, wait until it has begun
training, sleep a random fraction of the reference's training time and SIGKILL
rank 0 (the log's writer), rank 1, or every rank at once (``scancel
--signal=KILL``), landing anywhere: in a round, in the log's commit, in a
checkpoint write. After each kill:

- ``open_run`` must read every dataset of the log, holding at least the rounds
  the job reported finished, each equal to the reference's;
- running the same command again must resume (or start over, before the first
  checkpoint) and end with a log and a final checkpoint bitwise equal to the
  reference's (timings aside).

Prints one line per kill and ``kill test: P/C passed``; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from mpifl.logging.h5 import open_run  # noqa: E402

MPIEXEC = Path(sys.executable).parent / "mpiexec"
BASE = ["data.name=synthetic", "data.n_samples=480", "data.n_clients=8", "data.n_clusters=2", "model.hidden=[16]",
        "run.rounds=12", "run.checkpoint_every=3", "run.threads=1", "algorithm.fraction=0.5", "log.flush_s=0"]
EXTRA = {"dpfl": ["dpfl.tau_init=1", "dpfl.tau_train=1", "dpfl.budget=3"], "federico": ["federico.k=2"]}
TIMING = {"rounds/wall_s", "rounds/comm_s", "rounds/compute_s"}


def _args(algo: str, out: Path, name: str) -> list[str]:
    return [*BASE, f"algorithm.name={algo}", *EXTRA.get(algo, []), f"run.out_dir={out}", f"run.name={name}"]


def _cmd(args: list[str], ranks: int) -> list[str]:
    return [str(MPIEXEC), "-n", str(ranks), sys.executable, "-m", "mpifl.main", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _ranks_of(root: int) -> dict[int, int]:
    """{MPI rank: pid} of the mpifl processes below ``root`` (MPICH's PMI_RANK)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes()
            env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mpifl.main" in cmd and pid != root:
            tags = (b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK=")
            rank = next((int(e.split(b"=", 1)[1]) for e in env if e.startswith(tags)), None)
            if rank is not None:
                out[rank] = pid
    return out


def _same(a, b) -> bool:
    """Bitwise equality of nested checkpoint contents."""
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return a == b


def _final_checkpoint(run_dir: Path) -> dict[str, object]:
    d = run_dir / "checkpoint" / (run_dir / "checkpoint" / "latest").read_text().strip()
    out = {}
    for f in sorted(d.glob("*.pt")):  # manifest.json: the checksums of these, meta's naming its run directory
        obj = torch.load(f, weights_only=True)
        if f.name == "meta.pt":
            obj = {k: v for k, v in obj.items() if k != "config"}  # names its own run directory
        out[f.name] = obj
    return out


def _check_log(run_dir: Path, ref, finished: int) -> str | None:
    """None when the log reads whole, with >= ``finished`` rounds equal to ``ref``'s."""
    log = run_dir / "run.h5"
    if not log.exists():
        return None if finished == 0 else f"no log after {finished} finished rounds"
    try:
        run = open_run(log)
        n = run.n_rounds
        for k in run.keys():
            x = run.get(k)
            if k in TIMING or not n:
                continue
            y = ref.get(k)
            if run.datasets[k].per_round:
                y = y[:n]
            if x.shape != y.shape or not np.array_equal(x, y, equal_nan=True):
                return f"{k} differs from the reference after the kill"
    except Exception as e:  # noqa: BLE001 - any failure to read is the finding
        return f"open_run failed: {type(e).__name__}: {str(e)[:120]}"
    if n < finished:
        return f"log holds {n} rounds, {finished} were reported finished"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=50)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "dpfl", "federico"])
    ap.add_argument("--out", help="directory for the runs (default: a new temporary one)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    out = Path(a.out or tempfile.mkdtemp(prefix="mpifl-kill-"))
    refs, train_s = {}, {}
    for algo in a.algorithms:
        res = subprocess.run(_cmd(_args(algo, out, f"ref-{algo}"), a.ranks), cwd=REPO, env=_env(),
                             capture_output=True, text=True, timeout=600, check=False)
        if res.returncode != 0:
            print(res.stderr, file=sys.stderr)
            return 1
        refs[algo] = open_run(out / f"ref-{algo}")
        train_s[algo] = float(re.search(r"done: \d+ rounds in ([0-9.]+)s", res.stdout).group(1))
        print(f"reference {algo}: {train_s[algo]:.2f}s of training", flush=True)
    passed = 0
    for i in range(a.count):
        algo = a.algorithms[i % len(a.algorithms)]
        run_dir = out / f"cut-{i:03d}"
        args = _args(algo, out, run_dir.name)
        target = rng.choice(["rank0", "rank0", "rank1", "all"])
        delay = rng.uniform(0, 1.2) * train_s[algo]
        proc = subprocess.Popen(_cmd(args, a.ranks), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.time() + 300
        while not (run_dir / "run.h5").exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.005)  # the writer creates the log right before round 0
        time.sleep(delay)
        ranks = _ranks_of(proc.pid)
        if target == "all":
            for pid in ranks.values():
                os.kill(pid, signal.SIGKILL)
        elif ranks:
            os.kill(ranks.get(0 if target == "rank0" else 1, next(iter(ranks.values()))), signal.SIGKILL)
        try:
            stdout, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, _ = proc.communicate()
        finished = len(re.findall(r"^round +\d+/", stdout, re.M))
        problem = _check_log(run_dir, refs[algo], finished)
        after = None
        if problem is None:
            try:
                after = open_run(run_dir).n_rounds if (run_dir / "run.h5").exists() else 0
            except OSError:
                after = None
            res = subprocess.run(_cmd(args, a.ranks), cwd=REPO, env=_env(), capture_output=True, text=True,
                                 timeout=600, check=False)
            if res.returncode != 0:
                problem = f"resume exited {res.returncode}: {res.stderr.strip()[-300:]}"
            else:
                ref, got = refs[algo], open_run(run_dir)
                keys = set(ref.keys()) - TIMING
                if keys != set(got.keys()) - TIMING or ref.n_rounds != got.n_rounds:
                    problem = "resumed log has other datasets or rounds than the reference"
                else:
                    bad = [k for k in sorted(keys) if not np.array_equal(ref.get(k), got.get(k), equal_nan=True)]
                    if bad:
                        problem = f"resumed log differs from the reference in {bad[:3]}"
                    elif not _same(_final_checkpoint(out / f"ref-{algo}"), _final_checkpoint(run_dir)):
                        problem = "final checkpoint differs from the reference"
        status = "ok" if problem is None else f"FAILED: {problem}"
        passed += problem is None
        print(f"[{i:3d}] {algo:9s} kill {target:5s} at +{delay:5.2f}s (rc {proc.returncode}): {finished:2d} rounds "
              f"reported, log read back {after} -> {status}", flush=True)
    print(f"kill test: {passed}/{a.count} passed (mpiexec -n {a.ranks}, runs in {out})")
    return 0 if passed == a.count else 1


if __name__ == "__main__":
    sys.exit(main())
