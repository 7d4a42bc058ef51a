"""The config part of :mod:`mpifl.algorithms.federico` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config

NO_CLUSTERS = ("iid", "patho", "dirichlet")  # partitions that record no true groups


@dataclass
class Params:
    """Hyper-parameters: the config section ``federico``."""

    k: int = 3  # neighbours each client samples per round (never itself)
    eps: float = 0.3  # probability of k uniform draws instead of the k highest weights
    beta: float = 0.6  # EMA momentum of the tracked losses: Lhat <- (1-beta) Lhat + beta L
    temperature: float = 1.0  # client weights w = softmax(-Lhat / temperature)
    loss_scale: Literal["mean", "sum"] = "mean"  # sum: Lhat times n_i^train, as in the likelihood
    estep_batches: str = "1"  # local train batches of the E-step loss: a count, or all
    # Lhat before any measurement: first = the loss a client measures in round 1 for its
    # own model (with init=shared that is every model's); zero = optimistic
    loss_init: Literal["first", "zero"] = "first"
    # each client's model before round 1: per_client (default) = drawn from the client's own
    # seeded stream (the paper's clients own and initialise their models, as FedEM's
    # learners are built one by one with their own seeds); shared = the run's one init
    init: Literal["per_client", "shared"] = "per_client"
    # an ablation, not the paper: groups = every client's weights w_i masked to its true
    # group (the partition's clusters) and renormalised, so gradients and predictions
    # mix only group-mates; the sampling rule is unchanged (top-k then picks group-mates
    # first; an eps draw may pull an outsider, weighted 0). Asks whether the EM weighting
    # is what fails: with the true groups given, only the weighting inside them is learned
    mask: Literal["none", "groups"] = "none"

    def validate(self, cfg: Config) -> None:
        check(self.k >= 1, "k", self.k, "must be >= 1")
        check(0 <= self.eps <= 1, "eps", self.eps, "must be in [0, 1]")
        check(0 < self.beta <= 1, "beta", self.beta, "must be in (0, 1]")
        check(self.temperature > 0 and math.isfinite(self.temperature), "temperature", self.temperature,
              "must be a finite number > 0")
        check(self.estep_batches == "all" or (self.estep_batches.isdigit() and int(self.estep_batches) >= 1),
              "estep_batches", self.estep_batches, "must be a positive integer or all")


def held_rows(cfg: Config) -> int:
    """Parameter rows a client's round holds at once beyond the engine's own (its
    model and optimizer state): its k + 1 models stacked for the gradients and their
    k + 1 gradients. ``mpifl.run.memory`` adds them to the estimate a run is checked
    against at start; the k pulled models are left out, since clients on a rank may
    pull the same ones."""
    return 2 * (cfg.federico.k + 1)


def check_config(cfg: Config) -> None:
    f, n = cfg.federico, cfg.data.n_clients
    check(f.k <= n - 1, "k", f.k, f"must be <= data.n_clients - 1 ({n - 1}): a client never samples itself")
    check(f.init == "shared" or not cfg.model.weights, "init", f.init,
          "model.weights gives every client the same weights: use federico.init=shared")
    p = cfg.data.partition
    check(f.mask == "none" or p not in NO_CLUSTERS, "mask", f.mask,
          f"needs true groups: data.partition={p!r} records none; use clusters, noisy_clusters, "
          "permuted_clusters, domains, feature_shift or label_flip")
