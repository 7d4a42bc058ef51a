"""What the config needs of an algorithm, read from the algorithm's file without
importing its module: ``Params`` (its section: the fields, their commented
defaults, ``validate``), ``check_config``, ``READS`` (other algorithms' sections
it reads) and, where it has one, ``selection_samples``, the samples it chooses
collaborators on, which the analysis of its logs reports.

Resolving a config (``python -m mpifl.config``, a sweep listing its points) must
not cost torch and the training code every algorithm module imports. So the
module's own source is run in part: its imports of light modules (``LIGHT``),
then ``Params``, ``check_config`` and the module's functions, classes and
constants they name, as written. A section several algorithms share is imported
as it is from :mod:`mpifl.algorithms.shared_params` (light); a parent algorithm
named there (a variant's ``fedprox.Params``) is read the same way. The result is a module of its own,
``mpifl.algorithms._declared.<name>``, whose ``__file__`` is the algorithm's
file, so that ``inspect`` finds the source of what it holds and a traceback
points at the algorithm's lines.

The training code (``mpifl.algorithms.<name>``, imported by the runtime) defines
the same classes again; the config's sections are the ones made here, whichever
was imported first, so every config holds the same classes.
"""

from __future__ import annotations

import ast
import functools
import sys
import types
from pathlib import Path

HERE = Path(__file__).parent
# what Params and check_config may import: anything else (torch, mpifl.train,
# mpifl.algorithms.base) is training code, which is left out
LIGHT = ("__future__", "typing", "dataclasses", "math", "re", "collections.abc", "numpy", "mpifl.errors",
         "mpifl.schema", "mpifl.algorithms.shared_params")
# selection_samples(params, n_train, n_val): per client, the samples an algorithm
# chooses or weights its collaborators on (mpifl.analysis.budget reports them)
WANTED = ("Params", "check_config", "READS", "selection_samples")


def _source(node: ast.ImportFrom) -> str:
    """The absolute module of a ``from`` import (``from ..errors`` in an algorithm: mpifl.errors)."""
    if not node.level:
        return node.module or ""
    base = "mpifl.algorithms".split(".")[:3 - node.level]
    return ".".join(base + ([node.module] if node.module else []))


def _light(node: ast.Import | ast.ImportFrom) -> bool:
    names = [_source(node)] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
    return all(n in LIGHT for n in names)


def _named(node: ast.AST) -> set[str]:
    """Names read in ``node`` (a field's own name, stored, is not one: ``federico.init`` is no call of ``init``)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@functools.cache
def declared(name: str) -> types.ModuleType:
    """Algorithm ``name``'s ``Params`` and ``check_config`` (where it has them)."""
    path = HERE / f"{name}.py"
    tree = ast.parse(path.read_text(), str(path))
    defs: dict[str, ast.stmt] = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    defs.update({t.id: n for n in tree.body if isinstance(n, ast.Assign)  # module constants (fesem's NO_CLUSTERS)
                 for t in n.targets if isinstance(t, ast.Name)})
    keep, todo = set(), [n for n in WANTED if n in defs]
    while todo:  # the module's own definitions they name, and those these name
        n = todo.pop()
        if n not in keep:
            keep.add(n)
            todo += sorted(_named(defs[n]) & set(defs) - keep)
    mod = types.ModuleType(f"{__name__}.{name}", f"the config's part of mpifl.algorithms.{name}")
    mod.__file__, mod.__package__ = str(path), "mpifl.algorithms"  # relative imports read as the module's
    body = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and _source(node) == "mpifl.algorithms":
            for a in node.names:  # a sibling algorithm: what it declares
                setattr(mod, a.asname or a.name, declared(a.name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and _light(node):
            body.append(node)
        elif node in (defs.get(n) for n in keep):
            body.append(node)
    sys.modules[mod.__name__] = mod  # dataclasses and typing look a class's module up by name
    exec(compile(ast.Module(body, type_ignores=[]), str(path), "exec"), mod.__dict__)
    return mod
