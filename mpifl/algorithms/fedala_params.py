"""The config part of :mod:`mpifl.algorithms.fedala` (light: a config command imports it alone)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpifl.errors import check
from mpifl.schema import ConfigBase as Config


@dataclass
class Params:
    eta: float = 1.0  # learning rate of W (paper: 1.0; 0 = W stays at ones: FedAvg)
    rand_percent: int = 80  # s: percent of a client's training data W learns on (paper: 80)
    layers: int = 1  # p: top layers adapted, counted from the output (paper: 1; PFLlib -p 2 tensors; 0 = FedAvg)
    threshold: float = 0.1  # start phase ends when the std of the last num_pre_loss losses is below (authors': 0.1)
    num_pre_loss: int = 10  # losses that std is taken over (authors' code: 10)
    start_limit: int = 100  # at most this many epochs of W in the start phase (the paper has no bound)
    # the model each client is evaluated on: trained = theta_i after local training (Algorithm 1's
    # output); adapted = theta^_i from the new global model (the authors' code's and PFLlib's)
    evaluate: str = "trained"

    def validate(self, cfg: Config) -> None:
        check(self.eta >= 0 and math.isfinite(self.eta), "eta", self.eta, "must be a finite number >= 0")
        check(1 <= self.rand_percent <= 100, "rand_percent", self.rand_percent, "must be an integer in [1, 100]")
        check(self.layers >= 0, "layers", self.layers, "must be >= 0 (0 = FedAvg)")
        check(self.threshold >= 0 and math.isfinite(self.threshold), "threshold", self.threshold,
              "must be a finite number >= 0")
        check(1 <= self.num_pre_loss <= 1000, "num_pre_loss", self.num_pre_loss, "must be an integer in [1, 1000]")
        # every epoch of it passes over the client's data: bounded, so 10^18 is refused rather than run forever
        check(1 <= self.start_limit <= 10000, "start_limit", self.start_limit, "must be an integer in [1, 10000]")
        check(self.evaluate in ("trained", "adapted"), "evaluate", self.evaluate, "must be one of trained, adapted")
