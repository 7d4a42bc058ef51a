"""YAML file + ``section.key=value`` overrides -> a validated Config: each value
coerced to its key's type (a one-line ConfigError naming the key, the value and
what is allowed otherwise), then :func:`mpifl.config.validate.validate`."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from pathlib import Path
from typing import Any, Literal

from mpifl.config.compose import config_class
from mpifl.config.validate import validate
from mpifl.errors import MAX_SHOWN, ConfigError, did_you_mean, shorten
from mpifl.yamlio import parse_yaml, read_yaml


def load(path: str | Path | None, overrides: list[str] = (), n_ranks: int = 1) -> Any:
    """YAML file (may be None) + ``a.b=value`` overrides -> validated Config.
    Error messages echo at most :data:`MAX_SHOWN` characters of a value."""
    try:
        return _load(path, overrides, n_ranks)
    except ConfigError as e:
        raise ConfigError(shorten(str(e), 2 * MAX_SHOWN)) from None


def check_keys(path: str | Path | None, overrides: list[str] = ()) -> None:
    """What :func:`load` checks before the values' rules: the file (found, readable,
    YAML, a mapping), the overrides' form, every key and type. Imports neither torch
    nor MPI, so an entry point answers these mistakes at once."""
    try:
        _build(path, overrides)
    except ConfigError as e:
        raise ConfigError(shorten(str(e), 2 * MAX_SHOWN)) from None


def _load(path: str | Path | None, overrides: list[str], n_ranks: int) -> Any:
    cfg = _build(path, overrides)
    validate(cfg, n_ranks)
    return cfg


def _build(path: str | Path | None, overrides: list[str]) -> Any:
    raw: dict = {}
    if path is not None:
        p = Path(path)
        name = shorten(repr(str(p)))
        if not p.exists():
            raise ConfigError(f"config file {name} not found")
        if not p.is_file():
            raise ConfigError(f"config file {name} is not a file")
        raw = read_yaml(p, f"config file {name}")
        if raw is None:  # nothing but whitespace or comments: most likely not the file meant
            raise ConfigError(f"config file {name} is empty; to run on the defaults give no config file: "
                              f"python -m mpifl.main [section.key=value ...]")
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {name} must hold a mapping of sections, got {type(raw).__name__}")
    for item in overrides:
        key, value = override(item)
        assign(raw, key, value, f"override {shorten(repr(item))}")
    return build(config_class(), raw, "")


def override(item: str) -> tuple[str, Any]:
    """``section.key=value`` -> (key, value), the value read as YAML (a string key
    keeps the text as it is)."""
    key, sep, text = item.partition("=")
    if not sep or not key or "." not in key:
        raise ConfigError(f"override {shorten(repr(item))} must look like section.key=value")
    try:
        value = parse_yaml(text, f"override {shorten(repr(item))}", invalid_ok=True) if text != "" else ""
    except ConfigError:
        if not _is_text(_key_hint(key)):
            raise
        value = text  # a string key keeps its text, whatever YAML would make of it
    if not isinstance(value, str) and _is_text(_key_hint(key)):
        value = text  # YAML 1.1 reads off, no, 007, ~ as bool, int, null: a string key keeps the text
    return key, value


def assign(raw: dict, key: str, value: Any, where: str) -> None:
    """``raw[a][b] = value`` for ``key = "a.b"``, creating sections on the way
    (an override, a sweep's ``set`` or grid value)."""
    if not isinstance(key, str) or "." not in key:
        raise ConfigError(f"{where}: key {key!r} must look like section.key")
    node = raw
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {part!r} is not a section")
    node[leaf] = value


def from_dict(raw: dict, n_ranks: int = 1) -> Any:
    """A validated Config from nested sections (a sweep point, a stored config)."""
    try:
        cfg = build(config_class(), raw, "")
        validate(cfg, n_ranks)
    except ConfigError as e:
        raise ConfigError(shorten(str(e), 2 * MAX_SHOWN)) from None
    return cfg


FLOAT32_MAX = 3.4028234663852886e38  # beyond it a hyper-parameter overflows where training computes in float32

# a number as YAML 1.2 writes it; YAML 1.1 (PyYAML) reads 1e-3 (no dot) and inf as strings
_NUMBER = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF = re.compile(r"([-+]?)\.?(inf|Inf|INF)")
_NAN = re.compile(r"\.?(nan|NaN|NAN)")


def _number(text: str) -> float | None:
    """The float a YAML number ``text`` means, or None when it is not one."""
    text = text.strip()
    if _NUMBER.fullmatch(text):
        return float(text)
    m = _INF.fullmatch(text)
    if m:
        return -math.inf if m.group(1) == "-" else math.inf
    return math.nan if _NAN.fullmatch(text) else None


def build(cls: type, raw: Any, prefix: str) -> Any:
    """Dataclass ``cls`` from the mapping ``raw``: unknown keys refused, every
    value coerced to its field's type; ``prefix`` names the section in errors."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix or 'config'} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        where = f"section {prefix!r}" if prefix else "top level"
        hint = _suggest(prefix, unknown[0], raw[unknown[0]], names)
        raise ConfigError(f"unknown key {_join(prefix, unknown[0])!r}{hint} in {where}; valid keys: {', '.join(names)}")
    kwargs = {}
    for name in names:
        if name not in raw:
            continue
        key = _join(prefix, name)
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = build(hint, raw[name] if raw[name] is not None else {}, key)
        else:
            kwargs[name] = coerce(raw[name], hint, key)
    return cls(**kwargs)


def key_type(key: str) -> Any:
    """The type of the dotted config key ``key`` (``train.lr`` -> float), or the
    one-line error for a key no section has."""
    hint = _key_hint(key)
    if hint is None or dataclasses.is_dataclass(hint):
        raise ConfigError(f"unknown key {key!r}{did_you_mean(key, all_keys())}; "
                          f"`python -m mpifl.config` lists every key")
    return hint


def all_keys() -> list[str]:
    """Every dotted config key, in the reference's order."""
    def walk(cls: Any, prefix: str) -> list[str]:
        out = []
        for name, hint in typing.get_type_hints(cls).items():
            key = _join(prefix, name)
            out += walk(hint, key) if dataclasses.is_dataclass(hint) else [key]
        return out
    return walk(config_class(), "")


def _suggest(prefix: str, name: str, value: Any, names: list[str]) -> str:
    """The "did you mean" of an unknown key: a misspelt section with keys under
    it is matched as the whole dotted key (``trian.lr`` -> ``train.lr``)."""
    if not prefix and isinstance(value, dict) and value:
        dotted = did_you_mean(f"{name}.{next(iter(value))}", all_keys())
        if dotted:
            return dotted
    close = did_you_mean(name, names)
    return close and did_you_mean(_join(prefix, name), [_join(prefix, n) for n in names])


def _key_hint(key: str) -> Any:
    """The type of a dotted config key; None for an unknown one (reported while building)."""
    cls: Any = config_class()
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            return None
        cls = typing.get_type_hints(cls).get(part)
    return cls


def _is_text(hint: Any) -> bool:
    """A string key, or a choice among strings."""
    if typing.get_origin(hint) is Literal:
        return all(isinstance(c, str) for c in typing.get_args(hint))
    return hint is str


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


INT64_MAX = 2**63 - 1  # what numpy, torch, MPI and HDF5 take as an integer


def _int64(value: int, key: str) -> int:
    """``value`` where it fits in a signed 64-bit integer; a one-line error otherwise
    (numpy, torch and HDF5 would stop the run with an overflow traceback)."""
    if abs(value) > INT64_MAX:
        raise ConfigError(f"{key}={shorten(str(value))} is not allowed: an integer must be at most {INT64_MAX} "
                          f"(2**63 - 1) in size")
    return value


def coerce(value: Any, hint: Any, key: str) -> Any:
    """``value`` as the type ``hint`` says (choices of a Literal, bool, int, float,
    str, list of int or str), or the one-line error naming ``key``."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if isinstance(value, bool) and {"on", "off"} <= set(choices):
            value = "on" if value else "off"  # YAML 1.1 reads on/off as booleans
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not allowed{did_you_mean(value, choices)}; "
                              f"choose one of: {', '.join(map(str, choices))}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}={value!r} must be an integer")
        return _int64(value, key)
    if hint is float:
        if isinstance(value, str):
            number = _number(value)
            if number is None:
                raise ConfigError(f"{key}={shorten(repr(value))} must be a number, e.g. 0.05, 1e-3 or inf")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={shorten(repr(value))} must be a number")
        else:
            number = float(min(abs(value), 2 * FLOAT32_MAX)) * (1 if value >= 0 else -1)  # 10**400: no OverflowError
        if math.isfinite(number) and abs(number) > FLOAT32_MAX:
            raise ConfigError(f"{key}={shorten(repr(value))} is not allowed; a finite number must be at most 3.4e38 "
                              f"in size (float32's range: training computes in float32)")
        return number
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be a string")
        return str(value)
    if origin is list:
        (item,) = typing.get_args(hint)
        if item is int:
            if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise ConfigError(f"{key}={shorten(repr(value))} must be a list of integers, e.g. [128, 128]")
            for v in value:
                _int64(v, key)
        elif item is str:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{key}={shorten(repr(value))} must be a list of strings")
        else:
            raise TypeError(f"unsupported config type {hint} for {key}")
        return list(value)
    raise TypeError(f"unsupported config type {hint} for {key}")


def option_hint(unknown: list[str]) -> str:
    """The override an option-style argument (``--rounds 5``, ``--lr=0.1``) meant,
    as a hint: config keys are set as ``section.key=value``."""
    flag = next((u for u in unknown if u.startswith("--")), None)
    if flag is None:
        return ""
    name, _, value = flag[2:].replace("-", "_").partition("=")
    after = unknown[unknown.index(flag) + 1:]
    value = value or (after[0] if after and not after[0].startswith("-") else "VALUE")
    names = {k: k.rsplit(".", 1)[-1] for k in all_keys()}
    close = difflib.get_close_matches(name, sorted(set(names.values())), n=1, cutoff=0.6)
    keys = [k for k, n in names.items() if n in close]
    if not keys:
        return "; config keys are set as section.key=value (every key: python -m mpifl.config)"
    meant = " or ".join(f"{k}={value}" for k in keys[:3])
    return f"; config keys are set as section.key=value (did you mean {meant}?)"
