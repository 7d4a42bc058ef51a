"""Run configuration: one dataclass per concern, loaded from YAML, overridden by
``a.b=value`` arguments, validated before any training.

Every user mistake raises :class:`ConfigError` whose message is one line naming
the key, the value and what is allowed; ``mpifl.main`` turns it into exit 2.
Defaults are the ones a quick CPU run wants; ``jobs/*.yaml`` hold only what
differs from them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .algorithms import NAMES as ALGORITHM_NAMES


class ConfigError(ValueError):
    """A user error in the configuration or inputs: reported in one line, exit 2."""


# --------------------------------------------------------------------------- sections


@dataclass
class RunConfig:
    name: str = "run"  # run directory is <out_dir>/<name>
    out_dir: str = "results"
    seed: int = 0  # drives partition, init, sampling, neighbour draws
    rounds: int = 30
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: node-local GPU if any
    eval_every: int = 1  # evaluate val/test every k rounds (and always the last)
    threads: int = 0  # torch threads per rank; 0 = cores this rank owns
    checkpoint_every: int = 10  # rounds between checkpoints (0: only at the end and on a signal)
    # auto: continue a run directory that has a checkpoint; never: start over; require: fail without one
    resume: Literal["auto", "never", "require"] = "auto"


@dataclass
class DataConfig:
    # built-in: digits, mnist1d, synthetic; from data.root: the rest (see mpifl/data/datasets.py)
    name: Literal["digits", "mnist1d", "synthetic", "mnist", "fashionmnist", "emnist", "cifar10", "cifar100",
                  "cinic10", "digit5", "office10", "features"] = "mnist1d"
    root: str = ""  # folder of on-disk datasets (torchvision layout); features: the .npz (or its folder)
    partition: Literal["iid", "clusters", "noisy_clusters", "permuted_clusters", "patho", "dirichlet",
                       "domains", "feature_shift", "label_flip"] = "clusters"
    n_clients: int = 20
    n_clusters: int = 4  # clusters: label groups (disjoint label sets); feature_shift: domains
    # clusters/noisy_clusters: which labels form a group. random = a seeded shuffle of the labels
    # (or CIFAR-100 super-classes) cut into n_clusters groups; ordered = consecutive labels in
    # order, {0,1}, {2,3}, ... (pFedLIA's even split): with random, look-alike classes can share a
    # group (Fashion-MNIST's T-shirt and Shirt), which caps every method's accuracy
    cluster_labels: Literal["random", "ordered"] = "random"
    n_samples: int = 5000  # size of generated datasets (mnist1d, synthetic)
    # split: every client's samples -> train/val/test by val_frac/test_frac; test_set: the
    # dataset's own test set is shared out following each client's label mix (DPFL), val_frac of the rest
    test_source: Literal["split", "test_set"] = "split"
    val_frac: float = 0.2  # of each client's samples (test_set: of its training samples)
    test_frac: float = 0.2  # of each client's samples (split only)
    subsample: float = 1.0  # fraction kept of every class (per domain, per train/test part), seeded
    per_class: int = 0  # at most this many samples per class (per domain and part); 0 = all
    synthetic_dim: int = 20  # input dimension of `synthetic`
    synthetic_classes: int = 10
    emnist_split: Literal["byclass", "bymerge", "balanced", "letters", "digits", "mnist"] = "byclass"
    cifar100_labels: Literal["fine", "coarse"] = "fine"  # coarse: the 20 super-classes
    image_size: int = 0  # cinic10/digit5/office10 images are resized to this; 0 = 32 (office10: 64)
    dirichlet_alpha: float = 0.1  # dirichlet: concentration (DPFL Dir(0.1))
    min_client_size: int = 10  # dirichlet: redraw until every client has this many samples
    classes_per_client: int = 3  # patho: classes per client (DPFL Patho(3))
    noisy_prob: float = 0.5  # noisy_clusters: chance a client gets extra labels outside its cluster
    noisy_labels: int = 0  # noisy_clusters: how many extra labels; 0 = 1 (5 for cifar100 fine, pFedLIA)
    flip_frac: float = 0.2  # label_flip: fraction of clients whose labels are permuted
    flip_base: Literal["iid", "clusters", "noisy_clusters", "patho", "dirichlet", "domains",
                       "feature_shift"] = "iid"  # label_flip: the partition flipped clients come from


@dataclass
class ModelConfig:
    name: Literal["mlp", "lenet", "cnn_dpfl", "cnn2", "resnet18"] = "mlp"
    hidden: list = field(default_factory=lambda: [128, 128])  # mlp hidden widths
    weights: str = ""  # optional state_dict (.pt) on disk; tensors whose name and shape match are loaded


@dataclass
class TrainConfig:
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.05
    momentum: float = 0.0  # sgd only
    weight_decay: float = 0.0
    batch_size: int = 32
    local_epochs: int = 1
    # train all of a rank's clients at once (vmap; stacked bmm for MLPs) or client by
    # client; auto = MLPs batched, other models whichever path a timing of both at
    # the start of the run finds faster (logged as the run's train_path)
    batched: Literal["auto", "on", "off"] = "auto"
    # a NaN/inf loss or parameter: stop with an error naming client and round, or drop
    # that client's update for the round (counted in /metrics/skipped)
    on_nonfinite: Literal["error", "skip"] = "error"


@dataclass
class AlgorithmConfig:
    name: Literal[ALGORITHM_NAMES] = "fedavg"  # every module of mpifl/algorithms
    fraction: float = 1.0  # participation fraction C per round (fedavg-like)
    ft_epochs: int = 1  # fedavg_ft: local fine-tuning epochs before evaluation


@dataclass
class LogConfig:
    every: int = 1  # log the per-client rows every k rounds (and always the last round)
    dense_max: int = 1024  # above this many clients N x N logs are stored compactly
    # buffer rounds and write them to run.h5 at least this often (seconds); 0 = every round,
    # so a crash loses no finished round (>0 pays off when rounds take milliseconds)
    flush_s: float = 0.0


# the core sections, in the order they are printed; algorithm sections come from
# mpifl.algorithms (each module's Params) and sit between ``algorithm`` and ``log``
CORE_SECTIONS = {"run": RunConfig, "data": DataConfig, "model": ModelConfig, "train": TrainConfig,
                 "algorithm": AlgorithmConfig}
TAIL_SECTIONS = {"log": LogConfig}


class _ConfigMethods:
    """What every Config has besides its sections."""

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


@functools.cache
def config_class() -> type:
    """The ``Config`` dataclass: one field per section, the algorithm sections read
    from the registry. Built on first use, since that imports every algorithm."""
    from . import algorithms

    secs = {**CORE_SECTIONS, **algorithms.sections(), **TAIL_SECTIONS}
    cls = dataclasses.make_dataclass(
        "Config", [(name, sec, field(default_factory=sec)) for name, sec in secs.items()],
        bases=(_ConfigMethods,))
    cls.__module__ = __name__  # pickles as mpifl.config.Config (module __getattr__ below)
    cls.__doc__ = "The whole run configuration: one dataclass per section."
    return cls


def __getattr__(name: str) -> Any:
    # ``config.Config`` (and ``from mpifl.config import Config``) without importing
    # every algorithm when only the sections or the errors are needed
    if name == "Config":
        return config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------- loading


MAX_BYTES = 1 << 20  # a config or sweep file; real ones are a few KiB
MAX_DEPTH = 16  # nesting of YAML values; a config needs 3 (section, key, list)
MAX_SHOWN = 200  # characters of a value echoed in an error message


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` cut in the middle when longer than ``limit``, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}...({len(text)} characters)...{text[-limit // 4:]}"


def _depth(value: Any) -> int:
    """Nesting depth of YAML data, without recursion (a hostile file may be deep)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        if isinstance(v, dict):
            todo += [(x, d + 1) for x in v.values()]
        elif isinstance(v, list):
            todo += [(x, d + 1) for x in v]
    return deepest


def parse_yaml(text: str, what: str, invalid_ok: bool = False) -> Any:
    """YAML text within the size and depth limits, or a one-line ConfigError
    naming ``what`` (e.g. "config file 'x.yaml'"); with ``invalid_ok`` text that
    is not YAML comes back as it is (an override's value)."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{what} is {len(text)} characters long; at most {MAX_BYTES} are allowed")
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        data = None
        deep = True
    except yaml.YAMLError as e:
        if invalid_ok:
            return text
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f" (line {line + 1})" if line is not None else ""
        raise ConfigError(f"{what} is not valid YAML{where}") from None
    else:
        deep = _depth(data) > MAX_DEPTH
    if deep:
        raise ConfigError(f"{what} nests values more than {MAX_DEPTH} levels deep; that many are not allowed")
    return data


def read_yaml(path: Path, what: str) -> Any:
    """A YAML file within the size and depth limits (see :func:`parse_yaml`)."""
    try:
        size = path.stat().st_size
        text = path.read_text() if size <= MAX_BYTES else ""
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(f"{what} is not a YAML text file") from None
    except OSError as e:
        raise ConfigError(f"{what} cannot be read ({e.strerror})") from None
    if size > MAX_BYTES:
        raise ConfigError(f"{what} is {size} bytes; at most {MAX_BYTES} are allowed")
    return parse_yaml(text, what)


def load(path: str | Path | None, overrides: list[str] = (), n_ranks: int = 1) -> Any:
    """YAML file (may be None) + ``a.b=value`` overrides -> validated Config.
    Error messages echo at most :data:`MAX_SHOWN` characters of a value."""
    try:
        return _load(path, overrides, n_ranks)
    except ConfigError as e:
        raise ConfigError(shorten(str(e), 2 * MAX_SHOWN)) from None


def _load(path: str | Path | None, overrides: list[str], n_ranks: int) -> Any:
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
        key, sep, text = item.partition("=")
        if not sep or not key or "." not in key:
            raise ConfigError(f"override {shorten(repr(item))} must look like section.key=value")
        value = parse_yaml(text, f"override {shorten(repr(item))}", invalid_ok=True) if text != "" else ""
        if not isinstance(value, str) and _is_text(_key_hint(key)):
            value = text  # YAML 1.1 reads off, no, 007, ~ as bool, int, null: a string key keeps the text
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[leaf] = value
    cfg = _build(config_class(), raw, "")
    validate(cfg, n_ranks)
    return cfg


def from_dict(raw: dict, n_ranks: int = 1) -> Any:
    try:
        cfg = _build(config_class(), raw, "")
        validate(cfg, n_ranks)
    except ConfigError as e:
        raise ConfigError(shorten(str(e), 2 * MAX_SHOWN)) from None
    return cfg


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


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix or 'config'} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        where = f"section {prefix!r}" if prefix else "top level"
        raise ConfigError(f"unknown key {_join(prefix, unknown[0])!r} in {where}; valid keys: {', '.join(names)}")
    kwargs = {}
    for name in names:
        if name not in raw:
            continue
        key = _join(prefix, name)
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, raw[name] if raw[name] is not None else {}, key)
        else:
            kwargs[name] = _coerce(raw[name], hint, key)
    return cls(**kwargs)


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


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if isinstance(value, bool) and {"on", "off"} <= set(choices):
            value = "on" if value else "off"  # YAML 1.1 reads on/off as booleans
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, choices))}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}={value!r} must be an integer")
        return value
    if hint is float:
        if isinstance(value, str):
            number = _number(value)
            if number is None:
                raise ConfigError(f"{key}={shorten(repr(value))} must be a number, e.g. 0.05, 1e-3 or inf")
            return number
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={shorten(repr(value))} must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} must be a string")
        return str(value)
    if hint is list or origin is list:
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{key}={value!r} must be a list of integers, e.g. [128, 128]")
        return list(value)
    raise TypeError(f"unsupported config type {hint} for {key}")


# --------------------------------------------------------------------------- validation

# C0 controls (newline, tab, escape...), DEL and C1 controls: a newline in a
# value that reaches a shell script (run.name, run.out_dir) would be a new command
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _check_text(cfg: Any) -> None:
    """No string of the config holds a control character."""
    for section in dataclasses.fields(cfg):
        part = getattr(cfg, section.name)
        for f in dataclasses.fields(part):
            v = getattr(part, f.name)
            if isinstance(v, str) and CONTROL.search(v):
                raise ConfigError(f"{section.name}.{f.name}={shorten(repr(v))} is not allowed; "
                                  f"no newlines or other control characters")


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed; {allowed}")


def validate(cfg: Any, n_ranks: int = 1) -> None:
    """Ranges and combinations; types and choices were checked while building.
    Each algorithm section validates itself (``Params.validate``), and the chosen
    algorithm may refuse a combination (``check_config``)."""
    from . import algorithms

    r, d, m, t, a = cfg.run, cfg.data, cfg.model, cfg.train, cfg.algorithm
    _check_text(cfg)
    check(bool(r.name) and "/" not in r.name and r.name not in (".", "..") and len(r.name.encode()) <= 255,
           "run.name", r.name, "must be a plain non-empty directory name of at most 255 bytes")
    check(r.rounds >= 1, "run.rounds", r.rounds, "must be >= 1")
    check(r.seed >= 0, "run.seed", r.seed, "must be >= 0")
    check(r.eval_every >= 1, "run.eval_every", r.eval_every, "must be >= 1")
    check(r.threads >= 0, "run.threads", r.threads, "must be >= 0 (0 = automatic)")
    check(r.checkpoint_every >= 0, "run.checkpoint_every", r.checkpoint_every, "must be >= 0")
    check(d.n_clients >= 1, "data.n_clients", d.n_clients, "must be >= 1")
    check(d.n_clients >= n_ranks, "data.n_clients", d.n_clients,
           f"must be >= the number of MPI ranks ({n_ranks}); use fewer ranks or more clients")
    check(d.n_clusters >= 1, "data.n_clusters", d.n_clusters, "must be >= 1")
    check(d.n_samples >= 10, "data.n_samples", d.n_samples, "must be >= 10")
    check(0 <= d.val_frac < 1, "data.val_frac", d.val_frac, "must be in [0, 1)")
    check(0 < d.test_frac < 1, "data.test_frac", d.test_frac, "must be in (0, 1)")
    check(d.val_frac + d.test_frac < 1, "data.test_frac", d.test_frac,
           f"data.val_frac + data.test_frac must be < 1 (val_frac is {d.val_frac})")
    check(0 < d.subsample <= 1, "data.subsample", d.subsample, "must be in (0, 1]")
    check(d.per_class >= 0, "data.per_class", d.per_class, "must be >= 0 (0 = all)")
    check(d.image_size >= 0, "data.image_size", d.image_size, "must be >= 0 (0 = the dataset's default)")
    check(d.dirichlet_alpha > 0 and math.isfinite(d.dirichlet_alpha), "data.dirichlet_alpha",
           d.dirichlet_alpha, "must be a finite number > 0")
    check(d.min_client_size >= 0, "data.min_client_size", d.min_client_size, "must be >= 0")
    check(d.classes_per_client >= 1, "data.classes_per_client", d.classes_per_client, "must be >= 1")
    check(0 <= d.noisy_prob <= 1, "data.noisy_prob", d.noisy_prob, "must be in [0, 1]")
    check(d.noisy_labels >= 0, "data.noisy_labels", d.noisy_labels, "must be >= 0 (0 = the paper's choice)")
    check(0 <= d.flip_frac <= 1, "data.flip_frac", d.flip_frac, "must be in [0, 1]")
    check(d.name != "features" or bool(d.root), "data.root", d.root,
           "data.name=features needs data.root=PATH of a .npz with features and labels")
    check(d.synthetic_dim >= 1, "data.synthetic_dim", d.synthetic_dim, "must be >= 1")
    check(d.synthetic_classes >= 2, "data.synthetic_classes", d.synthetic_classes, "must be >= 2")
    check(len(m.hidden) >= 1 and all(h >= 1 for h in m.hidden), "model.hidden", m.hidden,
           "must be a non-empty list of positive widths")
    check(t.lr > 0 and math.isfinite(t.lr), "train.lr", t.lr, "must be a finite number > 0")
    check(0 <= t.momentum < 1, "train.momentum", t.momentum, "must be in [0, 1)")
    check(t.weight_decay >= 0, "train.weight_decay", t.weight_decay, "must be >= 0")
    check(t.batch_size >= 1, "train.batch_size", t.batch_size, "must be >= 1")
    check(t.local_epochs >= 0, "train.local_epochs", t.local_epochs, "must be >= 0")
    check(0 < a.fraction <= 1, "algorithm.fraction", a.fraction, "must be in (0, 1]")
    check(a.ft_epochs >= 0, "algorithm.ft_epochs", a.ft_epochs, "must be >= 0")
    check(cfg.log.every >= 1, "log.every", cfg.log.every, "must be >= 1")
    check(cfg.log.dense_max >= 1, "log.dense_max", cfg.log.dense_max, "must be >= 1")
    check(0 <= cfg.log.flush_s < math.inf, "log.flush_s", cfg.log.flush_s, "must be a finite number >= 0")
    for name in algorithms.sections():
        getattr(cfg, name).validate(cfg)
    if hasattr(algorithms.get(a.name), "check_config"):
        algorithms.get(a.name).check_config(cfg)


# --------------------------------------------------------------------------- reference


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
    if hint is list or typing.get_origin(hint) is list:
        return "list[int]"
    return getattr(hint, "__name__", str(hint))


def _ranges(func: Any) -> dict[str, list[str]]:
    """``key -> ["must be >= 1", ...]``: every ``check(ok, "key", value, "must be ...")``
    in a validate function whose key and text are plain strings (rules that
    depend on other keys are formatted at run time or say more, and stay out)."""
    import ast
    import inspect
    import textwrap

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
    import inspect
    import re

    ranges = _ranges(validate)
    out = []
    for section in dataclasses.fields(config_class()):
        cls = section.type
        if hasattr(cls, "validate"):
            ranges.update(_ranges(cls.validate))
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        defaults = cls()
        pending: list[str] = []
        for line in inspect.getsource(cls).splitlines():
            s = line.strip()
            if s.startswith("#"):
                pending.append(s.lstrip("# "))
                continue
            m = re.match(r"(\w+): [^=]+?(?:=\s*(.*?))?\s*(?:#\s*(.*))?$", s)
            if m and m.group(1) in names:
                key, hint = f"{section.name}.{m.group(1)}", hints[m.group(1)]
                allowed = [*(["one of " + ", ".join(map(str, typing.get_args(hint)))]
                             if typing.get_origin(hint) is Literal else []),
                           *(["true or false"] if hint is bool else []), *ranges.get(key, [])]
                out.append(KeyDoc(key, getattr(defaults, m.group(1)), _type_name(hint), "; ".join(allowed),
                                  " ".join([*pending, m.group(3) or ""]).strip()))
            pending = []
    return out


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


def main(argv: list[str] | None = None) -> int:
    """``python -m mpifl.config``: the reference table; with a config file and/or
    overrides, the resolved config as commented YAML."""
    import argparse
    import sys

    from .main import parse  # the same reading of CONFIG vs overrides as the entry point

    ap = argparse.ArgumentParser(prog="python -m mpifl.config", description=main.__doc__.splitlines()[0][2:-2])
    ap.add_argument("config", nargs="?", help="YAML config: print it resolved (defaults + file + overrides)")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    args = sys.argv[1:] if argv is None else argv
    ap.parse_args(args)
    if not args:
        print(reference())
        return 0
    try:
        path, overrides = parse(args)
        cfg = load(path, overrides)
        print(f"# resolved: {path or 'the defaults'}{''.join(' ' + o for o in overrides)}")
        print(annotated_yaml(cfg), end="")
    except ConfigError as e:
        print(f"mpifl.config: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
