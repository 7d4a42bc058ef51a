"""mpifl.run.provenance: the facts a run log records about the code and the machine."""

import re

import pytest
import torch
import yaml

from mpifl.run import provenance


class OneRank:
    rank = 0

    def allgather(self, obj):
        return [obj, "other-node", obj]


@pytest.mark.slow  # git and torch's build configuration: about a second
def test_a_run_here_records_this_checkout_and_this_cpu(tmp_path):
    p = provenance.collect(OneRank(), "cpu", tmp_path / "run")
    assert re.fullmatch(r"[0-9a-f]{40}", p["mpifl"]["commit"])  # the tests run from a checkout
    assert isinstance(p["mpifl"]["dirty"], bool)
    assert p["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert p["versions"]["torch"] == torch.__version__
    assert p["device"] == "cpu" and p["gpu"] is None and p["sweep"] is None
    assert p["blas"] and p["cpu"]
    assert p["hosts"] == [provenance.host(), "other-node"]  # every node once, in rank order


def test_without_a_checkout_the_installed_version_stands_for_the_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    provenance.code.cache_clear()
    try:
        c = provenance.code()
    finally:
        provenance.code.cache_clear()
    assert c["commit"] is None and c["dirty"] is None and c["version"]
    assert provenance.commit_text({"mpifl": c}) == f"{c['version']} (no checkout)"


def test_a_sweep_point_is_named_from_its_sweep_record(tmp_path):
    root = tmp_path / "my-sweep"
    (root / "runs" / "003_seed-1").mkdir(parents=True)
    (root / "sweep.yaml").write_text(yaml.safe_dump(
        {"name": "my-sweep", "points": [{"name": "003_seed-1", "values": {"run.seed": 1}}]}))
    assert provenance.sweep_point(root / "runs" / "003_seed-1") == \
        {"name": "my-sweep", "point": "003_seed-1", "values": {"run.seed": 1}}
    assert provenance.sweep_point(tmp_path / "runs" / "elsewhere") is None


def test_an_old_log_reads_as_unknown():
    assert provenance.read({"seed": 0}) == {}
    assert provenance.read({"provenance": "not json"}) == {}
    assert set(provenance.brief({}).values()) == {provenance.UNKNOWN}


def test_a_resumed_run_keeps_the_start_that_ran_elsewhere():
    a = {"mpifl": {"commit": "a" * 40, "dirty": False}, "cpu_capability": "AVX2", "device": "cpu"}
    b = {**a, "cpu_capability": "AVX512"}
    assert provenance.resumed(a, dict(a)) == a  # same code, same kernels: nothing to keep
    both = provenance.resumed(a, b)
    assert both["cpu_capability"] == "AVX512" and both["earlier"] == [a]
    assert provenance.resumed(both, b)["earlier"] == [a]


def test_a_gpu_torch_cannot_name_is_unknown_and_a_cpu_run_has_none(monkeypatch):
    def broken(index):
        raise RuntimeError("no driver")

    monkeypatch.setattr(torch.cuda, "get_device_name", broken)
    g = provenance.gpu("cuda:1")
    assert g["name"] == provenance.UNKNOWN and g["cuda"] == torch.version.cuda
    assert provenance.gpu("cpu") is None
    assert provenance.brief({"device": "cuda:1", "gpu": g})["device"] == "cuda:1 (unknown)"


@pytest.mark.slow  # git, a few times
def test_an_untracked_module_in_the_package_makes_the_checkout_dirty(tmp_path, monkeypatch):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    (tmp_path / "mpifl" / "algorithms").mkdir(parents=True)
    (tmp_path / "mpifl" / "algorithms" / "fedavg.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("__pycache__/\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "c")
    monkeypatch.setattr(provenance, "REPO", tmp_path)

    def dirty():
        provenance.code.cache_clear()
        try:
            return provenance.code()["dirty"]
        finally:
            provenance.code.cache_clear()

    (tmp_path / "notes.txt").write_text("beside the package: not code a run imports\n")
    (tmp_path / "mpifl" / "__pycache__").mkdir()
    (tmp_path / "mpifl" / "__pycache__" / "x.pyc").write_bytes(b"ignored")
    assert dirty() is False
    (tmp_path / "mpifl" / "algorithms" / "fedavgx.py").write_text("x = 2\n")  # a copied algorithm
    assert dirty() is True
