"""python -m mpifl.check: the parts without MPI, and the command under
``mpiexec -n 2`` (the report, exit 0; each problem: one line, exit 1). The
per-rank parts run in-process under mpiexec in tests/mpi/test_check.py."""

import os
import subprocess
import sys

import pytest
from helpers import MPIEXEC, REPO, launch

from mpifl import check, config

QUICK = str(REPO / "jobs" / "quickstart.yaml")


def test_node_local_knows_tmp_shm_and_tmpdir(monkeypatch):
    monkeypatch.setenv("TMPDIR", "/scratch/job42")
    assert check.node_local("/tmp/mpifl/results") == "/tmp"
    assert check.node_local("/dev/shm/venv/bin/python") == "/dev/shm"
    assert check.node_local("/var/tmp") == "/var/tmp"
    assert check.node_local("/scratch/job42/x") == "/scratch/job42"
    assert check.node_local("/home/me/mpifl") is None
    assert check.node_local("/tmpfoo/x") is None  # a prefix of the name is not the folder


def test_pmi_advice_for_plugins_that_cannot_start_the_library():
    assert "separate 1-rank jobs" in check.pmi_advice("MPICH Version: 4.2", "none", 4)
    assert check.pmi_advice("MPICH Version: 4.2", "none", 1) is None
    assert "slurm.mpi: pmix" in check.pmi_advice("Open MPI v5.0.3, package: Open MPI", "pmi2", 2)
    assert check.pmi_advice("Open MPI v5.0.3, package: Open MPI", "pmix_v5", 2) is None
    assert check.pmi_advice("MPICH Version: 4.2", "pmi2", 16) is None


def test_launcher_reads_srun_mpiexec_and_open_mpi_environments():
    assert check.launcher({"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "16", "SLURM_MPI_TYPE": "none",
                           "PMI_SIZE": "1"}) == ("srun --mpi=none", 3, 16)
    assert check.launcher({"PMI_RANK": "1", "PMI_SIZE": "2"}) == ("mpiexec (PMI)", 1, 2)
    assert check.launcher({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8"})[1:] == (0, 8)
    assert check.launcher({}) == ("no launcher", None, None)


def test_local_problems_one_line_each(tmp_path):
    cfg = config.load(QUICK, [f"run.out_dir={tmp_path}"])
    assert check.local_problems(cfg, 2) == []
    few = check.local_problems(config.load(QUICK, ["data.n_clients=3", f"run.out_dir={tmp_path}"]), 4)
    assert len(few) == 1 and few[0].startswith("data.n_clients=3 is fewer than the 4 MPI ranks")
    unset = check.local_problems(config.load(QUICK, ["data.name=cifar10", f"run.out_dir={tmp_path}"]), 1)
    assert len(unset) == 1 and "data.root is empty" in unset[0]
    gone = check.local_problems(config.load(QUICK, ["data.name=mnist", f"data.root={tmp_path}/none",
                                                    f"run.out_dir={tmp_path}"]), 1)
    assert len(gone) == 1 and "does not exist" in gone[0]
    ro = check.local_problems(config.load(QUICK, ["run.out_dir=/proc/1/mpifl"]), 1)
    assert len(ro) == 1 and "run.out_dir='/proc/1/mpifl' cannot be written" in ro[0]
    assert all("\n" not in p for p in few + unset + gone + ro)


@pytest.mark.slow
def test_launch_problems_interpreter_and_srun_plugins(tmp_path, monkeypatch):
    bad = check.launch_problems(str(tmp_path / "nope" / "python"), "pmi2", 2, REPO)
    assert len(bad) == 1 and "cannot be run here" in bad[0]
    bare = tmp_path / "python"  # an interpreter without mpifl's dependencies
    bare.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named mpi4py' >&2\nexit 1\n")
    bare.chmod(0o755)
    bad = check.launch_problems(str(bare), "pmi2", 2, REPO)
    assert len(bad) == 1 and "cannot import mpi4py and mpifl" in bad[0] and "No module named mpi4py" in bad[0]
    # a stand-in srun that offers pmi2 but not pmix
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text("#!/bin/sh\nprintf 'MPI plugin types are...\\n\\tnone\\n\\tpmi2\\n"
                               "specific pmi2 plugin versions available: pmi2_v9\\n'\n")
    (bin_ / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    assert check.srun_mpi_plugins() == ["none", "pmi2", "pmi2_v9"]
    assert check.launch_problems(sys.executable, "pmi2", 2, REPO) == []
    wrong = check.launch_problems(sys.executable, "pmix", 2, REPO)
    assert len(wrong) == 1
    assert "slurm.mpi='pmix' is not one of this cluster's srun MPI plugins (none, pmi2, pmi2_v9)" in wrong[0]
    none = check.launch_problems(sys.executable, "none", 2, REPO)
    assert len(none) == 1 and "separate 1-rank jobs" in none[0]


# --------------------------------------------------------------------------- the command under mpiexec


def _problems(res: subprocess.CompletedProcess) -> list[str]:
    return [line for line in res.stderr.splitlines() if line.startswith("mpifl.check: problem: ")]


@pytest.mark.slow
def test_the_quickstart_under_mpiexec_2_reports_and_exits_0(tmp_path):
    res = launch([QUICK, f"run.out_dir={tmp_path}"], n=2, module="mpifl.check")
    assert res.returncode == 0, res.stdout + res.stderr
    for word in ("mpiexec (PMI), 2 rank(s) on 1 node(s)", "PMI_RANK", "node-local 0-1", "20 clients on 2 rank(s)",
                 "read back by 2 of 2 rank(s)", "torch took", "Allreduce", "torch kernels", "code       mpifl",
                 "mpifl.check: ok, no problems"):
        assert word in res.stdout, (word, res.stdout)
    assert res.stdout.count("mpifl.check: ok") == 1  # rank 0 alone prints


@pytest.mark.slow
def test_more_ranks_than_clients_fails_with_one_line(tmp_path):
    res = launch([QUICK, f"run.out_dir={tmp_path}", "data.n_clients=1"], n=2, module="mpifl.check")
    assert res.returncode == 1, res.stdout + res.stderr
    assert _problems(res) == ["mpifl.check: problem: data.n_clients=1 is fewer than the 2 MPI ranks: 1 rank(s) "
                              "would host no client; launch at most 1 ranks (srun -n, mpiexec -n, slurm.ntasks) "
                              "or raise data.n_clients"]


@pytest.mark.slow
def test_a_relative_run_dir_seen_from_two_working_dirs_is_not_shared(tmp_path):
    # MPMD: the same relative run.out_dir from two working directories, as a
    # node-local path looks from two nodes
    cmd = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        cmd += [":"] * bool(cmd) + ["-n", "1", "-wdir", str(tmp_path / name), sys.executable, "-m", "mpifl.check",
                                    QUICK, "run.out_dir=results"]
    res = subprocess.run([str(MPIEXEC), *cmd], capture_output=True, text=True, timeout=300, check=False,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 1, res.stdout + res.stderr
    assert len(_problems(res)) == 1
    assert "run.out_dir='results' is not the same folder on every rank: rank(s) 1" in _problems(res)[0]
    assert not list((tmp_path / "a" / "results").iterdir())  # rank 0 took its probe away


@pytest.mark.slow
def test_a_missing_data_root_fails_with_one_line(tmp_path):
    res = launch([QUICK, f"run.out_dir={tmp_path}", "data.name=mnist", f"data.root={tmp_path}/mnist"], n=2,
                 module="mpifl.check")
    assert res.returncode == 1, res.stdout + res.stderr
    assert _problems(res) == [f"mpifl.check: problem: data.root='{tmp_path}/mnist' does not exist on rank(s) 0-1 "
                              f"(vm); point data.root at the dataset, on storage every compute node mounts"
                              .replace("(vm)", f"({os.uname().nodename})")]


@pytest.mark.slow
def test_a_launcher_whose_pmi_the_library_does_not_use(tmp_path):
    # without PMI_FD, MPICH's ranks do not find mpiexec's PMI server and each
    # starts alone: what srun --mpi=none (or a wrong slurm.mpi) does to MPICH;
    # .ci/slurm.sh provokes it with srun itself
    cmd = [str(MPIEXEC), "-n", "2", "env", "-u", "PMI_FD", sys.executable, "-m", "mpifl.check", QUICK,
           f"run.out_dir={tmp_path}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 1, res.stdout + res.stderr
    assert len(_problems(res)) == 1  # said once, by the launcher's rank 0
    assert "mpiexec (PMI) started 2 tasks but MPI sees 1 rank(s) in each" in _problems(res)[0]


@pytest.mark.slow
def test_the_login_node_entry_points_import_neither_torch_nor_mpi():
    # a preflight and a sweep run on login nodes: importing them must not cost a torch
    # import or start MPI (a module-level `from .config import Config` would do both)
    import subprocess
    import sys

    code = ("import sys, mpifl.check, mpifl.sweep.cli, mpifl.main; "
            "print(sorted(m for m in ('torch', 'mpi4py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
