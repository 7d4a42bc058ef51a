"""Run configuration: one dataclass per concern (:mod:`mpifl.schema`), loaded from
YAML and overridden by ``a.b=value`` arguments (:mod:`.load`), validated before
any training (:mod:`.validate`), documented from the code (:mod:`.reference`;
``python -m mpifl.config`` prints it).

Every user mistake raises :class:`mpifl.errors.ConfigError` whose message is one
line naming the key, the value and what is allowed; the entry points turn it into
exit 2. Defaults are the ones a quick CPU run wants; ``jobs/*.yaml`` hold only
what differs from them.
"""

from __future__ import annotations

from typing import Any

from mpifl.config.compose import config_class
from mpifl.config.load import (
    all_keys,
    assign,
    build,
    check_keys,
    coerce,
    from_dict,
    key_type,
    load,
    option_hint,
    override,
)
from mpifl.config.reference import KeyDoc, annotated_yaml, key_docs, reference
from mpifl.config.validate import CONTROL, validate
from mpifl.errors import did_you_mean
from mpifl.schema import (
    CORE_SECTIONS,
    TAIL_SECTIONS,
    AlgorithmConfig,
    ConfigBase,
    DataConfig,
    LogConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
)

__all__ = ["CONTROL", "CORE_SECTIONS", "TAIL_SECTIONS", "AlgorithmConfig", "Config", "ConfigBase", "DataConfig",
           "KeyDoc", "LogConfig", "ModelConfig", "RunConfig", "TrainConfig", "all_keys", "annotated_yaml", "assign",
           "build", "check_keys", "coerce", "config_class", "did_you_mean", "from_dict", "key_docs", "key_type",
           "load", "option_hint", "override", "reference", "validate"]


def __getattr__(name: str) -> Any:
    # ``config.Config`` (and ``from mpifl.config import Config``) built on first use:
    # its algorithm sections come from the registry
    if name == "Config":
        return config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
