"""Config loading details not covered by the bad-input corpus."""

import math
from pathlib import Path

from mpifl import config

README = Path(__file__).resolve().parents[1] / "README.md"


def test_yaml_and_overrides_merge_and_coerce(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("run: {rounds: 7}\ntrain: {batched: off}\n")
    cfg = config.load(f, ["train.lr=1e-3", "model.hidden=[8, 4]", "dpfl.budget=0.1N", "run.rounds=9"])
    assert cfg.run.rounds == 9 and cfg.train.lr == 0.001 and cfg.model.hidden == [8, 4]
    assert cfg.train.batched == "off"  # YAML 1.1 reads off as false
    assert cfg.dpfl.budget_for(20) == 2
    assert math.isinf(config.load(None, ["train.weight_decay=inf"]).train.weight_decay)


def test_resolved_config_round_trips(tmp_path):
    cfg = config.load(None, ["run.seed=3", "algorithm.name=federico"])
    f = tmp_path / "back.yaml"
    f.write_text(cfg.to_yaml())
    assert config.load(f) == cfg


def test_readme_reference_is_current():
    assert config.reference() in README.read_text()
