"""What makes a run the run it is: the one list of config keys that may differ
between a run and its continuation.

A run directory holds one experiment. Resuming it (a checkpoint), extending it
(a larger ``run.rounds``), continuing it after the directory was moved or
renamed, or starting it again in place (``run.resume=never``) compares the
stored config with the new one on every key except these; any other difference
is another experiment, refused with the keys that differ (:func:`config_diff`).

- where its files are: ``run.name``, ``run.out_dir`` (a moved or renamed run
  directory is the same run; the stored config then records the new place);
- how it is executed: ``run.resume`` (whether to continue), ``run.checkpoint_every``
  (a checkpoint holds the whole state, so when one is taken changes nothing),
  ``log.flush_s`` (when buffered rows reach the disk, not which), ``run.threads``
  and ``run.device`` (the machine: like the rank count, they may change
  floating-point rounding, not the experiment);
- how far it goes: ``run.rounds``. A larger value extends the run from its last
  checkpoint (rounds depend on the round index, never on ``run.rounds``, except
  that the last round is always evaluated and logged: with ``run.eval_every`` or
  ``log.every`` above 1 the old last round keeps its evaluation and row); a
  smaller one than the run has done is refused (:func:`mpifl.run.resume.find_checkpoint`).

Everything else (data, model, training, the algorithm and its section, the seed,
``run.eval_every``, ``log.every``, ``log.dense_max``, ``data.root``) is the
experiment, and ``mpifl.analyze`` groups runs by it. The sections of algorithms
the run does not select are not (``fedprox.mu`` of an ``oracle`` run: nothing
reads it; :func:`unread`): they are stored as given, and ``mpifl.main`` warns of
them in one line (:func:`unread_text`).
"""

from __future__ import annotations

from typing import Any

from mpifl.errors import shorten

WHERE = ("run.name", "run.out_dir")
HOW = ("run.resume", "run.checkpoint_every", "run.keep_checkpoints", "run.keep_final_checkpoint", "run.threads",
       "run.device", "log.flush_s", "log.tensorboard")
LENGTH = "run.rounds"
NOT_IDENTITY = frozenset((*WHERE, *HOW, LENGTH))


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested sections -> ``{"section.key": value}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


# keys a later mpifl moved into the algorithm's own section: old key -> its key there
MOVED = {"algorithm.ft_epochs": "ft_epochs"}


def _flat_pair(old: dict, new: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both configs flattened; a key added by a later mpifl was, in effect, at its
    default in the older run, and a moved key (:data:`MOVED`) is read where it went
    (dropped where the run's algorithm never read it)."""
    from mpifl.config.compose import config_class

    old, new = flatten(old), flatten(new)
    for key, field in MOVED.items():
        if key in old and key not in new:
            value, moved = old.pop(key), f"{old.get('algorithm.name')}.{field}"
            if moved in new:
                old.setdefault(moved, value)
    defaults = flatten(config_class()().to_dict())
    old.update({k: defaults[k] for k in set(new) - set(old) if k in defaults})
    return old, new


def unread(flat: dict[str, Any]) -> set[str]:
    """The keys of a flattened config in the sections of algorithms that its
    ``algorithm.name`` does not read (:func:`mpifl.algorithms.sections_of`)."""
    from mpifl import algorithms

    name = flat.get("algorithm.name")
    read = set(algorithms.sections_of(name)) if name in algorithms.NAMES else set()
    others = set(algorithms.sections()) - read
    return {k for k in flat if k.split(".")[0] in others}


def unread_text(cfg_dict: dict) -> str:
    """``"fedprox.mu=0.5, ..."``: the keys of :func:`unread` set away from their
    defaults (nested sections); "" if none."""
    from mpifl.config.compose import config_class

    flat, defaults = flatten(cfg_dict), flatten(config_class()().to_dict())
    keys = sorted(k for k in unread(flat) if flat[k] != defaults.get(k))
    return ", ".join(f"{k}={shorten(repr(flat[k]), 40)}" for k in keys)


def identity_keys(old: dict, new: dict) -> list[str]:
    """The keys outside :data:`NOT_IDENTITY` whose values differ between two
    configs (nested sections), sorted; a key that neither config's algorithm
    reads (:func:`unread`) is not one."""
    o, n = _flat_pair(old, new)
    ignored = unread(o) & unread(n)
    return sorted(k for k in set(o) | set(n) if k not in NOT_IDENTITY and k not in ignored and o.get(k) != n.get(k))


def config_diff(old: dict, new: dict) -> str:
    """The keys of :func:`identity_keys` as ``"k (a -> b), ..."``; "" if none."""
    o, n = _flat_pair(old, new)
    diff = identity_keys(old, new)
    shown = ", ".join(f"{k} ({shorten(repr(o.get(k)), 60)} -> {shorten(repr(n.get(k)), 60)})" for k in diff[:6])
    return shown + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
