"""FedAvg+FT ("FedAvg+"): FedAvg, then before evaluation every client fine-tunes
a global model for ``fedavg_ft.ft_epochs`` local epochs (default 0: 2 * ``train.local_epochs``,
DPFL's 2*tau) on its own data and is
evaluated on the result. Evaluation-time only: neither the global model nor the
clients' training state is changed by fine-tuning.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedavg_ft fedavg_ft.ft_epochs=1

Which global model is fine-tuned (``fedavg_ft.start``):

- ``last`` (default, mpifl's FedAvg+FT so far): the current global model w^{t+1}.
- ``best_val``: DPFL's FedAvg+FT (appendix F.6: "save the best models on the
  validation dataset when training, then starting from that model perform 2*tau
  local epochs"): after every round the new global model is evaluated on every
  client's validation split; the model with the highest mean over clients of
  that accuracy so far (the earliest on ties) is kept in the state (and in
  checkpoints), and fine-tuning starts from it. This costs one validation pass
  per round, whatever ``run.eval_every`` is, so the choice does not depend on
  the evaluation schedule.

Fine-tuning runs from a fresh optimizer on batches of its own purpose
("finetune"), through ``Clients.using`` on a copy of the model per client.
FedProx+FT (``fedprox_ft``) shares this module's fine-tuning and tracking.

Logged: the mixing row (as FedAvg); with ``best_val``, ``/<name>/global_val_acc``
(each client's validation accuracy of the new global model) every round and the
root attribute ``best_round`` (the round whose model fine-tuning starts from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from mpifl.algorithms import fedavg
from mpifl.algorithms.base import Context, Round, own_rows_metrics
from mpifl.errors import check

if TYPE_CHECKING:
    from mpifl.config.sections import ConfigBase as Config

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = (
    "FedAvg, then `fedavg_ft.ft_epochs` of local fine-tuning before evaluation, from the current global "
    "model or (`fedavg_ft.start=best_val`, DPFL's FedAvg+FT) the one of best mean validation accuracy"
)
MIXING_ROW = "as fedavg"


@dataclass
class Params:
    # global model fine-tuned before evaluation: last = the current one, best_val =
    # the one of best mean validation accuracy over clients so far (DPFL's FedAvg+FT)
    start: Literal["last", "best_val"] = "last"
    # local fine-tuning epochs before evaluation; 0 = 2 * train.local_epochs, DPFL's 2*tau (appendix F.6)
    ft_epochs: int = 0

    def validate(self, cfg: Config) -> None:
        check(self.ft_epochs >= 0, "ft_epochs", self.ft_epochs, "must be >= 0 (0 = 2 * train.local_epochs)")
        check_start(self, cfg)


def check_start(p: Any, cfg: Config) -> None:
    """best_val needs validation samples, only when the algorithm whose section
    ``p`` is (this module's Params or FedProx+FT's) is chosen."""
    if getattr(cfg, cfg.algorithm.name, None) is p:
        check(p.start != "best_val" or cfg.data.val_frac > 0, "start", p.start,
              "best_val needs validation samples: set data.val_frac > 0 or use last")


def selection_samples(p: Any, n_train: np.ndarray, n_val: np.ndarray) -> np.ndarray:
    """Per client, the samples the model it fine-tunes is chosen on: with ``start:
    best_val`` its validation split (the global model of best mean validation
    accuracy), else none."""
    return np.asarray(n_val) if p.start == "best_val" else np.zeros_like(np.asarray(n_val))


@dataclass
class State:
    model: torch.Tensor  # [P] the global model, identical on every rank
    best: torch.Tensor | None = None  # [P] the global model of best mean val accuracy (start=best_val)
    best_acc: float = -1.0  # its mean validation accuracy over clients
    best_round: int = -1


def init(ctx: Context) -> State:
    return State(model=ctx.clients.init.clone())


def round(ctx: Context, state: State, t: int) -> Round:
    state.model, out = fedavg.step(ctx, state.model, t, ctx.cfg.algorithm.fraction)
    if ctx.params.start == "best_val":
        track_best(ctx, state, out, t)
    return out


def ft_epochs(ctx: Context) -> int:
    """The fine-tuning epochs: the chosen algorithm's ``ft_epochs``, 0 meaning DPFL's 2 * tau."""
    return ctx.params.ft_epochs or 2 * ctx.cfg.train.local_epochs


def evaluate(ctx: Context, state: State, t: int) -> dict[str, np.ndarray]:
    start = state.best if ctx.params.start == "best_val" else state.model
    return finetuned_metrics(ctx, start, ft_epochs(ctx), t)


def track_best(ctx: Context, state: State, out: Round, t: int) -> None:
    """Evaluate the new global model on every client's val split and keep it in
    ``state.best`` if its mean over clients beats the best so far. The mean is
    taken over all N clients' accuracies gathered in client order, so it is the
    same number on every rank and for every rank count."""
    _, acc = ctx.clients.evaluate("val", state.model)
    mean = float(np.nanmean(ctx.comm.allgather_rows(acc)))
    if state.best is None or mean > state.best_acc:
        state.best, state.best_acc, state.best_round = state.model.clone(), mean, t
    out.extras["global_val_acc"] = acc
    out.attrs["best_round"] = state.best_round


def finetuned_metrics(ctx: Context, model: torch.Tensor, epochs: int, t: int) -> dict[str, np.ndarray]:
    """val/test metrics of every client after ``epochs`` local epochs from ``model``
    [P] with a fresh optimizer; the clients' own rows and optimizer are untouched."""
    c = ctx.clients
    with c.using(model.repeat(c.n, 1)):
        c.train(np.arange(c.n), epochs, t, purpose="finetune")
        return own_rows_metrics(ctx)
