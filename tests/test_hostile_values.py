"""Every numeric key of ``python -m mpifl.config`` with hostile values (0, -1,
1e9, 1e18, nan, inf, and the integers 10**9 and 10**18): each is refused in one
line naming the key (:class:`ConfigError`, exit 2), or sized by the preflight
(:mod:`mpifl.run.memory`: memory and time), or runs; never a traceback. A diverging
server step names its own key."""

from __future__ import annotations

import pytest
import torch

from mpifl import config
from mpifl.comm import world
from mpifl.errors import ConfigError
from mpifl.run import memory as sizes
from mpifl.run import runtime
from mpifl.train import NonFiniteError

VALUES = ("0", "-1", "1e9", "1e18", "nan", "inf", "1000000000", "1000000000000000000")
HUGE = ("1e18", "1000000000000000000")
TINY = ["data.name=synthetic", "data.n_samples=60", "data.n_clients=2", "data.n_clusters=1", "model.hidden=[4]",
        "run.threads=1", "run.rounds=1", "run.name=r", "train.local_epochs=1"]
NUMERIC = [k for k in config.key_docs() if k.type in ("int", "float", "list[int]")]


def overrides(key: str, kind: str, value: str) -> list[str]:
    """``key=value``, with the algorithm whose section the key is in chosen."""
    section = key.split(".")[0]
    chosen = [] if section in (*config.CORE_SECTIONS, *config.TAIL_SECTIONS) else [f"algorithm.name={section}"]
    return [*chosen, f"{key}={f'[{value}]' if kind == 'list[int]' else value}"]


def preflight(over: list[str], base: list[str] | None = None) -> object:
    """Load, validate and size as a run does before it allocates: the config, or
    the ConfigError that refuses it."""
    try:
        cfg = config.load(None, [*(base or []), *over])
        sizes.check_threads(cfg.run.threads)
        _, problem = sizes.assess(cfg, 1, 0, torch.device("cpu"), 0, 1)
        return ConfigError(problem) if problem else cfg
    except ConfigError as e:
        return e


@pytest.mark.slow  # about 30 values a second: a few seconds for the whole walk
def test_every_numeric_key_is_refused_in_one_line_or_sized():
    walked, refused = 0, 0
    for kd in NUMERIC:
        for value in VALUES:
            out = preflight(overrides(kd.key, kd.type, value))  # anything but a ConfigError fails the test here
            walked += 1
            if isinstance(out, ConfigError):
                refused += 1
                msg = str(out)
                assert "\n" not in msg
                # the key at fault is named: this key, or the count it makes too large
                assert msg.startswith(kd.key) or "is too large for this machine" in msg or \
                    "the run would take" in msg, (kd.key, value, msg)
            else:  # no key takes a negative or non-finite value: accepted, it would be a range nobody checked
                assert value not in ("nan", "inf", "-1"), (kd.key, value)
    assert walked == len(NUMERIC) * len(VALUES) and refused > walked // 2


def test_counts_too_large_name_their_key_not_another():
    for over, key in ((["train.local_epochs=1000000000"], "train.local_epochs"),
                      (["algorithm.name=dpfl", "dpfl.tau_init=1000000000"], "dpfl.tau_init"),
                      (["algorithm.name=pfedlia", "pfedlia.lia_epochs=1000000000"], "pfedlia.lia_epochs"),
                      (["run.rounds=1000000000000000000"], "run.rounds"),
                      (["model.hidden=[1000000000000000000]"], "model.hidden")):
        out = preflight(over)
        assert isinstance(out, ConfigError) and str(out).startswith(key + "="), (over, out)


@pytest.mark.slow  # one tiny run per accepted huge value (about 70)
def test_accepted_huge_values_run_a_round_or_stop_in_one_line(tmp_path):
    """What the preflight lets through runs (tiny data, one round) or stops with
    a one-line error: no traceback, nothing grows past the estimate's machine."""
    ran = 0
    for kd in NUMERIC:
        if kd.key == "run.rounds":  # long on purpose: test_counts_that_would_never_finish... bounds it
            continue
        for value in HUGE:
            over = [*overrides(kd.key, kd.type, value), f"run.out_dir={tmp_path / f'{kd.key}-{value}'}"]
            cfg = preflight(over, TINY)
            if isinstance(cfg, ConfigError):
                continue
            try:
                runtime.run(cfg, world())
                ran += 1
            except (ConfigError, NonFiniteError) as e:  # the one-line errors, exit 2 / exit 1 without traceback
                assert "\n" not in str(e), (kd.key, value, e)
    assert ran > 10


@pytest.mark.slow  # three rounds of two runs
def test_a_diverging_server_step_names_its_own_key(tmp_path):
    base = ["data.n_samples=400", "data.n_clients=2", "data.n_clusters=1", "run.threads=1", "run.rounds=3",
            "algorithm.name=fedadam", "fedadam.lr=1e11", f"run.out_dir={tmp_path}"]
    with pytest.raises(NonFiniteError, match=r"the server's step diverged; lower fedadam\.lr \(now 1e\+11\)") as e:
        runtime.run(config.load(None, base), world())
    assert "train.lr" not in str(e.value)
    with pytest.raises(NonFiniteError, match=r"lower train\.lr") as e:  # the clients' own step: train.lr
        runtime.run(config.load(None, [*base, "fedadam.lr=0.01", "train.lr=1e30", "run.name=r2"]), world())
