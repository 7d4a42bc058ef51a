"""The summary table over runs: which config keys vary between them, the runs
grouped by those keys, mean ± std over seeds per group, written as CSV and Markdown,
and the provenance line of a table (with a warning for each fact its runs disagree on)."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpifl.analysis.stats import mean_std
from mpifl.analysis.summary import ACC, JOB, PCT, WINDOW, Summary
from mpifl.config.identity import HOW, WHERE
from mpifl.paths import atomic_write_text

# keys that say where or how a run ran, not what it computed (mpifl.config.identity),
# the seed (the spread over seeds is the point of a group) and where its data was read
IGNORED = ("run.seed", "data.root", *WHERE, *HOW)


def _key(v: Any) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, list):
        return "[" + ", ".join(map(_key, v)) + "]"
    return str(v)


NOT_APPLICABLE = "–"
# not a config key: the conv kernel a run's clients trained on (its provenance's
# train facts; train.fused_conv=auto takes the fused one where it builds), a
# grouping of its own where runs differ in it: other sums, other numbers
KERNEL = "conv_kernel"


def setting(r: Summary, key: str) -> str:
    """A run's value of ``key`` as a grouping label; ``–`` for a key of another
    algorithm's section, which that run never read (and for :data:`KERNEL` where
    no grouped convolution trained)."""
    from mpifl.algorithms import NAMES

    if key == KERNEL:
        train = r.provenance.get("train")
        kernel = train.get("conv_kernel", NOT_APPLICABLE) if isinstance(train, dict) else "unknown"
        return NOT_APPLICABLE if kernel is None else str(kernel)
    section = key.split(".", 1)[0]
    algo = str(r.config.get("algorithm.name"))
    if section in NAMES and section != algo and not algo.startswith(section + "_"):
        return NOT_APPLICABLE
    return _key(r.config.get(key))


def varying_keys(runs: list[Summary]) -> list[str]:
    """Config keys whose values differ between runs (besides IGNORED and other
    algorithms' sections), in config order; ``algorithm.name`` first and always;
    :data:`KERNEL` last where the runs trained on different conv kernels."""
    keys: list[str] = []
    for r in runs:
        keys += [k for k in r.config if k not in keys]
    vary = [k for k in keys if k not in IGNORED
            and len({setting(r, k) for r in runs} - {NOT_APPLICABLE}) > 1]
    if JOB in vary:
        # what a job file sets is told by its name; only keys varied on top of it are columns
        jobs: dict[str, list[Summary]] = {}
        for r in runs:
            jobs.setdefault(str(r.config.get(JOB)), []).append(r)
        vary = [JOB] + [k for k in vary
                        if any(len({setting(r, k) for r in rs} - {NOT_APPLICABLE}) > 1 for rs in jobs.values())]
    kernel = [KERNEL] if len({setting(r, KERNEL) for r in runs} - {NOT_APPLICABLE}) > 1 else []
    return ["algorithm.name"] + [k for k in vary if k != "algorithm.name"] + kernel


@dataclass
class Group:
    key: tuple  # values of the varying keys
    runs: list[Summary]
    names: tuple = ()  # the varying keys themselves

    @property
    def label(self) -> str:
        """``algorithm.name=oracle, data.n_clients=20``: each value with its key."""
        return ", ".join(f"{k}={v}" for k, v in zip(self.names, self.key)) if self.names else ", ".join(self.key)


def group_runs(runs: list[Summary], keys: list[str]) -> list[Group]:
    groups: dict[tuple, list[Summary]] = {}
    for r in runs:
        r.group = tuple(setting(r, k) for k in keys)
        groups.setdefault(r.group, []).append(r)
    return [Group(k, sorted(v, key=lambda r: r.seed), tuple(keys)) for k, v in groups.items()]


def table(groups: list[Group], keys: list[str], ddof: int = 1) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns and rows of the summary table: ``<metric>_mean`` and ``_std`` over
    seeds, accuracies in percent (``final_acc_pct_mean``), ARI as it is."""
    ari_sources = sorted({s for g in groups for r in g.runs for s in r.ari})
    cols = [*keys, "n_seeds", "seeds", "rounds"]
    metrics = [*(m + PCT for m in ACC), *(f"ari_{s}" for s in ari_sources)]
    for m in metrics:
        cols += [f"{m}_mean", f"{m}_std"]
    rows = []
    for g in groups:
        row: dict[str, Any] = dict(zip(keys, g.key))
        row["n_seeds"] = len(g.runs)
        row["seeds"] = " ".join(str(r.seed) for r in g.runs)
        done = [r.rounds_done for r in g.runs]
        planned = {r.rounds_planned for r in g.runs}
        row["rounds"] = f"{min(done)}" + (f"/{planned.pop()}" if len(planned) == 1 else "") + \
            ("" if all(r.complete for r in g.runs) else " (incomplete)")
        for m in ACC:
            row[f"{m}{PCT}_mean"], row[f"{m}{PCT}_std"] = mean_std([100.0 * getattr(r, m) for r in g.runs], ddof)
        for s in ari_sources:
            row[f"ari_{s}_mean"], row[f"ari_{s}_std"] = mean_std([r.ari.get(s, math.nan) for r in g.runs], ddof)
        rows.append(row)
    return cols, rows


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return "" if v is None else str(v)


def write_csv(path: Path, cols: list[str], rows: list[dict[str, Any]]) -> None:
    """Written whole or not at all (a full disk leaves no empty or cut table)."""
    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(cols)
    for r in rows:
        w.writerow([_fmt(r.get(c, "")) for c in cols])
    atomic_write_text(path, f.getvalue())


def markdown(cols: list[str], rows: list[dict[str, Any]], ddof: int, window: int = WINDOW) -> str:
    """The table's cells as mean ± std, in the CSV's units (its column
    ``final_acc_pct`` is ``final_acc_pct_mean`` ± ``final_acc_pct_std``)."""
    head = [c for c in cols if not c.endswith(("_mean", "_std"))]
    pairs = [c[: -len("_mean")] for c in cols if c.endswith("_mean")]
    lines = ["| " + " | ".join([*head, *pairs]) + " |", "|" + "---|" * (len(head) + len(pairs))]
    for r in rows:
        cells = [str(r[c]) for c in head]
        for m in pairs:
            mean, std = r[f"{m}_mean"], r[f"{m}_std"]
            digits = 3 if m.startswith("ari_") else 2
            if math.isnan(mean):
                cells.append("–")
            elif math.isnan(std):
                cells.append(f"{mean:.{digits}f}")
            else:
                cells.append(f"{mean:.{digits}f} ± {std:.{digits}f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    what = "sample std, ddof=1" if ddof == 1 else f"std with ddof={ddof}"
    lines.append(f"`_pct`: accuracy in %; mean ± std over seeds ({what}). `final`: the last evaluated round; `tail`: "
                 f"mean of the last {window} evaluated rounds; `best`: per client, test accuracy at its "
                 f"best-validation round; `_w`: clients weighted by test-set size.")
    return "\n".join(lines) + "\n"




def table_provenance(runs: list[Summary], what: str, echo=print) -> str:
    """The provenance line of a table's runs; a warning echoed for each fact that
    differs between them (commit, CPU capability, device)."""
    from mpifl.run.provenance import table_line

    line, warnings = table_line([r.provenance for r in runs])
    for w in warnings:
        echo(f"mpifl.analyze: warning: {what} mixes {w}")
    return line
