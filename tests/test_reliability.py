"""Kill, preempt, crash and resume: a run never hangs, never loses finished
rounds, and resumes to the same result.

Bits: a killed, preempted or stopped run is compared bit for bit with an
uninterrupted one: launches on one machine with the same ranks, settings and one
thread per rank (``run.threads=1``), so it holds on whichever CPU runs both. Across
1 and 4 ranks only decisions (integers, booleans) and the mixing rows are compared
exactly; values within tolerances."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import MPIEXEC, REPO, TIMING, assert_same_logs, launch, reference_runs, shared_tmp

from mpifl import algorithms
from mpifl.logging.h5 import open_run

pytestmark = pytest.mark.slow  # every test launches mpiexec

BASE = ["data.name=synthetic", "data.n_samples=480", "data.n_clients=8", "data.n_clusters=2",
        "model.hidden=[16]", "run.rounds=6", "run.checkpoint_every=2", "run.threads=1", "algorithm.fraction=0.5"]


# the who-collaborates-with-whom baselines, set so that their decisions happen in
# the first rounds (CFL splits from round 1, FedFomo explores and exploits)
WHOM = {"cfl": ["cfl.warmup_rounds=1", "cfl.eps1=10", "cfl.eps2=0.01", "cfl.min_size=1"],
        "fesem": [], "pfedgraph": ["pfedgraph.lam=0.1"], "fedfomo": ["fedfomo.m=2", "fedfomo.eps=0.5"]}


# the personalization baselines: extra rows with an optimizer state to carry (momentum)
PERSONAL = {"fedavg_ft-best": ["fedavg_ft.start=best_val"], "ditto": ["train.momentum=0.9"],
            "fedrep": ["fedrep.head_epochs=2", "train.momentum=0.9"]}


# overrides of the kill/resume test per algorithm (or "algorithm-variant"); one not
# named here runs with BASE alone
EXTRA = {**WHOM, **PERSONAL, "pfedlia": ["pfedlia.warmup_rounds=2", "pfedlia.lia_epochs=2"],
         "pfedlia-p2p": ["pfedlia.warmup_rounds=2", "pfedlia.lia_epochs=2", "pfedlia.mode=p2p"],
         "perfedavg-hf": ["perfedavg.variant=hf"]}

# beyond one kill of every algorithm: variants, and kills at other moments
VARIANTS = [
    ("pfedlia-p2p", "1:3:kill"),  # warm-up and LIA happen before the kill
    ("fedavg_ft-best", "1:3:kill"), ("perfedavg-hf", "1:3:kill"),
    ("ditto", "0:3:kill_in_checkpoint"),  # personal models and their optimizer state
    ("fedavg", "0:3:kill_in_checkpoint"),  # killed between writing its part and publishing
    ("fedavg", "1:1:kill"),  # before the first checkpoint: the rerun starts over
    ("oracle", "0:5:kill"), ("federico", "0:5:kill_in_checkpoint"),
]


def kill_cases() -> list[tuple[str, str]]:
    """(algorithm[-variant], MPIFL_FAULT) of the kill/resume test: every algorithm of
    ``mpifl.algorithms.NAMES`` killed on rank 1 at the start of round 3, then VARIANTS."""
    return [(name, "1:3:kill") for name in algorithms.NAMES] + VARIANTS


def kill_args(algo: str) -> list[str]:
    return [*BASE, f"algorithm.name={algo.split('-')[0]}", *EXTRA.get(algo, [])]


@pytest.fixture(scope="session")
def kill_refs(tmp_path_factory) -> dict[str, Path]:
    """The uninterrupted run of every kill case's job on 2 ranks, all in one launch."""
    jobs = {algo: kill_args(algo) for algo in sorted({a for a, _ in kill_cases()})}
    return reference_runs(jobs, shared_tmp(tmp_path_factory) / "kill-refs")


@pytest.mark.parametrize(("algo", "fault"), kill_cases())
def test_sigkill_then_resume_is_identical(tmp_path, kill_refs, algo, fault):
    args = [*kill_args(algo), f"run.out_dir={tmp_path}"]
    env_kill = {**os.environ, "MPIFL_FAULT": fault, "PYTHONPATH": str(REPO)}
    cmd = [str(MPIEXEC), "-n", "2", sys.executable, "-m", "mpifl.main", *args, "run.name=cut"]
    killed = subprocess.run(cmd, cwd=REPO, env=env_kill, capture_output=True, text=True, timeout=300, check=False)
    assert killed.returncode != 0
    k, kind = int(fault.split(":")[1]), fault.split(":")[2]
    done = k + 1 if kind == "kill_in_checkpoint" else k  # rounds logged before the kill
    saved = [t for t in range(k) if (t + 1) % 2 == 0]  # checkpoint_every=2, published ones
    assert open_run(tmp_path / "cut").n_rounds == done
    latest = tmp_path / "cut" / "checkpoint" / "latest"
    assert (latest.read_text() == f"round-{saved[-1]:06d}") if saved else not latest.exists()
    resumed = launch([*args, "run.name=cut"], n=2)
    assert resumed.returncode == 0, resumed.stderr
    if saved:
        assert f"resumed after round {saved[-1] + 1}" in resumed.stdout
    else:
        assert "resumed" not in resumed.stdout
    assert_same_logs(open_run(kill_refs[algo]), open_run(tmp_path / "cut"))


# the rank-count cases: every logged value (personal models' rows, optimizer states), the
# personalised baselines' per-client results, the who-collaborates-with-whom decisions
SAME = ["fedem", "fedproto", "knn_per", "fedprox", "fedprox_ft", "ditto", "fedrep", "fedavg_ft-best"]
PERSONALISED = ["apfl", "perfedavg", "fedrod"]
RANK_CASES = {**{f"same-{a}": [*BASE, f"algorithm.name={a.split('-')[0]}", *PERSONAL.get(a, []),
                               "run.checkpoint_every=0"] for a in SAME},
              **{f"personalised-{a}": [*BASE, f"algorithm.name={a}"] for a in PERSONALISED},
              **{f"whom-{a}": [*BASE, f"algorithm.name={a}", *WHOM[a]] for a in WHOM}}


@pytest.fixture(scope="session")
def on_1_and_4_ranks(tmp_path_factory):
    """Every rank-count case run on 1 and on 4 ranks (a launch for each rank count:
    what is compared is the runs' values, not how they were launched); case -> the two logs."""
    root = shared_tmp(tmp_path_factory)
    one, four = (reference_runs(RANK_CASES, root / f"ranks-{n}", n=n) for n in (1, 4))
    return lambda case: (open_run(one[case]), open_run(four[case]))


@pytest.mark.parametrize("algo", SAME)
def test_same_seed_same_results_on_1_and_4_ranks(on_1_and_4_ranks, algo):
    """Rank-count invariance: every logged per-client value agrees; only the
    order of floating-point sums across ranks may differ."""
    a, b = on_1_and_4_ranks(f"same-{algo}")
    keys = set(a.keys()) - TIMING - {"clients/rank", "clients/node"}
    assert keys == set(b.keys()) - TIMING - {"clients/rank", "clients/node"} and a.n_rounds == b.n_rounds == 6
    assert any(k.startswith(f"{algo.split('-')[0]}/") for k in keys) or algo == "knn_per"
    for k in sorted(keys):
        x, y = a.get(k), b.get(k)
        assert x.shape == y.shape, k
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=k)


@pytest.mark.parametrize("algo", PERSONALISED)
def test_same_seed_on_1_and_4_ranks_personalised(on_1_and_4_ranks, algo):
    """The partition, the sampled clients and the per-client results do not depend
    on the number of ranks (sums over ranks may round differently: tolerances)."""
    a, b = on_1_and_4_ranks(f"personalised-{algo}")
    assert b.attrs["n_ranks"] == 4 and a.n_rounds == b.n_rounds == 6
    for t in range(6):
        assert np.array_equal(a.mixing(t), b.mixing(t))
    for k in sorted(set(a.keys()) - TIMING):
        if k.startswith(("metrics/", f"{algo}/")) and not k.endswith("_acc"):
            np.testing.assert_allclose(a.get(k), b.get(k), rtol=1e-3, atol=1e-5, err_msg=k)
    acc_a, acc_b = a.metric("test_acc"), b.metric("test_acc")
    assert np.abs(np.nanmean(acc_a, 1) - np.nanmean(acc_b, 1)).max() <= 0.005


def _interrupted(args: list[str], n: int, log: Path, sig: int, times: int = 1) -> subprocess.Popen:
    """``mpifl.main args`` under ``mpiexec -n n`` (n=0: alone) sent ``sig`` ``times``
    times, half a second apart, to its process group (a terminal's Ctrl-C reaches the
    foreground group; SLURM signals every task) once ``log`` holds 2 rounds."""
    launcher = [str(MPIEXEC), "-n", str(n)] if n else []
    proc = subprocess.Popen([*launcher, sys.executable, "-m", "mpifl.main", *args], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if log.exists() and open_run(log).n_rounds >= 2:
                break
        except OSError:
            pass
        time.sleep(0.05)
    for i in range(times):
        if i:
            time.sleep(0.5)
        os.killpg(proc.pid, sig)
    return proc


@pytest.mark.parametrize("sig,n", [(signal.SIGTERM, 2), (signal.SIGINT, 1), (signal.SIGINT, 2), (signal.SIGINT, 4)],
                         ids=["SIGTERM-2", "SIGINT-1", "SIGINT-2", "SIGINT-4"])
def test_a_stop_signal_checkpoints_exits_75_and_resumes_identically(tmp_path, sig, n):
    """SIGTERM (SLURM), or Ctrl-C (SIGINT, which mpiexec forwards to every rank):
    the round in progress ends, a checkpoint is written, one line says so, exit
    75; the same command resumes to the uninterrupted run's bits."""
    rounds = 200
    args = [*BASE, "algorithm.name=fedavg", f"run.rounds={rounds}", "run.checkpoint_every=0", f"run.out_dir={tmp_path}"]
    ref = launch([*args, "run.name=ref"], n=n)
    assert ref.returncode == 0, ref.stderr
    log = tmp_path / "stop" / "run.h5"
    proc = _interrupted([*args, "run.name=stop"], n, log, sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    lines = [ln for ln in (out + err).splitlines() if "stop signal" in ln]
    assert len(lines) == 1 and signal.Signals(sig).name in lines[0] and "Traceback" not in err, out + err
    n_done = open_run(log).n_rounds
    assert 2 <= n_done < rounds
    resumed = launch([*args, "run.name=stop"], n=n)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed after round {n_done}" in resumed.stdout
    assert_same_logs(open_run(tmp_path / "ref"), open_run(log))


def test_a_second_ctrl_c_ends_the_process_at_once():
    """The first Ctrl-C is remembered for the round's end; a second one, before the
    checkpoint is written, ends the process as an unhandled SIGINT does (under
    mpiexec, its own second Ctrl-C aborts every rank: "Press Ctrl-C again to force
    abort"). The handlers before the round loop come back after it."""
    code = """if True:
        import os, signal, time
        from mpifl.run.runtime import _StopFlag
        before = signal.getsignal(signal.SIGINT)
        flag = _StopFlag()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        print("flag", flag.signum, flush=True)
        flag.restore()
        print("restored", signal.getsignal(signal.SIGINT) is before, flush=True)
        flag = _StopFlag()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        print("still running", flush=True)
    """
    t0 = time.time()
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == -signal.SIGINT and time.time() - t0 < 60, (res.returncode, res.stderr)
    assert res.stdout.split("\n")[:2] == [f"flag {int(signal.SIGINT)}", "restored True"], res.stdout


def test_exception_on_rank_1_of_4_aborts_fast_and_names_it(tmp_path):
    args = [*BASE, "algorithm.name=fedavg", f"run.out_dir={tmp_path}", "run.name=boom"]
    env = {**os.environ, "MPIFL_FAULT": "1:3", "PYTHONPATH": str(REPO)}
    t0 = time.time()
    res = subprocess.run([str(MPIEXEC), "-n", "4", sys.executable, "-m", "mpifl.main", *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    started = res.stdout.count("round")  # sanity: it did train before failing
    assert res.returncode != 0
    assert time.time() - t0 < 30 and started >= 3
    assert "mpifl: rank 1 of 4 failed" in res.stderr
    assert res.stderr.count("Traceback") == 1  # once, from the failing rank only
    run = open_run(tmp_path / "boom")
    assert run.n_rounds == 3
    assert run.metric("test_acc").shape == (3, 8)


def test_resume_on_a_different_rank_count(tmp_path):
    args = [*BASE, "algorithm.name=fedavg", f"run.out_dir={tmp_path}"]
    ref = launch([*args, "run.name=ref"], n=4)
    assert ref.returncode == 0, ref.stderr
    env = {**os.environ, "MPIFL_FAULT": "2:4:kill", "PYTHONPATH": str(REPO)}
    cut = subprocess.run([str(MPIEXEC), "-n", "4", sys.executable, "-m", "mpifl.main", *args, "run.name=cut"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert cut.returncode != 0
    resumed = launch([*args, "run.name=cut"], n=2)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed after round 4" in resumed.stdout
    a, b = open_run(tmp_path / "ref"), open_run(tmp_path / "cut")
    assert b.attrs["n_ranks"] == 2
    assert abs(np.nanmean(a.metric("test_acc")[-1]) - np.nanmean(b.metric("test_acc")[-1])) <= 0.005
    assert np.array_equal(a.mixing(5) > 0, b.mixing(5) > 0)


@pytest.mark.parametrize("algo", list(WHOM))
def test_same_seed_on_1_and_4_ranks(on_1_and_4_ranks, algo):
    """The decisions (clusters, splits, candidates, graphs' supports) are the same
    on 1 and 4 ranks; models differ only by the order of float sums."""
    a, b = on_1_and_4_ranks(f"whom-{algo}")
    assert b.attrs["n_ranks"] == 4 and a.n_rounds == b.n_rounds == 6
    for k in sorted(set(a.keys()) - TIMING - {"clients/rank", "clients/node"}):
        x, y = a.get(k), b.get(k)
        if k.startswith(("clients/", f"{algo}/cluster", f"{algo}/candidates")) or x.dtype.kind in "iub":
            assert np.array_equal(x, y), k
        else:
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=k)
    for t in range(6):
        assert np.array_equal(a.mixing(t) > 0, b.mixing(t) > 0)
    if algo == "cfl":
        sa, sb = (np.array(json.loads(r.attrs["cfl_splits"])) for r in (a, b))
        assert np.array_equal(sa[:, :3], sb[:, :3]) and np.allclose(sa, sb, rtol=1e-4)
        assert len(set(a.get("cfl/cluster")[-1])) > 1  # it did split


def test_nonfinite_error_names_client_and_round(tmp_path):
    res = launch([*BASE, "algorithm.name=local", "train.lr=1e30", f"run.out_dir={tmp_path}"], n=2, timeout=120)
    assert res.returncode != 0
    assert "non-finite" in res.stderr and "in round 1 " in res.stderr and "client " in res.stderr  # rounds from 1
    assert "Traceback" not in res.stderr


def test_nonfinite_skip_drops_updates_and_counts_them(tmp_path):
    res = launch([*BASE, "algorithm.name=local", "train.lr=1e30", "train.on_nonfinite=skip",
                  f"run.out_dir={tmp_path}", "run.name=skip"], n=2, timeout=120)
    assert res.returncode == 0, res.stderr
    run = open_run(tmp_path / "skip")
    skipped = run.metric("skipped")
    assert skipped.shape == (6, 8) and skipped.sum() > 0
    # a client whose every update was dropped still holds its (finite) initial model
    always = np.flatnonzero((skipped > 0).all(0))
    assert len(always) > 0
    assert np.all(np.isfinite(run.metric("val_loss")[-1][always]))
