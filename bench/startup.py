"""Start-up: from the command to the first round of a one-rank run, side by side
with ``python -c "import torch"`` on the same machine.

    python bench/startup.py                      # the quickstart, 7 alternating pairs
    python bench/startup.py --repeats 11 --job jobs/fedc2i-featshift.yaml

Each repeat runs ``python -c "import torch"`` and then ``python -m mpifl.main JOB
run.rounds=1`` (fresh output folder, one thread). The first round starts when
the run prints its header line (``mpifl <algorithm>: ...``, printed just before
the round loop), so "to first round" is the time from the command to that line;
"whole" is the process's wall time. Reported: best and median of each, and the
ratio of the medians (mpifl to first round / import torch).

As a user's second run: mpifl's modules are byte-compiled first (``compileall``;
torch's come compiled in its wheel, and with PYTHONDONTWRITEBYTECODE set Python
would otherwise compile mpifl at every start), and one untimed run fills the
dataset cache (``mpifl/data/cache.py``) and the page cache. The load average is
printed before and after: figures taken on a busy machine are not comparable.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def import_torch(env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env=env, cwd=REPO)
    return time.perf_counter() - t0


def one_run(job: str, out: Path, env: dict) -> tuple[float, float]:
    """(seconds to the header line, seconds of the whole process)."""
    cmd = [sys.executable, "-m", "mpifl.main", job, "run.rounds=1", f"run.out_dir={out}", "run.name=startup",
           "run.resume=never", "run.threads=1"]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    first = None
    for line in p.stdout:
        if first is None and line.startswith("mpifl "):
            first = time.perf_counter() - t0
    err = p.stderr.read()
    if p.wait() != 0 or first is None:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-2000:]}")
    return first, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="jobs/quickstart.yaml")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    compileall.compile_dir(str(REPO / "mpifl"), quiet=1)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    print(f"load average before: {os.getloadavg()}; "
          f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE')!r}")
    torch_s, first_s, whole_s = [], [], []
    with tempfile.TemporaryDirectory(prefix="mpifl-startup-") as tmp:
        one_run(a.job, Path(tmp), env)  # untimed: dataset cache, page cache
        import_torch(env)
        for _ in range(a.repeats):
            torch_s.append(import_torch(env))
            f, w = one_run(a.job, Path(tmp), env)
            first_s.append(f)
            whole_s.append(w)
    print(f"load average after: {os.getloadavg()}")
    print(f"{a.repeats} alternating repeats, seconds (best / median):")
    for name, xs in (("python -c 'import torch'", torch_s), (f"mpifl {a.job}: to first round", first_s),
                     (f"mpifl {a.job}: whole, 1 round", whole_s)):
        print(f"  {name:45s} {min(xs):6.2f} / {statistics.median(xs):6.2f}")
    ratio = statistics.median(first_s) / statistics.median(torch_s)
    print(f"to first round / import torch: {ratio:.2f}x (medians), {min(first_s) / min(torch_s):.2f}x (bests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
