"""What every algorithm module provides and receives.

An algorithm is a module of this package satisfying :class:`Algorithm`; it gets
a :class:`Context` and returns a :class:`Round` each round. It talks to other
ranks only through ``ctx.comm`` (never mpi4py) and writes nothing itself: what it
returns is logged by the runtime. The building blocks algorithms share are in
:mod:`mpifl.algorithms.blocks`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from mpifl.data import FederatedData
from mpifl.logging.mixing import Mixing
from mpifl.rng import GLOBAL, rng
from mpifl.schema import ConfigBase as Config
from mpifl.schema import sampled_count

if TYPE_CHECKING:  # algorithms are imported by the config (their Params) before MPI is wanted
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager

    import torch
    from torch import nn

    from mpifl.comm import Comm
    from mpifl.train import BatchPlan, Objective, RowOptimizer, Step


class ClientsSurface(Protocol):
    """What an algorithm may use of its rank's clients (``ctx.clients``, a
    :class:`mpifl.train.Clients`): their rows, counts, training and evaluation, and
    the hooks a custom step needs. The engine's internals (the optimizer, the
    layout, the training path, the data tensors, the template model, the training
    config) stay behind these; ``tests/test_structure.py`` holds every algorithm
    module and ``blocks`` to this list. Each member's docstring is on ``Clients``."""

    # the rows: [n_local, P] parameters, [n_local, B] float buffers, the common initial row [P]
    n: int
    P: int
    ids: np.ndarray
    device: torch.device
    n_classes: int
    sizes: np.ndarray  # [n_local, 3] samples per split (train, val, test)

    @property
    def init(self) -> torch.Tensor: ...
    @property
    def params(self) -> torch.Tensor: ...
    @property
    def buffers(self) -> torch.Tensor: ...
    @property
    def n_samples(self) -> int: ...
    @property
    def param_names(self) -> list[str]: ...
    @property
    def rows_at_once(self) -> bool: ...

    # training, evaluation and what they count
    def train(self, local: np.ndarray, epochs: int, round: int, purpose: str = "train",
              subsets: list[np.ndarray] | None = None, objective: Objective | None = None,
              step: Step | None = None, batch_size: int | None = None,
              max_batches: int | None = None) -> np.ndarray: ...
    def evaluate(self, split: str, params: torch.Tensor | None = None,
                 local: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]: ...
    def scorer(self, split: str, local: np.ndarray) -> Callable[[torch.Tensor], np.ndarray]: ...
    def using(self, params: torch.Tensor,
              opt_state: dict[str, torch.Tensor] | None = None) -> AbstractContextManager[None]: ...
    def count(self, local: np.ndarray, steps: np.ndarray | int, samples: np.ndarray | int) -> None: ...

    # the optimizer, through these only
    def reset_optimizer(self, sel: torch.Tensor | slice = ...) -> None: ...
    def fresh_optimizer_state(self, n: int) -> dict[str, torch.Tensor]: ...
    def optimizer(self, width: int | None = None,
                  state: dict[str, torch.Tensor] | None = None) -> RowOptimizer: ...
    def apply_gradient(self, g: torch.Tensor) -> None: ...

    # the model on rows, and the data in batches: the hooks of custom steps
    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              local: np.ndarray | None = None, bias: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...
    def scratch(self, key: str, rows: int) -> torch.Tensor: ...
    def logits(self, params: torch.Tensor, x: torch.Tensor, local: np.ndarray | None = None) -> torch.Tensor: ...
    def shared_logits(self, row: torch.Tensor, x: torch.Tensor, local: np.ndarray) -> torch.Tensor: ...
    def parts(self, params: torch.Tensor) -> dict[str, torch.Tensor]: ...
    def write_parts(self, out: torch.Tensor, parts: dict[str, torch.Tensor]) -> None: ...
    def buffers_of(self, k: int) -> dict[str, torch.Tensor] | None: ...
    def slices(self, names: list[str]) -> list[slice]: ...
    def layers(self) -> list[tuple[str, nn.Module, list[str]]]: ...
    def flatten(self, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]: ...
    def plan(self, local: np.ndarray, epochs: int, round: int, purpose: str = "train",
             batch_size: int | None = None, max_batches: int | None = None,
             subsets: list[np.ndarray] | None = None) -> BatchPlan: ...
    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...
    def split_batches(self, split: str, local: np.ndarray | None = None
                      ) -> Iterator[tuple[slice, np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor]]: ...
    def split_index(self, local: np.ndarray, split: str) -> np.ndarray: ...
    def split_range(self, k: int, split: str) -> tuple[int, int]: ...
    def relabel(self, k: int, perm: torch.Tensor) -> None: ...


class RoundStopped(Exception):
    """Every rank agreed to abandon the round in progress: a stop signal arrived and
    the last complete round is already on disk (``Interrupt.abandonable``)."""


@dataclass
class Interrupt:
    """A stop signal seen inside a round (``ctx.stop``), for the rounds that run
    for minutes (DPFL's graph search, FedC2I's leave-one-out pass at large N).

    A round normally ends before the job stops, and is checkpointed. The runtime
    sets ``abandonable`` when that is not needed: the round before is already on
    disk (it checkpoints after any round longer than ``LONG_ROUND_S``, and before
    one the algorithm's ``long_round`` names), or this is round 0 (started over, it
    gives the same bits). Then an algorithm may stop
    a long round early:

    - between pieces of work one rank does alone (its own clients): ``if
      ctx.stop.requested: break``; what it leaves half done is thrown away;
    - at a step every rank takes together: ``ctx.stop.agreed(comm, x)`` in place
      of ``comm.allreduce_max(x)``; it raises :class:`RoundStopped` on every rank
      at once when any rank was asked to stop.

    A round cut short on any rank is abandoned on every rank: the runtime agrees
    after ``round`` returns too, and never logs or checkpoints it (the job exits
    and the state it held is gone), so an algorithm agrees early only to skip the
    work that would follow. Outside a run (tests, benches) nothing is requested."""

    signum: int = 0  # the stop signal this rank received (set by the runtime's handler)
    abandonable: bool = False  # the runtime's, each round
    cut: bool = False  # this rank skipped work this round because of ``requested``

    @property
    def requested(self) -> bool:
        """Whether this rank should skip the rest of its own work now (no communication)."""
        if self.signum and self.abandonable:
            self.cut = True
        return self.cut

    def agreed(self, comm: Comm, x: float = 0.0) -> float:
        """``comm.allreduce_max(x)``, and the stop decided together: a rank asked to
        stop contributes +inf, which every rank then sees and raises on."""
        out = comm.allreduce_max(math.inf if self.requested else float(x))
        if out == math.inf:
            self.cut = True
            raise RoundStopped()
        return out


@dataclass
class Context:
    cfg: Config
    comm: Comm
    clients: ClientsSurface
    data: FederatedData
    stop: Interrupt = field(default_factory=Interrupt)

    @property
    def params(self) -> Any:
        """The chosen algorithm's own section (its module's ``Params``), None for
        an algorithm without hyper-parameters."""
        return getattr(self.cfg, self.cfg.algorithm.name, None)

    @property
    def N(self) -> int:
        return self.data.n_clients

    @property
    def p(self) -> np.ndarray:
        """Client weights p_i = n_i^train / sum_j n_j^train, all N clients."""
        return self.data.weights()

    def rng(self, round: int, client: int, purpose: str) -> np.random.Generator:
        return rng(self.cfg.run.seed, round, client, purpose)

    def sample(self, round: int, fraction: float) -> np.ndarray:
        """The clients taking part in a round: the same on every rank."""
        m = sampled_count(fraction, self.N)
        return np.sort(self.rng(round, GLOBAL, "sample").choice(self.N, m, replace=False))

    def local_of(self, ids: np.ndarray) -> np.ndarray:
        """Positions in this rank's block of those ``ids`` that live here."""
        ids = np.asarray(ids)
        mine = (ids >= self.comm.first) & (ids < self.comm.first + self.comm.n_local)
        return ids[mine] - self.comm.first


@dataclass
class Round:
    """What one round produced on this rank (rows: this rank's clients)."""

    train_loss: np.ndarray  # [n_local], nan where a client did not train
    # what each client's model was averaged from: this rank's rows (Dense [n_local, N],
    # dense or scipy.sparse), one row for all (Shared) or groups (Grouped)
    mixing: Mixing | None = None
    # per-round logs: name -> [n_local, ...]; stored at /<algorithm>/<name> (a name
    # holding "/" is a path from the root, e.g. "lia/influence")
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    # logged once, the round they appear: name -> [n_local, ...], stored as [N, ...]
    once: dict[str, np.ndarray] = field(default_factory=dict)
    # scalars or small JSON-able values for the log's root attributes (rank 0's count)
    attrs: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mixing is not None and not isinstance(self.mixing, Mixing):
            raise TypeError(f"Round.mixing must be a mpifl.logging.mixing.Mixing (Dense, Shared or Grouped), "
                            f"not {type(self.mixing).__name__}")


@runtime_checkable
class Algorithm(Protocol):
    """An algorithm module as the runtime uses it (``mpifl.algorithms.get(name)``).

    - ``State``: a dataclass of what the algorithm keeps between rounds. Fields made
      with ``mpifl.algorithms.state.per_client()`` hold one row per local client,
      ``transient()`` ones are not checkpointed, every other field is identical on
      all ranks and saved once (``mpifl.run.checkpoint``).
    - ``init(ctx) -> State``, before round 0 (and before a resume fills it).
    - ``round(ctx, state, t) -> Round``: trains, and says what was averaged with what.
    - ``evaluate(ctx, state, t)``: ``val_loss``, ``val_acc``, ``test_loss``,
      ``test_acc`` per local client ([n_local]) in the rounds that evaluate
      (:func:`evaluates`); it changes no training state.

    Optional, looked up by name: ``Params``, a dataclass of hyper-parameters with
    commented defaults and ``validate(cfg)`` (the config section named as the
    module, received as ``ctx.params``; its checks name keys bare, as the field,
    and the registry adds the section); ``check_config(cfg)``, refusing
    combinations when the algorithm is chosen (keys named the same way);
    ``SUMMARY`` and ``MIXING_ROW``, one line each for the README's table
    (``mpifl.docs.blocks``; without them the docstring's first sentence and "–");
    ``long_round(cfg, t) -> bool``, a round known in advance to run long (the
    runtime checkpoints the round before it, so a stop signal may abandon it,
    :class:`Interrupt`). The
    module docstring opens with the paper, the equations and a runnable
    ``python -m mpifl.main`` command.
    """

    State: type

    def init(self, ctx: Context) -> Any: ...

    def round(self, ctx: Context, state: Any, t: int) -> Round: ...

    def evaluate(self, ctx: Context, state: Any, t: int) -> dict[str, np.ndarray]: ...


def evaluates(cfg: Config, t: int) -> bool:
    """Whether round t evaluates (``run.eval_every``, and always the last round)."""
    return (t + 1) % cfg.run.eval_every == 0 or t == cfg.run.rounds - 1
