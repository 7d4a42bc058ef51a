"""The one YAML reader: alias bombs, self-references and deep nesting are refused
in one line, fast, wherever mpifl reads YAML (configs, sweeps, their base files,
table layouts, the config stored in a run log)."""

import time

import numpy as np
import pytest

from mpifl import analyze, config
from mpifl.analysis import paper_table
from mpifl.errors import ConfigError
from mpifl.logging.h5 import Writer
from mpifl.sweep import cli as sweep
from mpifl.sweep import spec as sweep_spec
from mpifl.yamlio import MAX_NODES, parse_yaml


def bomb(levels: int = 9, width: int = 9) -> str:
    """``a: &a [x, x, ...]``, then each line repeats the previous one ``width``
    times: a few hundred bytes standing for width**levels values."""
    names = [chr(ord("a") + i) for i in range(levels + 1)]
    lines = [f"{names[0]}: &{names[0]} [{', '.join(['x'] * width)}]"]
    for prev, cur in zip(names, names[1:]):
        lines.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * width)}]")
    return "\n".join(lines) + "\n"


def _quick(fn, *args) -> ConfigError:
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        fn(*args)
    assert time.perf_counter() - t0 < 10.0  # a walk of the expansion would take hours: the margin is for a loaded CI
    assert "\n" not in str(e.value)
    return e.value


def test_a_600_byte_bomb_is_refused_by_its_expansion():
    text = bomb()
    assert len(text) < 700
    err = _quick(parse_yaml, text, "file 'b.yaml'")
    assert str(err) == f"file 'b.yaml' expands to more than {MAX_NODES} values (through aliases); " \
                       f"that many are not allowed"


def test_anchors_within_the_budget_still_work():
    assert parse_yaml("x: &x [1, 2]\ny: *x\nz: {<<: {k: 1}}\n", "f") == {"x": [1, 2], "y": [1, 2], "z": {"k": 1}}
    small = parse_yaml(bomb(levels=3, width=4), "f")  # 4**4 values
    assert len(np.asarray(small["d"]).ravel()) == 4 ** 4


@pytest.mark.parametrize("text", ["a: &a [*a]", "a: &a {b: *a}", "a: &a [1, [2, *a]]"])
def test_an_alias_to_itself_is_refused(text):
    assert "refers to itself" in str(_quick(parse_yaml, text, "f"))


@pytest.mark.parametrize("text", ["[" * 17 + "]" * 17, "[" * 3000 + "]" * 3000])
def test_deep_nesting_is_refused(text):
    assert "levels deep" in str(_quick(parse_yaml, text, "f"))


def test_a_bomb_as_config_file_sweep_base_or_layout_is_one_line(tmp_path):
    f = tmp_path / "bomb.yaml"
    f.write_text(bomb())
    assert "bomb.yaml" in str(_quick(config.load, f))
    assert "bomb.yaml" in str(_quick(sweep_spec.load, f))
    s = tmp_path / "s.yaml"
    s.write_text("base: bomb.yaml\ngrid: {run.seed: [0]}\n")
    assert "bomb.yaml" in str(_quick(sweep_spec.load, s))
    assert "bomb.yaml" in str(_quick(paper_table.load_layout, f))


def test_a_sweep_whose_base_is_not_yaml_is_one_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("run: [1, 2\n")
    s = tmp_path / "s.yaml"
    s.write_text("base: bad.yaml\ngrid: {run.seed: [0]}\n")
    assert "is not valid YAML" in str(_quick(sweep_spec.load, s))


def test_a_log_storing_a_bomb_as_its_config_is_skipped_in_one_line(tmp_path):
    cfg = config.load(None, ["run.rounds=1"])
    ok = tmp_path / "ok" / "run.h5"
    bad = tmp_path / "bad" / "run.h5"
    for path, text in ((ok, cfg.to_yaml()), (bad, bomb())):
        path.parent.mkdir()
        w = Writer(path, {"algorithm": "fedavg", "seed": 0, "n_clients": 2, "config_yaml": text},
                   {"cluster": np.zeros(2, int), "n_test": np.ones(2)}, 2)
        w.write_round(0, {"wall_s": 1.0}, {"metrics/test_acc": np.ones(2), "metrics/val_acc": np.ones(2)})
        w.close()
    said = []
    t0 = time.perf_counter()
    made = analyze.analyze([tmp_path], tmp_path / "out", heatmaps="none", echo=lambda *a, **k: said.extend(a))
    assert time.perf_counter() - t0 < 30  # the bomb is not expanded (it would take hours)
    assert len(made["runs"]) == 1
    assert said[0] == (f"skipped {bad}: the config stored in {str(bad)!r} expands to more than {MAX_NODES} "
                       f"values (through aliases); that many are not allowed")


def test_every_entry_point_exits_2_on_a_bomb_within_a_second(tmp_path, capsys):
    from mpifl import check
    from mpifl import main as entry
    from mpifl.config import __main__ as config_cli

    f = tmp_path / "bomb.yaml"
    f.write_text(bomb())
    s = tmp_path / "s.yaml"
    s.write_text("base: bomb.yaml\ngrid: {run.seed: [0]}\n")
    log = tmp_path / "run" / "run.h5"  # a run log whose stored config is a bomb
    log.parent.mkdir()
    w = Writer(log, {"algorithm": "fedavg", "seed": 0, "n_clients": 2, "config_yaml": bomb()},
               {"cluster": np.zeros(2, int), "n_test": np.ones(2)}, 2)
    w.write_round(0, {"wall_s": 1.0}, {"metrics/test_acc": np.ones(2), "metrics/val_acc": np.ones(2)})
    w.close()
    calls = {"main": (entry.main, [str(f)]), "config": (config_cli.main, [str(f)]), "check": (check.main, [str(f)]),
             "sweep": (sweep.main, [str(f), "--dry-run"]), "sweep base": (sweep.main, [str(s), "--dry-run"]),
             "analyze": (analyze.main, [str(log.parent), "--out", str(tmp_path / "out")])}
    for what, (fn, argv) in calls.items():
        t0 = time.perf_counter()
        rc = fn(argv)
        took = time.perf_counter() - t0
        out, err = capsys.readouterr()
        assert rc == 2 and took < 10.0, (what, rc, took)  # expanding it: hours
        assert len(err.strip().splitlines()) == 1, (what, err)
        said = err if what != "analyze" else out  # analyze names the skipped log, then finds none readable
        assert f"expands to more than {MAX_NODES} values" in said, (what, out, err)


def test_a_tab_in_the_indentation_is_named(tmp_path):
    f = tmp_path / "tab.yaml"
    f.write_text("run:\n  seed: 1\n\trounds: 3\n")
    assert str(_quick(config.load, f)) == (f"config file {str(f)!r} is not valid YAML (line 3: a tab in column 1; "
                                           f"YAML indents with spaces)")
    f.write_text("run: [1, 2\n")  # no tab: the line alone
    assert str(_quick(config.load, f)).endswith("is not valid YAML (line 2)")
