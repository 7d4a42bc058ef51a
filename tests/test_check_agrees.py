"""``mpifl.check`` is ``mpifl.main``'s preflight: every config of the corpus in
tests/bad_configs/ (each file says in a comment what is wrong) is refused by the
run before its first round and reported as a problem by the check, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpifl import check, config
from mpifl.comm import world
from mpifl.errors import ConfigError
from mpifl.logging.h5 import open_run
from mpifl.run import runtime

CORPUS = sorted((Path(__file__).parent / "bad_configs").glob("*.yaml"))


def _main(path: str | None, overrides: list[str]) -> str | None:
    """What mpifl.main says of the config (its error line), None where it runs."""
    try:
        runtime.run(config.load(path, overrides), world())
    except ConfigError as e:
        return str(e)
    return None


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_every_config_main_refuses_check_reports(path, tmp_path):
    overrides = [f"run.out_dir={tmp_path}"]
    refused = _main(str(path), overrides)
    assert refused is not None and "\n" not in refused, "the corpus holds configs main refuses"
    assert not list(tmp_path.rglob("run.h5"))  # refused before any round
    _, problems = check.run(str(path), overrides, world())
    assert problems and all("\n" not in p for p in problems), problems
    # the check's line is about what the run's is: the same section (data, run, ...) or file
    assert any(refused.split(".")[0] in p for p in problems), (refused, problems)


def test_a_run_directory_of_another_experiment_is_a_problem_for_both(tmp_path):
    tiny = ["data.name=synthetic", "data.n_samples=200", "data.n_clients=4", "data.n_clusters=2",
            "model.hidden=[8]", "run.threads=1", "run.rounds=1", "run.name=r", f"run.out_dir={tmp_path}"]
    assert _main(None, tiny) is None and open_run(tmp_path / "r").attrs["n_ranks"] == 1
    other = [*tiny, "train.lr=0.5"]
    refused = _main(None, other)
    assert refused is not None
    _, problems = check.run(None, other, world())
    assert problems == [refused]


HUGE = "9" * 5000  # past Python's 4,300 digits of text to int


@pytest.mark.parametrize("override", [f"run.seed={HUGE}", f"run.seed={2**64}", f"model.hidden=[8,{2**70}]",
                                      f"data.n_clients={-2**63 - 1}", f"train.lr={10**400}", f"train.lr={HUGE}"])
def test_a_huge_integer_in_any_key_is_one_line(override):
    with pytest.raises(ConfigError) as e:
        config.load(None, [override])
    key = override.split("=")[0]
    assert "\n" not in str(e.value) and key in str(e.value) and len(str(e.value)) < 600, str(e.value)[:300]


def test_a_huge_integer_in_a_sweep_flag_is_one_line():
    from mpifl.sweep.select import parse_points

    for text in (HUGE, f"0-{HUGE}", f"{2**64}"):
        with pytest.raises(ConfigError, match=r"^--points '.*' is not allowed"):
            parse_points(text, 10)
    assert parse_points("0-2,9", 10) == {0, 1, 2, 9}
