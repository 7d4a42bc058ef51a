"""Sizes checked before anything is allocated (mpifl.run.memory): the estimate from the
config alone agrees with what a run builds, the memory a rank has comes from
MemAvailable and the cgroup limit, and absurd n_clients, hidden sizes or threads
exit 2 in one line naming the key and the estimate, within seconds."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import REPO

from mpifl import config, models
from mpifl.comm import world
from mpifl.data import build as build_data
from mpifl.data import datasets
from mpifl.data.shape import shape
from mpifl.errors import ConfigError
from mpifl.run import memory as sizes
from mpifl.run import runtime
from mpifl.train import Clients

QUICK = str(REPO / "jobs" / "quickstart.yaml")
ABSURD = {"data.n_clients=1000000000": "data.n_clients=1000000000 is too large for this machine",
          "model.hidden=[100000000]": "model.hidden=[100000000] is too large for this machine",
          "run.threads=100000": "run.threads=100000 is not allowed here: this process may use",
          # counts: the batch plan of every epoch's steps is built at once
          "train.local_epochs=9999999": "train.local_epochs=9999999 is too large for this machine",
          "algorithm.name=dpfl dpfl.tau_init=9999999": "dpfl.tau_init=9999999 is too large for this machine"}


@pytest.mark.parametrize("name", ["digits", "mnist1d", "synthetic", "fashionmnist"])
def test_the_shape_from_the_config_is_the_loaded_datasets(name):
    cfg = config.load(None, [f"data.name={name}", "data.n_samples=600"]).data
    if name == "fashionmnist" and not datasets.data_path(cfg).exists():
        pytest.skip(f"fashionmnist is not on this machine ({datasets.data_path(cfg)})")
    pool, d = datasets.load(cfg, 0), shape(cfg)
    assert (d.in_shape, d.n_classes, d.n_samples, d.stored_bytes) == \
        (pool.shape, pool.n_classes, len(pool.y), pool.x.dtype.itemsize)


def test_features_shape_is_read_from_the_npz_header(tmp_path):
    np.savez(tmp_path / "f.npz", x=np.zeros((37, 12), np.float32), y=np.arange(37) % 5)
    cfg = config.load(None, ["data.name=features", f"data.root={tmp_path / 'f.npz'}"]).data
    s = shape(cfg)
    assert (s.in_shape, s.n_classes, s.n_samples) == ((12,), 5, 37)
    missing = config.load(None, ["data.name=features", f"data.root={tmp_path / 'none.npz'}"]).data
    assert shape(missing) is None  # loading it says why; the estimate is left out


@pytest.mark.parametrize("model", ["mlp", "lenet", "cnn_dpfl", "cnn2", "resnet18"])
def test_parameters_counted_on_the_meta_device_are_the_built_models(model):
    cfg = config.load(None, [f"model.name={model}", "model.hidden=[16, 8]"]).model
    in_shape = (40,) if model == "mlp" else (3, 32, 32)
    built = models.build(cfg, in_shape, 10, 0)
    assert models.sizes(cfg, in_shape, 10) == (models.n_params(built), sum(b.numel() for b in built.buffers()))


@pytest.mark.parametrize(("over", "rows"), [([], 1), (["train.momentum=0.9"], 2), (["train.optimizer=adam"], 3),
                                            (["train.optimizer=adam", "train.on_nonfinite=skip"], 6)])
def test_the_estimate_counts_what_the_clients_keep(over, rows):
    base = ["data.name=synthetic", "data.n_samples=400", "data.n_clients=10", "data.n_clusters=2",
            "model.hidden=[8]", *over]
    cfg = config.load(None, base)
    est = sizes.estimate(cfg, 2, 1, on_gpu=False)
    data = build_data(cfg.data, 0, np.arange(5, 10))
    c = Clients(models.build(cfg.model, data.in_shape, data.n_classes, 0), data, cfg.train, torch.device("cpu"), 0)
    kept = c.params.numel() + sum(v.numel() for v in c.opt.state.values())
    assert est.n_local == c.n == 5 and est.params == c.P and est.rows == rows
    assert est.n_local * (est.rows * est.params + est.extra) >= kept  # never less than the rows and state kept
    assert 0.8 * est.data <= c.x.numel() * 4 <= 1.25 * est.data  # this rank's samples, as float32
    assert est.host >= est.clients + est.data + sizes.PER_CLIENT * 10  # on the CPU everything is on the host


def test_memory_available_is_memavailable_capped_by_the_tightest_cgroup(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684092 kB\nMemAvailable:   20000000 kB\n")
    monkeypatch.setattr(sizes, "MEMINFO", meminfo)
    cg = tmp_path / "cgroup"
    job = cg / "system.slice" / "job_7" / "step_0"
    job.mkdir(parents=True)
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text("123\n")
    (cg / "system.slice" / "job_7" / "memory.max").write_text(f"{4 << 30}\n")  # SLURM's job limit
    (cg / "system.slice" / "job_7" / "memory.current").write_text(f"{1 << 30}\n")
    (job / "memory.max").write_text("max\n")
    (job / "memory.current").write_text(f"{1 << 30}\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/system.slice/job_7/step_0\n")
    monkeypatch.setattr(sizes, "CGROUP", cg)
    monkeypatch.setattr(sizes, "PROC_CGROUP", proc)
    assert sizes.host_available() == (3 << 30, "cgroup memory limit")
    (cg / "system.slice" / "job_7" / "memory.max").write_text("max\n")
    assert sizes.host_available() == (20000000 * 1024, "MemAvailable")
    host, dev, how = sizes.available(None, 4, 4)
    assert host == 20000000 * 1024 // 4 and dev is None and "4 rank(s) on the node" in how


def test_threads_past_the_cpus_of_the_process_are_refused(monkeypatch):
    monkeypatch.setattr(sizes.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    sizes.check_threads(0)
    sizes.check_threads(3)
    with pytest.raises(ConfigError, match=r"run.threads=4 is not allowed here: this process may use 3 CPU\(s\)"):
        sizes.check_threads(4)


@pytest.mark.parametrize("over", list(ABSURD))
def test_absurd_sizes_are_refused_before_anything_is_allocated(tmp_path, over):
    cfg = config.load(QUICK, [*over.split(), f"run.out_dir={tmp_path}"])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ConfigError) as e:
        runtime.setup(cfg, world())
    msg = str(e.value)
    assert msg.startswith(ABSURD[over]) and "\n" not in msg
    if "threads" not in over:
        assert "the run needs at least " in msg and ("TiB per rank" in msg or "GiB per rank" in msg)
        if torch.cuda.is_available():  # run.device=auto: the GPU's free memory is the limit
            assert "on its GPU" in msg and "GPU free memory" in msg
        else:
            assert "of host memory (MemAvailable" in msg or "of host memory (cgroup" in msg
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB
    assert grew < 512 * 1024
    assert not (tmp_path / "quickstart").exists()


@pytest.mark.slow  # starts the interpreter: the whole entry point, as a user runs it
@pytest.mark.parametrize("over", list(ABSURD))
def test_absurd_sizes_exit_2_in_one_line_from_the_entry_point(tmp_path, over):
    # mpifl.main's main(), then the process's peak memory on stdout
    # VmHWM, not ru_maxrss: Linux carries a forking parent's peak (pytest's) across exec into ru_maxrss
    probe = ("import re, sys; from mpifl.main import main; rc = main(sys.argv[1:]); "
             "print(re.search(r'VmHWM:\\s*(\\d+) kB', open('/proc/self/status').read())[1]); sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", probe, QUICK, *over.split(), f"run.out_dir={tmp_path}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mpifl: error: {ABSURD[over]}")
    assert int(res.stdout) < 2 << 20  # KiB: the interpreter and torch, nothing of the run


@pytest.mark.parametrize(("over", "key"), [(["run.rounds=1000000000000000000"], "run.rounds=1000000000000000000"),
                                          (["train.local_epochs=1000000000000000", "data.n_clients=1",
                                            "data.n_clusters=1"], "train.local_epochs=1000000000000000")])
def test_counts_that_would_never_finish_are_refused_naming_the_count(over, key):
    """What allocates little still takes time: the lower bound of the run's time
    names the count that sets it."""
    cfg = config.load(QUICK, over)
    est = sizes.estimate(cfg, 1, 0, on_gpu=False)
    with pytest.raises(ConfigError, match=f"^{key} is not allowed: the run would take at least [0-9.e+]+ years"):
        sizes.check_duration(cfg, est)
    sizes.check_duration(config.load(QUICK, ["run.rounds=1000000"]), est)  # long, not endless: taken


@pytest.mark.parametrize(("over", "key"), [
    (["train.batch_size=10000000000"], "train.batch_size=10000000000"),
    (["data.n_samples=10000000000"], "data.n_samples=10000000000"),
    (["algorithm.name=fedrep", "fedrep.head_epochs=100000000"], "fedrep.head_epochs=100000000"),
    (["algorithm.name=fedavg_ft", "fedavg_ft.ft_epochs=100000000"], "fedavg_ft.ft_epochs=100000000"),
])
def test_the_refusal_names_the_key_whose_part_of_the_estimate_is_largest(over, key):
    cfg = config.load(QUICK, over)
    est = sizes.estimate(cfg, 1, 0, on_gpu=False)
    assert est.culprit(cfg) == key
    assert est.host > 1 << 40  # over a TiB: refused on any node


def test_an_image_model_on_vector_data_is_refused_in_the_models_own_words():
    """The estimate's "cannot be sized" (torch overflow) must not swallow the model's
    own refusal: it said "use smaller widths" to an image model given 40-long vectors."""
    cfg = config.load(QUICK, ["model.name=cnn_dpfl"])
    with pytest.raises(ConfigError) as e:
        sizes.estimate(cfg, 1, 0, False)
    assert str(e.value) == ("model.name='cnn_dpfl' needs image inputs [C, H, W]; the data gives shape (40,): "
                            "use model.name=mlp or an image dataset")


def test_an_algorithm_s_held_rows_join_the_estimate_and_refuse_what_would_be_killed(monkeypatch):
    """FedeRiCo holds 2 (k + 1) rows a client at once (its stacked models and their
    gradients, federico_params.held_rows): they join the rows, and the run that the
    OOM killer took at 10,000 clients on 2 ranks in 23 GiB (bench/README.md, cost
    against N) is refused at start, while FedAvg's of the same size is not."""
    room = ["data.name=synthetic", "data.n_samples=500000", "data.synthetic_dim=784", "data.n_clients=10000",
            "model.hidden=[64]", "train.optimizer=adam"]
    fedavg = sizes.estimate(config.load(None, [*room, "algorithm.name=fedavg"]), 2, 0, on_gpu=False)
    for k in (3, 5):
        fed = sizes.estimate(config.load(None, [*room, "algorithm.name=federico", f"federico.k={k}"]), 2, 0,
                             on_gpu=False)
        assert fed.rows - fedavg.rows == 2 * (k + 1) and fed.host > fedavg.host
    monkeypatch.setattr(sizes, "host_available", lambda: (23 << 30, "MemAvailable (test)"))
    _, fine = sizes.assess(config.load(None, [*room, "algorithm.name=fedavg"]), 2, 0, torch.device("cpu"), 0, 2)
    _, refused = sizes.assess(config.load(None, [*room, "algorithm.name=federico"]), 2, 0, torch.device("cpu"), 0, 2)
    assert fine is None
    assert refused is not None and refused.startswith("data.n_clients=10000 is too large for this machine")
    assert "x 11 row(s) of 50,890 parameters" in refused


# the algorithms whose held_rows are rows of their State: each keeps at least that many
HELD_IN_STATE = ["apfl", "ditto", "feddyn", "moon", "pfedgraph", "pfedme", "scaffold"]


@pytest.mark.parametrize("name", HELD_IN_STATE)
@pytest.mark.parametrize("opt", [["train.optimizer=adam"], ["train.momentum=0.9"], []], ids=["adam", "momentum", "sgd"])
def test_held_rows_never_exceed_the_rows_an_algorithm_s_state_keeps(name, opt):
    """held_rows is a lower bound: after two rounds the algorithm's State holds at
    least that many [n_local, P] rows (its tensors and optimizer-state dicts of
    that width), and the estimate's rows are the engine's plus held_rows."""
    from mpifl import algorithms
    from mpifl.algorithms.base import Context
    from mpifl.comm import Comm, solo

    base = ["data.name=synthetic", "data.n_samples=300", "data.n_clients=4", "data.n_clusters=2", "model.hidden=[8]"]
    cfg = config.load(None, [*base, f"algorithm.name={name}", *opt])
    held = algorithms.config_part(name).held_rows(cfg)
    plain = sizes.estimate(config.load(None, [*base, "algorithm.name=fedavg", *opt]), 1, 0, on_gpu=False)
    assert sizes.estimate(cfg, 1, 0, on_gpu=False).rows == plain.rows + held >= plain.rows + 1
    comm = Comm(4, solo())
    data = build_data(cfg.data, 0, comm.local_ids)
    c = Clients(models.build(cfg.model, data.in_shape, data.n_classes, 0), data, cfg.train, torch.device("cpu"), 0)
    ctx = Context(cfg, comm, c, data)
    mod = algorithms.get(name)
    state = mod.init(ctx)
    for t in range(2):
        mod.round(ctx, state, t)

    def rows(v) -> int:
        if isinstance(v, dict):
            return sum(rows(x) for x in v.values())
        return int(v.numel() // (c.n * c.P)) if torch.is_tensor(v) and v.dim() == 2 and v.shape == (c.n, c.P) else 0

    kept = sum(rows(getattr(state, f)) for f in vars(state))
    assert kept >= held, (name, kept, held)
