"""An algorithm is one file, with its config part beside it: a module (and its
``_params`` module) dropped into a copy of the package is at once an algorithm
name, a config section, a row of the generated docs, a case of the kill/resume
test, and a run, with no other file edited."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import MPIEXEC, REPO

from mpifl.logging.h5 import open_run

pytestmark = pytest.mark.slow  # processes: a fresh interpreter sees the new module

MODULE = '''\
"""Throwaway: FedAvg whose server takes a share of the average update.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=throwaway
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Context, Round
from .blocks import evaluate_global, step
from .throwaway_params import Params  # noqa: F401 - its config part


@dataclass
class Share:
    share: float

    def step(self, model: torch.Tensor, average: torch.Tensor) -> torch.Tensor:
        return model + self.share * (average - model)


@dataclass
class State:
    model: torch.Tensor
    server: Share


def init(ctx: Context) -> State:
    return State(model=ctx.clients.init.clone(), server=Share(ctx.params.share))


def round(ctx: Context, state: State, t: int) -> Round:
    state.model, out = step(ctx, state.model, t, ctx.cfg.algorithm.fraction, server=state.server)
    return out


evaluate = evaluate_global
'''

PARAMS = '''\
"""Throwaway's config part."""

from __future__ import annotations

from dataclasses import dataclass

from mpifl.errors import check


@dataclass
class Params:
    share: float = 0.5  # share of the average update the server takes

    def validate(self, cfg) -> None:
        check(0 < self.share <= 1, "share", self.share, "must be in (0, 1]")
'''

CHECKS = '''\
import sys
from pathlib import Path

import pytest

from mpifl import algorithms, config
from mpifl.docs import blocks as docs
from mpifl.algorithms.base import Algorithm
from mpifl.errors import ConfigError

repo = Path(sys.argv[1])
assert algorithms.__file__.startswith(sys.argv[2]), algorithms.__file__  # the copy, not the checkout
assert "throwaway" in algorithms.NAMES
assert isinstance(algorithms.get("throwaway"), Algorithm)
cfg = config.load(None, ["algorithm.name=throwaway", "throwaway.share=0.25"])
assert cfg.throwaway.share == 0.25 and type(cfg.throwaway) is algorithms.get("throwaway").Params
with pytest.raises(ConfigError, match="^throwaway.share=2"):
    config.load(None, ["throwaway.share=2"])
assert "| `throwaway.share` | `0.5` | float | must be in (0, 1] |" in config.reference()
row = "| `throwaway` | Throwaway: FedAvg whose server takes a share of the average update | – | – |"
assert row in docs.algorithm_table(repo)
readme = (repo / "README.md").read_text()
assert row not in readme and row in docs.render(readme, repo)  # python -m mpifl.docs --write adds it
sys.path.insert(0, str(repo / "tests"))
import test_reliability

assert ("throwaway", "1:3:kill") in test_reliability.kill_cases()
print("checks passed")
'''


def test_a_new_module_is_everywhere_it_must_be(tmp_path):
    pkg = tmp_path / "mpifl"
    shutil.copytree(REPO / "mpifl", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "algorithms" / "throwaway.py").write_text(MODULE)
    (pkg / "algorithms" / "throwaway_params.py").write_text(PARAMS)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", CHECKS, str(REPO), str(pkg)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0 and "checks passed" in res.stdout, res.stderr[-3000:]

    args = ["data.name=synthetic", "data.n_samples=320", "data.n_clients=4", "model.hidden=[8]", "run.rounds=3",
            "run.threads=1", "algorithm.name=throwaway", "algorithm.fraction=0.5", f"run.out_dir={tmp_path}",
            "run.name=new"]
    run = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "mpifl.main", *args],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    log = open_run(tmp_path / "new")
    assert log.attrs["algorithm"] == "throwaway" and log.n_rounds == 3
    assert np.isfinite(np.nanmean(log.metric("test_acc")[-1]))
