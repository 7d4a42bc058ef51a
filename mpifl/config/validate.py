"""Ranges and combinations of a built Config (types and choices were checked
while building). ``algorithm.name`` is checked against the registry
(``mpifl.algorithms``), which validates the algorithm sections."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from typing import Any

from mpifl import algorithms
from mpifl.errors import ConfigError, check, did_you_mean, shorten

# C0 controls (newline, tab, escape...), DEL and C1 controls: a newline in a
# value that reaches a shell script (run.name, run.out_dir) would be a new command
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits on one path component and a whole path, in bytes
PATH_ROOM = 128  # bytes kept for what mpifl writes under the run directory (checkpoint/.round-NNNNNN.tmp/...)


def _check_text(cfg: Any) -> None:
    """No string of the config holds a control character."""
    for section in dataclasses.fields(cfg):
        part = getattr(cfg, section.name)
        for f in dataclasses.fields(part):
            v = getattr(part, f.name)
            if isinstance(v, str) and CONTROL.search(v):
                raise ConfigError(f"{section.name}.{f.name}={shorten(repr(v))} is not allowed; "
                                  f"no newlines or other control characters")


def _check_printable(cfg: Any) -> None:
    """``run.name`` and ``run.out_dir`` can be printed where the run prints (its
    progress lines name the run directory): a non-ASCII path under
    ``PYTHONIOENCODING=ascii`` is refused here, not met as a traceback after round 0."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    for key in ("out_dir", "name"):
        value = getattr(cfg.run, key)
        try:
            value.encode(encoding)
        except UnicodeEncodeError:
            raise ConfigError(f"run.{key}={shorten(repr(value))} is not allowed here: this process's output "
                              f"encoding ({encoding}) cannot print it; use an ASCII {key.replace('_', ' ')}, or set "
                              f"PYTHONIOENCODING=utf-8 (or a UTF-8 locale)") from None
        except LookupError:  # an encoding Python does not know: printing would fail for everything alike
            return


def _check_run_path(cfg: Any) -> None:
    """The run directory's path fits the OS's limits with the files mpifl writes
    under it: every component at most NAME_MAX bytes, the whole at most PATH_MAX
    less :data:`PATH_ROOM` (ENAMETOOLONG from the first mkdir otherwise)."""
    path = os.fsencode(os.path.abspath(cfg.run_dir))
    longest = max((len(c) for c in path.split(b"/")), default=0)
    if longest > NAME_MAX or len(path) > PATH_MAX - PATH_ROOM:
        raise ConfigError(f"run.out_dir={shorten(repr(cfg.run.out_dir), 60)} is not allowed: the run directory's "
                          f"path is {len(path)} bytes (at most {PATH_MAX - PATH_ROOM}: PATH_MAX less room for the "
                          f"files under it) with a component of {longest} (at most {NAME_MAX}); pick a shorter one")


def validate(cfg: Any, n_ranks: int = 1) -> None:
    """Ranges and combinations; types and choices were checked while building.
    ``algorithm.name`` must be in the registry, which then validates the algorithm
    sections (:func:`mpifl.algorithms.validate`)."""
    r, d, m, t, a = cfg.run, cfg.data, cfg.model, cfg.train, cfg.algorithm
    # first, as when the name was a choice of its section: a bad name says so whatever else is wrong
    if a.name not in algorithms.NAMES:
        raise ConfigError(f"algorithm.name={a.name!r} is not allowed{did_you_mean(a.name, algorithms.NAMES)}; "
                          f"choose one of: {', '.join(algorithms.NAMES)}")
    _check_text(cfg)
    check(bool(r.name) and "/" not in r.name and r.name not in (".", "..") and len(r.name.encode()) <= 255,
           "run.name", r.name, "must be a plain non-empty directory name of at most 255 bytes")
    _check_printable(cfg)
    _check_run_path(cfg)
    check(r.rounds >= 1, "run.rounds", r.rounds, "must be >= 1")
    check(r.seed >= 0, "run.seed", r.seed, "must be >= 0")
    check(r.eval_every >= 1, "run.eval_every", r.eval_every, "must be >= 1")
    check(r.threads >= 0, "run.threads", r.threads, "must be >= 0 (0 = automatic)")
    check(r.checkpoint_every >= 0, "run.checkpoint_every", r.checkpoint_every, "must be >= 0")
    check(r.keep_checkpoints >= 1, "run.keep_checkpoints", r.keep_checkpoints, "must be >= 1")
    if cfg.log.tensorboard:
        from mpifl.logging.tensorboard import require

        require()
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
    check(d.train_per_client >= 0, "data.train_per_client", d.train_per_client,
           "must be >= 0 (0 = every client's whole training part)")
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
    check(not m.batchnorm or m.name == "mlp", "model.batchnorm", m.batchnorm,
           f"applies to model.name=mlp only (model.name={m.name!r} has its own layers)")
    check(t.lr > 0 and math.isfinite(t.lr), "train.lr", t.lr, "must be a finite number > 0")
    check(0 <= t.momentum < 1, "train.momentum", t.momentum, "must be in [0, 1)")
    check(0 <= t.weight_decay < math.inf, "train.weight_decay", t.weight_decay, "must be a finite number >= 0")
    check(t.batch_size >= 1, "train.batch_size", t.batch_size, "must be >= 1")
    check(t.local_epochs >= 0, "train.local_epochs", t.local_epochs, "must be >= 0")
    check(t.max_steps >= 0, "train.max_steps", t.max_steps, "must be >= 0 (0 = no cap)")
    check(0 < a.fraction <= 1, "algorithm.fraction", a.fraction, "must be in (0, 1]")
    check(cfg.log.every >= 1, "log.every", cfg.log.every, "must be >= 1")
    check(cfg.log.dense_max >= 1, "log.dense_max", cfg.log.dense_max, "must be >= 1")
    check(0 <= cfg.log.flush_s < math.inf, "log.flush_s", cfg.log.flush_s, "must be a finite number >= 0")
    algorithms.validate(cfg)
