"""What a run spent and what it was set to, read from its own log and stored
config (never from the sweep file that asked for it), so that two methods
compared on a page are compared at budgets the reader can see.

Per run, per client (mean over clients):

- ``steps_first``: local optimizer steps in the first round, ``steps_round``: a
  round after it (a method may train longer in its first: DPFL's tau_init),
  ``steps``: over the run, and
  ``samples``: the training samples those steps took (``/train/steps``,
  ``/train/samples``: counted by the engine, ``mpifl.train.Clients.count``, a step
  being one batch trained on, fine-tuning before an evaluation included);
- ``select_samples``: the samples the method chooses or weights its
  collaborators on, as the algorithm declares them (its config part's
  ``selection_samples``, ``mpifl.algorithms.<name>_params``: DPFL's and pFedLIA's validation split, FedFomo's
  held-out share of the training split; 0 for a method that declares none);
- ``models_recv`` and ``mb_recv`` / ``mb_sent``: the models and megabytes
  (10^6 bytes) a client received and sent over the run (``/comm/*``).

A log thinned by ``log.every`` holds every k-th round: its totals are the logged
rounds' scaled to the rounds run. A log written before ``/train/*`` existed
reports no steps (nan); one resumed (or extended) by a later version holds 0 steps
for the rounds written before it, which the totals then miss.

``python -m mpifl.analyze PATHS`` writes the table per group (per method, and per
cell of a sweep) as ``budget.csv`` / ``budget.md``; with ``--versus NAME`` it
prints, per compared method, every resolved config key whose value differs
from the baseline's (:func:`differ`; algorithm sections included, ``–`` where a
method does not read a section) and its budget against the baseline's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from mpifl.analysis.stats import mean_std
from mpifl.logging.h5 import Run

# per-client totals over a run (the mean over clients reported), and how the table names them
FIELDS = {"steps_first": "steps in round 1", "steps_round": "steps/round after", "steps": "steps",
          "samples": "train samples",
          "select_samples": "selection samples", "models_recv": "models recv", "mb_recv": "MB recv",
          "mb_sent": "MB sent"}
# a record's rows of them (``--record``): ``budget:steps``, ... (mpifl.analysis.summary.metric_value)
METRIC = "budget:"
METRICS = tuple(METRIC + f for f in FIELDS)


def _total(run: Run, key: str) -> np.ndarray | None:
    """Per client, ``key`` summed over the run (scaled to every round where the log is thinned)."""
    if key not in run.datasets or run.n_rounds == 0:
        return None
    x = np.asarray(run.get(key), np.float64)
    return x.sum(0) * (run.rounds_done / len(x))


def selection_samples(config: dict[str, Any], n_train: np.ndarray, n_val: np.ndarray) -> np.ndarray:
    """Per client, the samples the run's algorithm declares it chooses or weights
    collaborators on (zeros where it declares none); ``config``: flattened."""
    from mpifl.algorithms import config_part

    name = str(config.get("algorithm.name"))
    mod = config_part(name)
    fn = getattr(mod, "selection_samples", None)
    if fn is None:
        return np.zeros(len(n_val))
    params = mod.Params(**{f.name: config[f"{name}.{f.name}"] for f in dataclasses.fields(mod.Params)
                           if f"{name}.{f.name}" in config})
    return np.asarray(fn(params, n_train, n_val), np.float64)


def of_run(run: Run, config: dict[str, Any]) -> dict[str, float]:
    """The run's budget (:data:`FIELDS`), each the mean over clients."""
    n_train = run.get("clients/n_train") if "clients/n_train" in run.datasets else np.zeros(0)
    n_val = run.get("clients/n_val") if "clients/n_val" in run.datasets else np.zeros_like(n_train)
    steps = _total(run, "train/steps")
    out = {"steps_first": math.nan, "steps_round": math.nan,
           "steps": math.nan if steps is None else float(steps.mean())}
    if steps is not None:
        rows, first = np.asarray(run.get("train/steps"), np.float64), run.rounds[0] == 0
        out["steps_first"] = float(rows[0].mean()) if first else math.nan
        if len(rows) > int(first):
            out["steps_round"] = float(rows[int(first):].mean())
    for name, key, scale in (("samples", "train/samples", 1.0), ("models_recv", "comm/models_recv", 1.0),
                             ("mb_recv", "comm/bytes_recv", 1e-6), ("mb_sent", "comm/bytes_sent", 1e-6)):
        x = _total(run, key)
        out[name] = math.nan if x is None else scale * float(x.mean())
    out["select_samples"] = float(selection_samples(config, n_train, n_val).mean()) if len(n_train) else math.nan
    return out


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "–"
    return f"{v:,.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.3g}"


def table(groups: list, keys: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns and rows of the budget table: per group, the mean over its runs."""
    cols = [*keys, "n_runs", *FIELDS]
    rows = []
    for g in groups:
        row: dict[str, Any] = {**dict(zip(keys, g.key)), "n_runs": len(g.runs)}
        for f in FIELDS:
            row[f] = mean_std([r.budget.get(f, math.nan) for r in g.runs])[0]
        rows.append(row)
    return cols, rows


def markdown(cols: list[str], rows: list[dict[str, Any]]) -> str:
    head = [c for c in cols if c not in FIELDS]
    lines = ["| " + " | ".join([*head, *FIELDS.values()]) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join([*(str(r[c]) for c in head), *(_fmt(r[f]) for f in FIELDS)]) + " |" for r in rows]
    return "\n".join(lines) + ("\n\nBudget per client, mean over clients and runs, from each run's log and stored "
                               "config: optimizer steps a round and in all, the training samples they took, the "
                               "samples it chose or weighted collaborators on, models and MB received and sent "
                               "(mpifl/analysis/budget.py).\n")


def _at(r: Any, base: str, where: dict[str, str] | None) -> bool:
    """Whether run ``r`` is of the baseline ``base`` (at ``where``'s settings, where given)."""
    return r.config.get("algorithm.name") == base and all(str(r.config.get(k)) == v for k, v in (where or {}).items())


def differ(runs: list, base: str, methods: list[str], setting: Callable[[Any, str], str],
           ignored: tuple[str, ...], where: dict[str, str] | None = None) -> dict[str, list[tuple[str, str, str]]]:
    """Per method (``algorithm.name``; ``methods`` only, if given) other than
    ``base``: (key, its values, the baseline's) of every resolved config key whose
    values over the method's runs differ from those over the baseline's; a run's
    value is ``setting(run, key)`` (``mpifl.analysis.tables.setting``), keys
    ``ignored`` (where and how a run ran, its seed) and ``run.name`` left out."""

    def _values(rs: list, key: str) -> str:
        return ", ".join(sorted({setting(r, key) for r in rs}))

    by: dict[str, list] = {}
    for r in runs:
        if r.config.get("algorithm.name") != base or _at(r, base, where):  # the baseline at where's settings
            by.setdefault(str(r.config.get("algorithm.name")), []).append(r)
    if base not in by:
        return {}
    keys = list(dict.fromkeys(k for r in runs for k in r.config if k not in ignored and k != "run.name"))
    out = {}
    for m, rs in by.items():
        if m == base or (methods and m not in methods):
            continue
        out[m] = [(k, _values(rs, k), _values(by[base], k)) for k in keys
                  if _values(rs, k) != _values(by[base], k)]
    return out


def _ratio(a: float, b: float) -> str:
    return f" ({a / b:.2f}x)" if b and not (math.isnan(a) or math.isnan(b)) else ""


def versus_block(runs: list, base: str, methods: list[str], setting: Callable[[Any, str], str],
                 ignored: tuple[str, ...], where: dict[str, str] | None = None) -> str:
    """The settings that differ between each method and ``base`` (:func:`differ`)
    and their budgets side by side (mean over each method's runs), as ``analyze
    --versus`` prints it."""
    rows = differ(runs, base, methods, setting, ignored, where)
    if not rows:
        return ""
    at = f" at {', '.join(f'{k}={v}' for k, v in where.items())}" if where else ""
    lines = [f"Settings that differ from {base}{at} (every resolved config key; – where a method does not read "
             f"that section), and the budget per client (mean over runs):", ""]
    for m, keys in rows.items():
        lines.append(f"- {m} vs {base}:")
        lines += [f"  - {k}: {a} | {b}" for k, a, b in keys]
        mine = [r for r in runs if r.config.get("algorithm.name") == m]
        theirs = [r for r in runs if _at(r, base, where)]
        for f, label in FIELDS.items():
            a = mean_std([r.budget.get(f, math.nan) for r in mine])[0]
            b = mean_std([r.budget.get(f, math.nan) for r in theirs])[0]
            lines.append(f"  - budget {label}: {_fmt(a)} | {_fmt(b)}{_ratio(a, b)}")
    return "\n".join(lines) + "\n"

