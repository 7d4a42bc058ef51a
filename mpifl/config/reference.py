"""The config reference, read from the section dataclasses, their comments and
the range checks of the ``validate`` functions: ``python -m mpifl.config`` and
the README's table, so the docs cannot drift from the code."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import typing
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from mpifl import algorithms
from mpifl.config.compose import config_class
from mpifl.config.validate import validate

# keys whose choices validation checks (not their type): the registry's names
CHOICES = {"algorithm.name": algorithms.NAMES}


@dataclass
class KeyDoc:
    """One config key as documented: read from its dataclass, its comments and the
    range checks of the ``validate`` that owns it."""

    key: str
    default: Any
    type: str  # int, float, str, bool, list[int]
    allowed: str  # the choices, or the ranges ``validate`` enforces; "" when any value of the type is
    meaning: str


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return type(typing.get_args(hint)[0]).__name__
    if typing.get_origin(hint) is list:
        return f"list[{typing.get_args(hint)[0].__name__}]"
    return getattr(hint, "__name__", str(hint))


def _ranges(func: Any) -> dict[str, list[str]]:
    """``key -> ["must be >= 1", ...]``: every ``check(ok, "key", value, "must be ...")``
    in a validate function whose key and text are plain strings (rules that
    depend on other keys are formatted at run time or say more, and stay out)."""
    out: dict[str, list[str]] = {}
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check" and len(node.args) == 4
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in (node.args[1], node.args[3]))
                and node.args[3].value.startswith("must be")):
            out.setdefault(node.args[1].value, []).append(node.args[3].value)
    return out


def key_docs() -> list[KeyDoc]:
    """Every config key in section order, for ``python -m mpifl.config`` and the README."""
    ranges = _ranges(validate)
    out = []
    for section in dataclasses.fields(config_class()):
        cls = section.type
        if hasattr(cls, "validate"):  # an algorithm's section: it names its keys bare
            ranges.update({f"{section.name}.{k}": v for k, v in _ranges(cls.validate).items()})
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        defaults = cls()
        for name, comment in _field_comments(cls, names).items():
            key, hint = f"{section.name}.{name}", hints[name]
            choices = typing.get_args(hint) if typing.get_origin(hint) is Literal else CHOICES.get(key, ())
            allowed = [*(["one of " + ", ".join(map(str, choices))] if choices else []),
                       *(["true or false"] if hint is bool else []), *ranges.get(key, [])]
            out.append(KeyDoc(key, getattr(defaults, name), _type_name(hint), "; ".join(allowed), comment))
    return out


def _field_comments(cls: type, names: set[str]) -> dict[str, str]:
    """Each field's comment (the lines above it and the one beside it), in field
    order; a subclass's field (FedYogi's ``beta2``) speaks over its base's."""
    found: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        pending: list[str] = []
        for line in inspect.getsource(klass).splitlines():
            s = line.strip()
            if s.startswith("#"):
                pending.append(s.lstrip("# "))
                continue
            m = re.match(r"(\w+): [^=]+?(?:=\s*(.*?))?\s*(?:#\s*(.*))?$", s)
            if m and m.group(1) in names:
                found[m.group(1)] = " ".join([*pending, m.group(3) or ""]).strip()
            pending = []
    return {f.name: found[f.name] for f in dataclasses.fields(cls) if f.name in found}


def reference() -> str:
    """The config reference as Markdown (``python -m mpifl.config``; the README's
    table), so the docs cannot drift from the code."""
    out = ["| key | default | type | allowed | meaning |", "|---|---|---|---|---|"]
    for k in key_docs():
        cells = [f"`{k.key}`", f"`{k.default!r}`", k.type, k.allowed, k.meaning]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out)


def annotated_yaml(cfg: Any) -> str:
    """The resolved config as YAML that loads back to it, each key commented with
    its type, what is allowed, its default where the value differs, and the first
    sentence of its meaning."""
    docs = {k.key: k for k in key_docs()}
    lines = []
    for section, values in cfg.to_dict().items():
        lines.append(f"{section}:")
        for name, value in values.items():
            doc = docs[f"{section}.{name}"]
            text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix("...").strip()
            notes = [doc.type, doc.allowed, "" if value == doc.default else f"default {doc.default!r}",
                     doc.meaning.split(". ")[0]]
            lines.append(f"  {name}: {text}  # " + "; ".join(n for n in notes if n))
    return "\n".join(lines) + "\n"
