"""Every command the docs show either runs (slow tier, shortened through its
documented overrides) or is marked ``<!-- example -->``; example commands still
name configs and sweeps that load; docs/analysis.md's Python runs; quoted YAML
files match; the docsync markers are the ones mpifl.docs.sync makes. Conventions:
docs/README.md."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from doc_blocks import Block, all_blocks, blocks, documents
from helpers import MPIEXEC, REPO

from mpifl import config
from mpifl.docs import sync as docsync
from mpifl.errors import ConfigError
from mpifl.sweep import rundirs as sweep_rundirs
from mpifl.sweep import spec as sweep_spec

ROUNDS = "run.rounds=2"  # how short a documented run becomes here
PYTHON_PAGES = {"docs/analysis.md"}  # pages whose python blocks run


class Unrunnable(ValueError):
    """A command this test cannot run; its block needs the example marker."""


def module(argv: list[str]) -> str | None:
    mods = [argv[i + 1] for i, t in enumerate(argv[:-1]) if t == "-m"]
    return mods[-1] if mods else None


def runnable(cmd: str) -> list[str]:
    """The command as this test runs it: this interpreter and its mpiexec,
    shortened (``run.rounds=2``; ``--set run.rounds=2`` for a sweep)."""
    if re.search(r"&&|\|\||(?<![\\'\"])\|(?!\|)|;", cmd):
        raise Unrunnable(f"{cmd!r}: a chain of commands")
    out = []
    for t in shlex.split(cmd, comments=True):
        name = Path(t).name
        if name in ("python", "python3"):
            out.append(sys.executable)
        elif name in ("mpiexec", "mpirun"):
            out.append(str(MPIEXEC))
        elif re.fullmatch(r"[A-Z]+(\.yaml)?", t) or "{" in t or t in ("[", "|", "]"):
            raise Unrunnable(f"{cmd!r}: placeholder {t!r}")
        else:
            out.append(t)
    if out[0] != sys.executable and out[0] != str(MPIEXEC):
        raise Unrunnable(f"{cmd!r}: {out[0]} is not python or mpiexec")
    mod = module(out)
    if mod == "mpifl.main":
        return [*out, ROUNDS]
    if mod == "mpifl.sweep" and "--run" not in out:
        return [*out, "--set", ROUNDS]
    if mod in ("mpifl.analyze", "mpifl.config", "mpifl.sweep"):
        return out
    raise Unrunnable(f"{cmd!r}: this test does not know how to shorten {mod or out[1]}")


def _blocks_to_run() -> list[Block]:
    return [b for b in all_blocks() if not b.example and (b.commands() or b.lang == "python")]


# --------------------------------------------------------------------------- fast: what the docs claim


def test_every_command_block_runs_or_is_marked_an_example():
    bad = []
    for b in _blocks_to_run():
        rel = str(b.path.relative_to(REPO))
        if b.lang == "python" and rel not in PYTHON_PAGES:
            bad.append(f"{b.where}: a python block outside {sorted(PYTHON_PAGES)}: mark it <!-- example -->")
        for cmd in b.commands():
            try:
                runnable(cmd)
            except Unrunnable as e:
                bad.append(f"{b.where}: {e}; mark the block <!-- example: why --> or make it runnable")
    assert len(all_blocks()) > 50
    assert not bad, "\n".join(bad)


def _config_args(argv: list[str]) -> tuple[str, list[str]] | None:
    """(config file, overrides) of an mpifl.main/config/check command, None without
    an existing file or with placeholders."""
    rest = argv[argv.index(module(argv)) + 1:]
    if not rest or not (REPO / rest[0]).is_file():
        return None
    over = [t for t in rest[1:] if not t.startswith("-")]
    if any(re.search(r"=([A-Z]+|.*[{}\[|])$", t) for t in over):
        return None
    return rest[0], over


def test_every_command_names_configs_and_sweeps_that_load():
    """Examples too: a renamed key, a removed file or a bad value in any command
    the docs show fails here."""
    checked, bad = 0, []
    for b in all_blocks():
        for cmd in b.commands():
            try:
                argv = shlex.split(cmd, comments=True)
            except ValueError:
                continue
            mod = module(argv)
            try:
                if mod in ("mpifl.main", "mpifl.config", "mpifl.check") and _config_args(argv):
                    path, over = _config_args(argv)
                    config.load(REPO / path, over)
                    checked += 1
                elif mod == "mpifl.sweep" and "--run" not in argv:
                    # the shipped sweeps' points are validated by test_sweep.py; here the file and --set
                    rest = argv[argv.index(mod) + 1:]
                    sets = [rest[i + 1] for i, t in enumerate(rest[:-1]) if t == "--set"]
                    if not (REPO / rest[0]).is_file():
                        bad.append(f"{b.where}: {rest[0]} does not exist")
                        continue
                    grid = (yaml.safe_load((REPO / rest[0]).read_text()) or {}).get("grid") or {}
                    sweep_spec.command_line_set(sets, grid if isinstance(grid, list) else [grid])
                    config.load(None, sets)
                    checked += 1
            except ConfigError as e:
                bad.append(f"{b.where}: {cmd}: {e}")
    assert checked > 20
    assert not bad, "\n".join(bad)


def test_a_yaml_block_quoting_a_file_holds_what_the_file_holds():
    quoted = 0
    for b in all_blocks():
        first = b.text.splitlines()[0] if b.text else ""
        m = re.fullmatch(r"#\s*((?:jobs|slurm|tests)/\S+\.ya?ml)\s*", first)
        if b.lang == "yaml" and m:
            assert yaml.safe_load(b.text) == yaml.safe_load((REPO / m[1]).read_text()), f"{b.where} quotes {m[1]}"
            quoted += 1
    assert quoted >= 1


def test_the_readmes_launch_forms_are_the_ones_help_shows():
    from mpifl.main import EPILOG

    usage = next(b for b in blocks(REPO / "README.md") if "python -m mpifl.main CONFIG.yaml" in b.text)
    forms = [re.sub(r"-n \d+", "-n R", c.split("CONFIG.yaml")[0]).strip() for c in usage.commands()]
    assert len(forms) == 4
    for form in forms:
        assert form in EPILOG, form


def test_every_docsync_block_in_the_docs_is_one_it_makes():
    in_docs = docsync.blocks_in_docs()
    assert set(in_docs) == {b for names in docsync.BLOCKS.values() for b in names}
    assert set(docsync.BLOCKS) == set(docsync.TARGETS)
    for name, (path, body) in in_docs.items():
        assert body.startswith("\n") and body.endswith("\n\n"), f"{name} in {path}: blank lines around the block"


def test_docsync_compares_numbers_exactly_and_timings_not_at_all(tmp_path):
    docs = {"q": (REPO / "README.md", "\n    round 1/30  test_acc 0.5663  0.03s/round  eta 1s\n\n")}
    same = docsync.Output({"q": "\n    round 1/30  test_acc 0.5663  1.20s/round  eta 31s\n\n"})
    other = docsync.Output({"q": "\n    round 1/30  test_acc 0.5664  0.03s/round  eta 1s\n\n"})
    assert docsync.compare(same, docs) == []
    (line,) = docsync.compare(other, docs)
    assert "block q in README.md differs" in line and "0.5663" in line


def test_docsync_writes_a_block_between_its_markers_and_keeps_recorded_timings(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("before\n<!-- docsync q -->\n\n    round 1  0.50  0.03s/round\n\n<!-- /docsync q -->\nafter\n")
    body = lambda: docsync.MARKER.search(doc.read_text())["body"]  # noqa: E731
    assert docsync.write(docsync.Output({"q": "\n    round 1  0.50  9.99s/round\n\n"}), {"q": (doc, body())}) == []
    assert "0.03s/round" in doc.read_text()  # only a timing differed: the record stays
    changed = docsync.write(docsync.Output({"q": "\n    round 1  0.51  9.99s/round\n\n"}), {"q": (doc, body())})
    assert changed == [f"{doc}: q"]
    assert doc.read_text() == ("before\n<!-- docsync q -->\n\n    round 1  0.51  9.99s/round\n\n"
                               "<!-- /docsync q -->\nafter\n")


# --------------------------------------------------------------------------- docs/analysis.md


def _python_blocks(page: str) -> list[Block]:
    return [b for b in blocks(REPO / page) if b.lang == "python" and not b.example]


def _run_python_blocks(page: str, where: Path, monkeypatch) -> dict:
    monkeypatch.chdir(where)
    ns: dict = {}
    for b in _python_blocks(page):
        exec(compile(b.text, b.where, "exec"), ns)  # noqa: S102 - the page's own code
    return ns


def _hand_written_sweep(root: Path) -> None:
    """results/quickstart-baselines as the sweep would leave it, logs written here."""
    from mpifl.logging.h5 import Writer
    from mpifl.paths import RunDir

    s = sweep_spec.load(REPO / "jobs/sweeps/quickstart-baselines.yaml", out_dir=str(root / "results"),
                overrides=["run.rounds=3"])
    sweep_rundirs.write(s, root)
    rng = np.random.default_rng(0)
    for p in s.points:
        cfg, n = p.config, p.config.data.n_clients
        w = Writer(RunDir(cfg.run_dir).log, {"algorithm": cfg.algorithm.name, "seed": cfg.run.seed, "n_clients": n,
                                             "config_yaml": cfg.to_yaml()},
                   {"cluster": np.arange(n) % 4, "rank": np.arange(n) * 2 // n, "n_test": np.full(n, 20)}, n)
        for t in range(3):
            acc = rng.random(n)
            w.write_round(t, {"wall_s": 0.1}, {"metrics/test_acc": acc, "metrics/val_acc": acc,
                                               "comm/bytes_recv": np.full(n, 1000.0 * t)})
        w.close()


def test_the_analysis_page_runs_on_logs_shaped_like_its_sweep(tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    _hand_written_sweep(tmp_path)
    ns = _run_python_blocks("docs/analysis.md", tmp_path, monkeypatch)
    assert len(ns["df"]) == 9 and set(ns["table"].index) == {"local", "fedavg", "oracle"}
    assert list(ns["acc"].columns) == ["round", "client", "cluster", "rank", "value"]
    assert (tmp_path / "test_acc_long.csv").is_file() and (tmp_path / "per_cluster.png").is_file()


# --------------------------------------------------------------------------- slow: the commands themselves


def _scratch(tmp: Path) -> Path:
    """A working folder that sees the repository's jobs/ (results land in it)."""
    for name in ("jobs",):
        (tmp / name).symlink_to(REPO / name)
    return tmp


@pytest.mark.slow
def test_every_unmarked_command_of_the_docs_runs(tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    work = _scratch(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done: set[str] = set()
    ran = 0
    for path in documents():
        ns: dict = {}  # a page's python blocks share their names, as in a notebook
        for b in blocks(path):
            if b.example:
                continue
            for cmd in b.commands():
                argv = runnable(cmd)
                if shlex.join(argv) in done:  # the same command on another page: its output is there
                    continue
                res = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=1800,
                                     check=False)
                assert res.returncode == 0, f"{b.where}: {shlex.join(argv)}\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
                done.add(shlex.join(argv))
                ran += 1
            if b.lang == "python" and str(path.relative_to(REPO)) in PYTHON_PAGES:
                monkeypatch.chdir(work)
                exec(compile(b.text, b.where, "exec"), ns)  # noqa: S102 - the page's own code
    assert ran >= 6


@pytest.mark.slow
def test_docsync_check_of_the_quickstart_passes():
    res = subprocess.run([sys.executable, "-m", "mpifl.docs.sync", "--check", "--only", "quickstart"], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
