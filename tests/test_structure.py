"""The package's import graph: no cycles, counting every import (inside functions
and type-only ones under ``if TYPE_CHECKING`` too: a cycle of type hints is still
two modules that cannot be read apart), and the leaf modules stay leaves."""

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "mpifl"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str], root: Path) -> set[str]:
    """mpifl modules ``path`` imports (anywhere in the file, type-only ones included)."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "mpifl")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "mpifl":
                subs = {f"{target}.{a.name}" for a in node.names} & modules
                found.update(subs)
                if len(subs) < len(node.names):  # a name defined in the module itself (not only submodules)
                    found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != name}


@functools.cache  # the tree does not change during a test session; each test reads it
def graph(root: Path = PKG) -> dict[str, set[str]]:
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    return {m: _imports(p, set(files), root) for m, p in files.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def test_the_graph_sees_imports_in_functions_and_type_only_ones(tmp_path):
    pkg = tmp_path / "mpifl"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "a.py", "b.py", "c.py", "sub/__init__.py", "sub/d.py"):
        (pkg / f).write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from .sub.d import y\n")
    (pkg / "sub/d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n")
    (pkg / "c.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from .b import y\n")
    g = graph(pkg)
    assert g["mpifl.a"] == {"mpifl.b"} and g["mpifl.sub.d"] == {"mpifl.a"} and g["mpifl.c"] == {"mpifl.b"}
    assert cycles(g) == [["mpifl.a", "mpifl.b", "mpifl.sub.d"]]  # closed by a type-only import


def test_no_import_cycles():
    assert cycles(graph()) == []


def unit(module: str) -> str:
    """The package a module belongs to, for the package-level graph: the first two
    dotted parts (``mpifl.config.load``: ``mpifl.config``; ``mpifl.schema`` is its
    own); a ``__main__`` is a unit of its own, a command line nothing imports."""
    if module.endswith(".__main__"):
        return module
    return ".".join(module.split(".")[:2])


def packages(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between units: an import between two modules is one between their units."""
    out: dict[str, set[str]] = {unit(m): set() for m in g}
    for m, deps in g.items():
        out[unit(m)].update(unit(d) for d in deps if unit(d) != unit(m))
    return out


def test_no_import_cycles_between_packages():
    """Counting every import, as above: two packages that need each other cannot be
    read, tested or moved apart, even when no two of their modules form a circle."""
    assert cycles(packages(graph())) == []


def test_the_package_check_sees_a_circle_closed_by_a_type_only_import(tmp_path):
    pkg = tmp_path / "mpifl"
    for d in ("", "a", "b"):
        (pkg / d).mkdir(exist_ok=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "a/one.py").write_text("from mpifl.b.two import x\n")
    (pkg / "b/two.py").write_text("x = 1\n")
    (pkg / "b/three.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from mpifl.a import one\n")
    (pkg / "b/__main__.py").write_text("from mpifl.a import one\n")
    g = graph(pkg)
    assert cycles(g) == []  # no circle between modules
    assert packages(g)["mpifl.b.__main__"] == {"mpifl.a"}
    assert cycles(packages(g)) == [["mpifl.a", "mpifl.b"]]


@pytest.mark.slow  # starts a Python process
def test_the_schema_is_a_leaf_when_imported():
    """``import mpifl.schema`` loads no other module of mpifl: every module may name
    the config's sections (a type hint, a default) without running the config
    package, which reads every algorithm's ``Params``."""
    code = ("import sys, mpifl.schema\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mpifl'))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=PKG.parent, capture_output=True, text=True,
                         timeout=120, check=True, env={**os.environ, "PYTHONPATH": str(PKG.parent)})
    assert res.stdout.split("\n")[0] == "['mpifl', 'mpifl.schema']"


@pytest.mark.parametrize("leaf", [
    "mpifl.errors", "mpifl.paths", "mpifl.rng", "mpifl.algorithms.state", "mpifl.schema"])
def test_leaf_modules_import_nothing_of_mpifl(leaf):
    assert graph()[leaf] == set()


def _outside(path: Path) -> set[str]:
    """Top-level packages other than mpifl and the standard library that ``path`` imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"mpifl"}


def test_an_algorithms_config_part_imports_only_light_modules():
    """``mpifl/algorithms/<name>_params.py`` is what config commands import of an
    algorithm: numpy, the errors, the schema, the shared sections and a parent's
    config part, never torch or training code."""
    light = {"mpifl.errors", "mpifl.schema", "mpifl.algorithms", "mpifl.algorithms.shared_params"}
    g = graph()
    parts = sorted(m for m in g if m.startswith("mpifl.algorithms.") and m.endswith("_params"))
    assert len(parts) > 20
    heavy = {m: sorted(d for d in g[m] if d not in light and not d.endswith("_params")) for m in parts}
    assert {m: d for m, d in heavy.items() if d} == {}
    paths = {m: PKG.parent / (m.replace(".", "/") + ".py") for m in parts}
    assert {m: sorted(_outside(p) - {"numpy"}) for m, p in paths.items() if _outside(p) - {"numpy"}} == {}


def test_lower_layers_never_import_the_config_runtime_or_tools():
    """data, models, training, communication and logging take their config
    sections as arguments; the config package (which consults the algorithm
    registry) sits above them. The sections themselves, ``mpifl.schema``, are a
    leaf outside it that every module may name."""
    upper = ("mpifl.config", "mpifl.run", "mpifl.main", "mpifl.sweep", "mpifl.analyze", "mpifl.analysis", "mpifl.check")
    g = graph()
    for m, deps in g.items():
        if m.endswith(".__main__"):  # a command line of its own (python -m mpifl.data), above everything
            continue
        if m.startswith(("mpifl.data", "mpifl.models", "mpifl.train", "mpifl.comm",
                         "mpifl.logging", "mpifl.yamlio", "mpifl.cli", "mpifl.algorithms")):
            bad = sorted(d for d in deps if d.startswith(upper))
            assert not bad, f"{m} imports {bad}"


def borrowed(g: dict[str, set[str]], names: tuple[str, ...]) -> list[str]:
    """``algorithm -> algorithm`` imports other than a variant's of its parent (the
    name before its last ``_``: ``fedprox_ft`` of ``fedprox``); shared pieces come
    from ``mpifl.algorithms.blocks``."""
    pkg = "mpifl.algorithms."
    out = []
    for name in names:
        parent = name.rsplit("_", 1)[0]
        for dep in sorted(g.get(pkg + name, set())):
            other = dep.removeprefix(pkg)
            if dep.startswith(pkg) and other in names and other != parent:
                out.append(f"{name} imports {other}")
    return out


def test_no_algorithm_imports_another_but_its_parent():
    from mpifl import algorithms

    assert borrowed(graph(), algorithms.NAMES) == []


def test_the_borrowing_check_sees_a_helper_taken_from_another_algorithm():
    g = {"mpifl.algorithms.fedfomo": {"mpifl.algorithms.federico", "mpifl.algorithms.blocks"},
         "mpifl.algorithms.fedprox_ft": {"mpifl.algorithms.fedprox"}}
    names = ("fedfomo", "federico", "fedprox", "fedprox_ft")
    assert borrowed(g, names) == ["fedfomo imports federico"]


# what of Clients no algorithm reads: the engine's internals behind base.ClientsSurface
INTERNALS = {"opt", "layout", "stacked", "batched", "x", "y", "model", "cfg"}


def clients_attrs(path: Path) -> set[str]:
    """Attributes a module reads of its clients: of ``c`` and ``clients`` (the
    names the algorithms give them) and of any ``<expr>.clients``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            v = node.value
            if (isinstance(v, ast.Name) and v.id in ("c", "clients")) or \
                    (isinstance(v, ast.Attribute) and v.attr == "clients"):
                out.add(node.attr)
    return out


def surface() -> set[str]:
    from mpifl.algorithms.base import ClientsSurface

    members = {n for n, v in vars(ClientsSurface).items() if callable(v) or isinstance(v, property)}
    return {n for n in members | set(ClientsSurface.__annotations__) if not n.startswith("_")}


def test_algorithms_use_their_clients_only_through_the_surface():
    """Every module of the algorithms package, the algorithms, blocks and helpers
    alike (a model's body/head split, which reads the layout, is engine side:
    mpifl/train/head.py)."""
    from mpifl import algorithms

    assert surface() & INTERNALS == set()
    files = {p.stem: p for p in sorted((PKG / "algorithms").glob("*.py"))}
    assert set(algorithms.NAMES) | {"blocks"} <= set(files)
    used = sorted(f"{n}: {a}" for n, p in files.items() for a in clients_attrs(p) - surface())
    assert used == []


def test_the_surface_check_sees_an_engine_internal(tmp_path):
    p = tmp_path / "algo.py"
    p.write_text("def f(ctx, view):\n    c = ctx.clients\n    c.opt.reset()\n    n = ctx.clients.layout.names\n"
                 "    return view.clients.params, c.train\n")
    assert clients_attrs(p) == {"opt", "layout", "params", "train"}
    assert clients_attrs(p) - surface() == {"opt", "layout"}


def test_clients_have_every_member_of_the_surface():
    from serial_ref import cfg_of, serial

    c = serial(cfg_of()).clients
    assert [n for n in sorted(surface()) if not hasattr(c, n)] == []


def test_the_top_level_holds_the_commands_and_shared_pieces_only():
    """Everything else sits in a package named for its job (README, Layout)."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 13, top


def _functions(root: Path = PKG):
    for p in root.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield p, node, node.end_lineno - node.lineno + 1


def test_no_function_is_longer_than_80_lines():
    long = [f"{p.relative_to(PKG.parent)}:{n.lineno} {n.name} ({size} lines)" for p, n, size in _functions()
            if size > 80]
    assert long == []


def test_the_round_loop_reads_as_an_outline():
    """``runtime._run``: resume, set up, the rounds, the last line; each step elsewhere."""
    sizes = {n.name: size for p, n, size in _functions(PKG / "run") if p.name == "runtime.py"}
    assert sizes["_run"] <= 40, sizes["_run"]


def test_the_length_checks_see_a_long_function(tmp_path):
    pkg = tmp_path / "mpifl"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n" + "    x = 1\n" * 90)
    assert [(n.name, size) for _, n, size in _functions(pkg)] == [("f", 91)]
