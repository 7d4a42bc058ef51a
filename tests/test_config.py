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


def test_every_algorithm_module_is_registered_with_its_contract_and_section():
    import dataclasses
    import importlib
    import pkgutil
    import typing

    from mpifl import algorithms

    files = {m.name for m in pkgutil.iter_modules(algorithms.__path__)} - {"base"}
    assert set(algorithms.NAMES) == {f for f in files if not f.startswith("_")}
    hint = typing.get_type_hints(config.AlgorithmConfig)["name"]
    assert typing.get_args(hint) == algorithms.NAMES  # the one list of names
    cfg = config.Config()
    for name in algorithms.NAMES:
        mod = importlib.import_module(f"mpifl.algorithms.{name}")
        for attr in ("State", "init", "round", "evaluate"):
            assert hasattr(mod, attr), f"{name} has no {attr}"
        assert mod.__doc__ and "mpifl.main" in mod.__doc__, f"{name}'s docstring has no runnable command"
        params = getattr(mod, "Params", None)
        if params is not None:  # its section, every key defaulted, validating itself
            section = getattr(cfg, name)
            assert isinstance(section, params)
            assert all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                       for f in dataclasses.fields(params))
            section.validate(cfg)
            assert f"`{name}." in config.reference()
        # an algorithm picked by name loads with every default
        config.load(None, [f"algorithm.name={name}", "data.partition=clusters"])


def test_a_section_validates_itself_with_one_line_naming_the_key():
    import pytest

    for override, key in [("federico.eps=2", "federico.eps"), ("dpfl.period=0", "dpfl.period"),
                          ("pfedlia.xi=1", "pfedlia.xi"), ("fedc2i.alpha=-1", "fedc2i.alpha"),
                          ("fedem.components=0", "fedem.components"), ("fedem.components=65", "fedem.components"),
                          ("fedproto.lam=-1", "fedproto.lam"), ("fedproto.lam=.nan", "fedproto.lam"),
                          ("fedproto.lam=.inf", "fedproto.lam"), ("knn_per.k=0", "knn_per.k"),
                          ("knn_per.lam=1.5", "knn_per.lam"), ("knn_per.lam=-0.1", "knn_per.lam"),
                          ("knn_per.temperature=0", "knn_per.temperature"),
                          ("knn_per.temperature=.inf", "knn_per.temperature")]:
        with pytest.raises(config.ConfigError, match=f"^{key}=") as e:
            config.load(None, [override])
        assert "\n" not in str(e.value)


def test_resuming_a_checkpoint_from_before_a_key_existed_accepts_its_default(tmp_path):
    import pytest

    from mpifl import checkpoint

    cfg = config.load(None, ["run.seed=2"]).to_dict()
    older = {s: dict(v) for s, v in cfg.items()}
    del older["data"]["cluster_labels"]  # written by an mpifl that had no such key
    checkpoint.check_config({"config": older}, cfg, tmp_path)
    changed = config.load(None, ["run.seed=2", "data.cluster_labels=ordered"]).to_dict()
    with pytest.raises(config.ConfigError, match="data.cluster_labels"):
        checkpoint.check_config({"config": older}, changed, tmp_path)
