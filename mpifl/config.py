"""Run configuration: one dataclass per concern, loaded from YAML, overridden by
``a.b=value`` arguments, validated before any training.

Every user mistake raises :class:`ConfigError` whose message is one line naming
the key, the value and what is allowed; ``mpifl.main`` turns it into exit 2.
Defaults are the ones a quick CPU run wants; ``jobs/*.yaml`` hold only what
differs from them.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


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


@dataclass
class DataConfig:
    name: Literal["digits", "mnist1d", "synthetic"] = "mnist1d"
    root: str = ""  # folder of on-disk datasets (torchvision layout)
    partition: Literal["iid", "clusters", "feature_shift"] = "clusters"
    n_clients: int = 20
    n_clusters: int = 4  # clusters: label groups (disjoint label sets); feature_shift: domains
    n_samples: int = 5000  # size of generated datasets (mnist1d, synthetic)
    val_frac: float = 0.2  # of each client's samples
    test_frac: float = 0.2  # of each client's samples
    synthetic_dim: int = 20  # input dimension of `synthetic`
    synthetic_classes: int = 10


@dataclass
class ModelConfig:
    name: Literal["mlp"] = "mlp"
    hidden: list = field(default_factory=lambda: [128, 128])  # mlp hidden widths


@dataclass
class TrainConfig:
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.05
    momentum: float = 0.0  # sgd only
    weight_decay: float = 0.0
    batch_size: int = 32
    local_epochs: int = 1
    # vmap all of a rank's clients at once; auto = when the model has no BatchNorm
    # and is not a conv model on CPU (there the per-client loop is faster)
    batched: Literal["auto", "on", "off"] = "auto"


@dataclass
class AlgorithmConfig:
    name: Literal["local", "fedavg", "fedavg_ft", "oracle"] = "fedavg"
    fraction: float = 1.0  # participation fraction C per round (fedavg-like)
    ft_epochs: int = 1  # fedavg_ft: local fine-tuning epochs before evaluation


@dataclass
class LogConfig:
    every: int = 1  # log the per-client rows every k rounds (and always the last round)
    dense_max: int = 1024  # above this many clients N x N logs are stored compactly
    flush_s: float = 1.0  # write buffered rounds to run.h5 at least this often; 0 = every round


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    log: LogConfig = field(default_factory=LogConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# --------------------------------------------------------------------------- loading


def load(path: str | Path | None, overrides: list[str] = (), n_ranks: int = 1) -> Config:
    """YAML file (may be None) + ``a.b=value`` overrides -> validated Config."""
    raw: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found")
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            line = getattr(getattr(e, "problem_mark", None), "line", None)
            where = f" (line {line + 1})" if line is not None else ""
            raise ConfigError(f"config file {str(p)!r} is not valid YAML{where}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections, got {type(raw).__name__}")
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or "." not in key:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        try:
            value = yaml.safe_load(text) if text != "" else ""
        except yaml.YAMLError:
            value = text
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[leaf] = value
    cfg = _build(Config, raw, "")
    validate(cfg, n_ranks)
    return cfg


def from_dict(raw: dict, n_ranks: int = 1) -> Config:
    cfg = _build(Config, raw, "")
    validate(cfg, n_ranks)
    return cfg


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
        if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", ".inf"):
            return math.inf
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={value!r} must be a number")
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


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed; {allowed}")


def validate(cfg: Config, n_ranks: int = 1) -> None:
    """Ranges and combinations; types and choices were checked while building."""
    r, d, m, t, a = cfg.run, cfg.data, cfg.model, cfg.train, cfg.algorithm
    _check(bool(r.name) and "/" not in r.name and r.name not in (".", ".."), "run.name", r.name,
           "must be a plain non-empty directory name")
    _check(r.rounds >= 1, "run.rounds", r.rounds, "must be >= 1")
    _check(r.seed >= 0, "run.seed", r.seed, "must be >= 0")
    _check(r.eval_every >= 1, "run.eval_every", r.eval_every, "must be >= 1")
    _check(r.threads >= 0, "run.threads", r.threads, "must be >= 0 (0 = automatic)")
    _check(d.n_clients >= 1, "data.n_clients", d.n_clients, "must be >= 1")
    _check(d.n_clients >= n_ranks, "data.n_clients", d.n_clients,
           f"must be >= the number of MPI ranks ({n_ranks}); use fewer ranks or more clients")
    _check(d.n_clusters >= 1, "data.n_clusters", d.n_clusters, "must be >= 1")
    _check(d.n_samples >= 10, "data.n_samples", d.n_samples, "must be >= 10")
    _check(0 <= d.val_frac < 1, "data.val_frac", d.val_frac, "must be in [0, 1)")
    _check(0 < d.test_frac < 1, "data.test_frac", d.test_frac, "must be in (0, 1)")
    _check(d.val_frac + d.test_frac < 1, "data.test_frac", d.test_frac,
           f"data.val_frac + data.test_frac must be < 1 (val_frac is {d.val_frac})")
    _check(d.synthetic_dim >= 1, "data.synthetic_dim", d.synthetic_dim, "must be >= 1")
    _check(d.synthetic_classes >= 2, "data.synthetic_classes", d.synthetic_classes, "must be >= 2")
    _check(len(m.hidden) >= 1 and all(h >= 1 for h in m.hidden), "model.hidden", m.hidden,
           "must be a non-empty list of positive widths")
    _check(t.lr > 0 and math.isfinite(t.lr), "train.lr", t.lr, "must be a finite number > 0")
    _check(0 <= t.momentum < 1, "train.momentum", t.momentum, "must be in [0, 1)")
    _check(t.weight_decay >= 0, "train.weight_decay", t.weight_decay, "must be >= 0")
    _check(t.batch_size >= 1, "train.batch_size", t.batch_size, "must be >= 1")
    _check(t.local_epochs >= 0, "train.local_epochs", t.local_epochs, "must be >= 0")
    _check(0 < a.fraction <= 1, "algorithm.fraction", a.fraction, "must be in (0, 1]")
    _check(a.ft_epochs >= 0, "algorithm.ft_epochs", a.ft_epochs, "must be >= 0")
    _check(cfg.log.every >= 1, "log.every", cfg.log.every, "must be >= 1")
    _check(cfg.log.dense_max >= 1, "log.dense_max", cfg.log.dense_max, "must be >= 1")
    _check(0 <= cfg.log.flush_s < math.inf, "log.flush_s", cfg.log.flush_s, "must be a finite number >= 0")
    if a.name == "oracle":
        _check(d.partition != "iid", "algorithm.name", a.name,
               "oracle needs true clusters: use a clustered data.partition, not iid")
