"""Config loading details not covered by the bad-input corpus."""

import dataclasses
import math
import re
from pathlib import Path

import pytest
from helpers import REPO, launch

from mpifl import algorithms, config
from mpifl.config import __main__ as config_cli
from mpifl.errors import ConfigError

README = REPO / "README.md"


def test_yaml_and_overrides_merge_and_coerce(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("run: {rounds: 7}\ntrain: {batched: off}\n")
    cfg = config.load(f, ["train.lr=1e-3", "model.hidden=[8, 4]", "dpfl.budget=0.1N", "run.rounds=9"])
    assert cfg.run.rounds == 9 and cfg.train.lr == 0.001 and cfg.model.hidden == [8, 4]
    assert cfg.train.batched == "off"  # YAML 1.1 reads off as false
    assert cfg.dpfl.budget_for(20) == 2
    assert math.isinf(config.coerce("inf", float, "train.weight_decay"))  # read as a float; validate refuses it
    with pytest.raises(ConfigError, match="train.weight_decay=inf is not allowed; must be a finite number"):
        config.load(None, ["train.weight_decay=inf"])


def test_resolved_config_round_trips(tmp_path):
    cfg = config.load(None, ["run.seed=3", "algorithm.name=federico"])
    f = tmp_path / "back.yaml"
    f.write_text(cfg.to_yaml())
    assert config.load(f) == cfg


def test_readme_reference_is_current():
    assert config.reference() in README.read_text()


def test_a_module_is_an_algorithm_by_what_it_defines_not_by_being_in_the_folder(tmp_path):
    from mpifl import algorithms

    (tmp_path / "helper.py").write_text("def step(ctx):\n    return None\n")
    (tmp_path / "algo.py").write_text("from .blocks import GlobalModel as State, init_global as init\n"
                                      "def round(ctx, state, t):\n    pass\n\nevaluate = round\n")
    (tmp_path / "half.py").write_text("class State:\n    pass\n\ndef round(ctx, state, t):\n    pass\n")
    (tmp_path / "_private.py").write_text((tmp_path / "algo.py").read_text())
    assert algorithms._discover(tmp_path) == ("algo",)
    assert algorithms.defines(tmp_path / "half.py") == {"State", "round"}  # a test of the package names it


def orphan_parts(folder: Path, names: tuple[str, ...]) -> list[str]:
    """Config parts (``<name>_params.py``) in ``folder`` with no algorithm ``<name>``
    (``shared_params`` holds the sections several subclass: no algorithm's)."""
    parts = {p.stem.removesuffix(algorithms.PARAMS) for p in folder.glob(f"*{algorithms.PARAMS}.py")} - {"shared"}
    return sorted(parts - set(names))


def test_every_algorithm_module_is_registered_with_its_contract_and_section():
    import dataclasses
    import importlib
    import inspect
    import pkgutil
    import typing

    from mpifl import algorithms
    from mpifl.algorithms.base import Algorithm

    files = {m.name: Path(algorithms.__file__).parent / f"{m.name}.py"
             for m in pkgutil.iter_modules(algorithms.__path__) if not m.name.startswith("_")}
    half = {n: algorithms.defines(p) for n, p in files.items() if algorithms.defines(p) not in (set(),
                                                                                               set(algorithms.CONTRACT))}
    assert half == {}, "modules defining part of base.Algorithm (State, init, round, evaluate)"
    assert set(algorithms.NAMES) == {n for n, p in files.items() if algorithms.defines(p)}
    assert {"base", "blocks", "head", "mixing", "state"} & set(algorithms.NAMES) == set()
    assert [n for n in algorithms.NAMES if n.endswith(algorithms.PARAMS)] == []  # a config part is no algorithm
    assert orphan_parts(Path(algorithms.__file__).parent, algorithms.NAMES) == [], "no algorithm of that name"
    assert typing.get_type_hints(config.AlgorithmConfig)["name"] is str  # the schema knows no algorithm
    assert f"one of {', '.join(algorithms.NAMES)} |" in config.reference()  # the registry's names, documented
    cfg = config.Config()
    for name in algorithms.NAMES:
        mod = importlib.import_module(f"mpifl.algorithms.{name}")
        assert isinstance(mod, Algorithm), f"{name} lacks part of base.Algorithm"
        assert dataclasses.is_dataclass(mod.State), name
        for attr in ("init", "round", "evaluate"):
            want = list(inspect.signature(getattr(Algorithm, attr)).parameters)[1:]  # without self
            assert list(inspect.signature(getattr(mod, attr)).parameters) == want, f"{name}.{attr}"
        if hasattr(mod, "check_config"):
            assert list(inspect.signature(mod.check_config).parameters) == ["cfg"], name
        assert mod.__doc__ and "mpifl.main" in mod.__doc__, f"{name}'s docstring has no runnable command"
        params = getattr(mod, "Params", None)
        if params is not None:  # its section, every key defaulted, validating itself
            section = getattr(cfg, name)
            assert type(section).__qualname__ == "Params"
            assert dataclasses.asdict(section) == dataclasses.asdict(params())
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
        with pytest.raises(ConfigError, match=f"^{key}=") as e:
            config.load(None, [override])
        assert "\n" not in str(e.value)


def test_resuming_a_checkpoint_from_before_a_key_existed_accepts_its_default(tmp_path):
    import pytest

    from mpifl.run import checkpoint

    cfg = config.load(None, ["run.seed=2"]).to_dict()
    older = {s: dict(v) for s, v in cfg.items()}
    del older["data"]["cluster_labels"]  # written by an mpifl that had no such key
    checkpoint.check_config({"config": older}, cfg, tmp_path)
    changed = config.load(None, ["run.seed=2", "data.cluster_labels=ordered"]).to_dict()
    with pytest.raises(ConfigError, match="data.cluster_labels"):
        checkpoint.check_config({"config": older}, changed, tmp_path)


def test_empty_config_file_is_one_line_saying_how_to_run_on_defaults(tmp_path, capsys):
    import pytest

    from mpifl.main import main

    for text in ("", "\n# only a comment\n"):
        f = tmp_path / "empty.yaml"
        f.write_text(text)
        with pytest.raises(ConfigError, match="is empty; to run on the defaults give no config file") as e:
            config.load(f)
        assert "\n" not in str(e.value)
        assert main([str(f), f"run.out_dir={tmp_path}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("mpifl: error: config file") and "python -m mpifl.main" in err[0]
    assert not (tmp_path / "run").exists()
    f.write_text("{}\n")  # an explicit empty mapping is a deliberate all-defaults file
    assert config.load(f) == config.load(None)


def test_string_keys_take_the_override_text_as_it_is():
    for text in ("off", "on", "yes", "no", "true", "null", "~", "007", "1e3", "[a]"):
        assert config.load(None, [f"run.name={text}"]).run.name == text
    assert config.load(None, ["federico.estep_batches=01"]).federico.estep_batches == "01"
    assert config.load(None, ["train.batched=off"]).train.batched == "off"  # a choice among strings
    cfg = config.load(None, ["run.rounds=7", "train.lr=1e-2", "dpfl.malicious_run_ggc=no", "model.hidden=[4]"])
    assert (cfg.run.rounds, cfg.train.lr, cfg.dpfl.malicious_run_ggc, cfg.model.hidden) == (7, 0.01, False, [4])
    import pytest

    with pytest.raises(ConfigError, match="unknown key 'run.nam'"):
        config.load(None, ["run.nam=off"])


def test_config_cli_prints_the_resolved_config_with_types_and_allowed_values(tmp_path, capsys):
    import yaml

    job = REPO / "jobs" / "quickstart.yaml"
    assert config_cli.main([str(job), "train.lr=0.1", "run.name=off"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# resolved: {job} train.lr=0.1 run.name=off\n")
    assert "  lr: 0.1  # float; must be a finite number > 0; default 0.05" in out
    assert "  device: auto  # str; one of auto, cpu, cuda; auto: node-local GPU if any" in out
    assert "  name: 'off'  # str; must be a plain non-empty directory name of at most 255 bytes; default 'run'" in out
    f = tmp_path / "resolved.yaml"
    f.write_text(out)
    assert yaml.safe_load(out)["run"]["name"] == "off"
    assert config.load(f) == config.load(job, ["train.lr=0.1", "run.name=off"])  # loads back to the same
    keys = {f"{s}.{k}" for s, v in yaml.safe_load(out).items() for k in v}
    assert keys == {k.key for k in config.key_docs()}  # every key
    assert config_cli.main([]) == 0
    assert capsys.readouterr().out.strip() == config.reference()
    assert config_cli.main([str(job), "train.lr=-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "mpifl.config: error: train.lr=-1.0 is not allowed; must be a finite number > 0"


def test_reference_has_types_and_allowed_values_for_every_key():
    docs = {k.key: k for k in config.key_docs()}
    assert docs["train.lr"].type == "float" and docs["train.lr"].allowed == "must be a finite number > 0"
    assert docs["run.device"].allowed == "one of auto, cpu, cuda"
    assert docs["dpfl.random_graph"].type == "bool" and docs["model.hidden"].type == "list[int]"
    assert docs["federico.eps"].allowed == "must be in [0, 1]"  # from an algorithm's own validate
    assert len(docs) == len(config.reference().splitlines()) - 2
    assert all(k.type in ("int", "float", "str", "bool", "list[int]") for k in docs.values())


@pytest.mark.slow
def test_config_command_reports_an_algorithms_bad_value_in_one_line():
    """``python -m mpifl.config`` runs the package's ``__main__``: the error an
    algorithm's ``Params.validate`` raises is the same class it catches."""
    res = launch([str(REPO / "jobs" / "quickstart.yaml"), "fedprox.mu=-1"], n=0, module="mpifl.config")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == "mpifl.config: error: fedprox.mu=-1.0 is not allowed; must be a finite number >= 0\n"


@pytest.mark.parametrize("override", ["train.lr=1e300", "train.lr=-1e39", "fedprox.mu=4e38"])
def test_a_number_beyond_float32_is_refused_naming_its_key(override):
    """Training computes in float32: a finite 1e300 overflowed there, in a traceback."""
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}=.* is not allowed; a finite number must be at most "
                                          r"3.4e38 in size"):
        config.load(None, [override])
    assert config.load(None, ["train.lr=3e38"]).train.lr == 3e38  # within float32's range


@pytest.mark.parametrize("override, hint", [
    ("trian.lr=0.1", "(did you mean 'train.lr'?)"),
    ("train.lrr=0.1", "unknown key 'train.lrr' (did you mean 'train.lr'?)"),
    ("algorithm.name=fedavgg", "algorithm.name='fedavgg' is not allowed (did you mean 'fedavg'?); choose one of"),
    ("data.partition=cluster", "(did you mean 'clusters'?)"),
])
def test_unknown_keys_and_names_get_a_did_you_mean(override, hint):
    with pytest.raises(ConfigError) as e:
        config.load(None, [override])
    assert hint in str(e.value) and "\n" not in str(e.value)


def test_a_key_close_to_nothing_gets_no_guess():
    with pytest.raises(ConfigError) as e:
        config.load(None, ["zzzz.qqq=1"])
    assert "did you mean" not in str(e.value)


def test_algorithm_errors_take_their_key_from_the_field_and_the_module():
    from mpifl import algorithms
    from mpifl.errors import check

    with pytest.raises(ConfigError, match=r"^fedyogi\.lr=-1\.0 is not allowed; must be a finite number > 0$"):
        config.load(None, ["fedyogi.lr=-1"])
    with pytest.raises(ConfigError, match=r"^federico\.k=30 is not allowed; must be <= data\.n_clients - 1"):
        config.load(None, ["algorithm.name=federico", "federico.k=30"])  # check_config: the chosen one's section
    with pytest.raises(ConfigError, match=r"^data\.val_frac=0\.0 is not allowed"):  # another section's key stays
        config.load(None, ["algorithm.name=dpfl", "data.val_frac=0"])

    @dataclasses.dataclass
    class Params:
        mu: float = 0.1

    with pytest.raises(TypeError, match="names 'nu' in an error, which is no key of its section"):
        with algorithms._keys_of("fedprox", Params):
            check(False, "nu", 1.0, "must be a typo")


def test_each_algorithm_receives_its_own_section_as_ctx_params():
    from mpifl.algorithms.base import Context

    cfg = config.load(None, ["algorithm.name=fedprox", "fedprox.mu=0.25"])
    assert Context(cfg, None, None, None).params is cfg.fedprox and cfg.fedprox.mu == 0.25
    assert Context(config.load(None, ["algorithm.name=fedavg"]), None, None, None).params is None  # no Params


def test_every_bare_key_an_algorithm_checks_is_a_field_of_its_params():
    """What the registry would refuse only when the error fires, seen in the source."""
    import ast

    from mpifl import algorithms

    for name in algorithms.NAMES:
        mod = algorithms.get(name)
        fields = {f.name for f in dataclasses.fields(mod.Params)} if hasattr(mod, "Params") else set()
        part = algorithms.config_part(name)
        text = "\n".join(Path(m.__file__).read_text() for m in (mod, part) if m is not None)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check" and len(node.args) == 4:
                key = node.args[1]
                if isinstance(key, ast.Constant) and "." not in key.value:
                    assert key.value in fields, f"{name} checks {key.value!r}, no key of its section"


@pytest.mark.parametrize("name", [n for n in algorithms.NAMES if algorithms.config_part(n) is not None])
def test_an_algorithms_config_part_is_the_one_its_module_and_the_config_hold(name):
    """One class per ``Params``: the algorithm's (``fedprox.Params``) is its config
    part's (``fedprox_params.Params``, imported without the training code), and so is
    the config's section; the same for ``check_config``, ``READS``, ``selection_samples``."""
    part, mod = algorithms.config_part(name), algorithms.get(name)
    assert part.__name__ == f"mpifl.algorithms.{name}_params"
    names = [a for a in ("Params", "check_config", "READS", "selection_samples") if hasattr(part, a)]
    assert names and [a for a in names if getattr(mod, a, None) is not getattr(part, a)] == []
    if "Params" in names:
        assert type(getattr(config.Config(), name)) is part.Params is mod.Params


def test_a_config_part_without_its_algorithm_is_named(tmp_path):
    """``<name>_params.py`` whose ``<name>.py`` is missing (renamed, or a typo) would be
    a section no algorithm reads: the registry test above names it; here it sees one."""
    (tmp_path / "algo.py").write_text("from .blocks import GlobalModel as State, init_global as init\n"
                                      "def round(ctx, state, t):\n    pass\n\nevaluate = round\n")
    (tmp_path / "algo_params.py").write_text("class Params:\n    pass\n")
    (tmp_path / "ago_params.py").write_text("class Params:\n    pass\n")
    names = algorithms._discover(tmp_path)
    assert names == ("algo",) and orphan_parts(tmp_path, names) == ["ago"]


@pytest.mark.parametrize("name", algorithms.NAMES)
def test_every_algorithms_checks_run_from_its_file(name):
    """Its Params.validate and check_config run as the config reads them (a name they
    use that only the training code imports would fail here, not in a user's run)."""
    for extra in ([], ["data.n_clients=3", "algorithm.fraction=0.5", "data.val_frac=0"]):
        try:
            config.load(None, [f"algorithm.name={name}", *extra])
        except ConfigError:
            pass  # a value the algorithm refuses: its check ran
