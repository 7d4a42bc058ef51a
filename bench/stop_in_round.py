"""How long a preempted job takes to stop when its rounds run for minutes: a run of
the room's setting (jobs/room-fashionmnist.yaml) at ``--clients`` x ``--samples``,
signalled with SIGTERM (SLURM's warning) ``--into`` seconds into round
``--round`` (counted from 1), as SLURM signals every task. Prints the seconds from
the signal to the job's exit, the exit status (75: preempted, resume by running
the same command again), the job's stop line, and the checkpoint left behind. A
measurement for Performance V (bench/README.md), not a test.

    python bench/stop_in_round.py --algorithm dpfl --clients 1000 --samples 40 --round 1 --into 20 \\
        dpfl.budget=0.1N
    python bench/stop_in_round.py --algorithm fedc2i --clients 1000 --samples 40 --round 2 --into 10

A round longer than ``mpifl.run.runtime.LONG_ROUND_S`` is checkpointed when it
ends, so a signal in the round after it abandons that one (and round 1 is always
abandoned: a start over gives the same bits); otherwise the round runs to its end
first. ``--ranks`` processes under the venv's mpiexec, one thread each.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", required=True)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--round", type=int, default=1, help="the round (from 1) the signal arrives in")
    ap.add_argument("--into", type=float, default=10.0, help="seconds into that round")
    ap.add_argument("overrides", nargs="*", help="more key=value settings")
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="mpifl-stop-"))
    args = ["jobs/room-fashionmnist.yaml", f"data.n_clients={a.clients}", f"data.train_per_client={a.samples}",
            f"algorithm.name={a.algorithm}", f"run.rounds={a.round + 2}", "run.threads=1", "run.checkpoint_every=0",
            *(["dpfl.tau_init=1", "dpfl.tau_train=1"] if a.algorithm == "dpfl" else []),  # the room's one epoch
            f"run.out_dir={out}", "run.name=stop", *a.overrides]
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec), "-n", str(a.ranks), sys.executable, "-m", "mpifl.main", *args]
    print("$", " ".join(cmd[3:]), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[tuple[float, str]] = []
    started = threading.Event()  # the round the signal is for has begun

    def read() -> None:
        for ln in proc.stdout:
            lines.append((time.perf_counter() - t0, ln.rstrip()))
            print(f"  [{lines[-1][0]:7.1f}s] {ln.rstrip()}", flush=True)
            begun = ln.startswith(f"mpifl {a.algorithm}:") if a.round == 1 else \
                re.match(rf"round\s+{a.round - 1}/", ln)
            if begun:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started.wait()
    time.sleep(a.into)
    t_sig = time.perf_counter()
    os.killpg(proc.pid, signal.SIGTERM)
    rc = proc.wait()
    t_exit = time.perf_counter()
    reader.join(5)
    latest = out / "stop" / "checkpoint" / "latest"
    stop = [ln for _, ln in lines if "stop signal" in ln]
    print(f"signal at {t_sig - t0:.1f}s ({a.into:.0f}s into round {a.round}); exit {rc} after "
          f"{t_exit - t_sig:.1f}s; checkpoint: {latest.read_text() if latest.exists() else 'none'}")
    print("stop line:", stop[0] if stop else "(none)")


if __name__ == "__main__":
    main()
