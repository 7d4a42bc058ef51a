"""Collecting the tests and checking the docs compile nothing: mpifl.train.fused's
kernel is built by the ``fused_kernel`` fixture (tests/conftest.py), for the tests
that use it, not at import."""

import os
import subprocess
import sys

import pytest
from helpers import REPO

# Imported first by every interpreter started with its folder on PYTHONPATH (site's
# sitecustomize): torch's extension builders and mpifl's kernel loader (which may
# take a cached build without building) replaced by a refusal that leaves a mark
HOOK = '''
import importlib.abc, importlib.util, os, sys

REFUSED = {"torch.utils.cpp_extension": ("load", "load_inline"), "mpifl.train.fused": ("_build",)}


def refuse(*args, **kwargs):
    with open(os.environ["MPIFL_COMPILE_MARK"], "a") as f:
        f.write(" ".join(sys.argv) + "\\n")
    raise RuntimeError("the kernel built or loaded where it must not be")


class _NoKernel(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in REFUSED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(mod):
            run(mod)
            for attr in REFUSED[name]:
                setattr(mod, attr, refuse)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _NoKernel())
'''


def _run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)


@pytest.mark.slow
def test_collecting_the_tests_and_checking_the_docs_compile_nothing(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(HOOK)
    mark = tmp_path / "compiled"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
           "MPIFL_COMPILE_MARK": str(mark)}
    built = _run(["-c", "from mpifl.train import fused; fused.kernels()"], env)
    assert mark.exists(), built.stdout + built.stderr  # the hook sees the kernel asked for
    mark.unlink()

    collect = _run(["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"], env)
    assert collect.returncode == 0 and " collected" in collect.stdout, collect.stdout[-500:] + collect.stderr[-500:]
    assert not mark.exists(), mark.read_text()
    docs = _run(["-m", "mpifl.docs", "--check"], env)
    assert docs.returncode in (0, 1) and "Traceback" not in docs.stderr, docs.stderr[-500:]  # 1: stale counts
    assert not mark.exists(), mark.read_text()
