"""The clients a rank hosts: their parameter rows, optimizer state and data,
and the entry points that train and evaluate them.

A model is only a template here: weights live in the rows of one ``[n_local,
P]`` matrix, so exchanging a client's model is sending a contiguous row. The
work is done by the package's other modules; this class holds the state they
share and chooses the training path (``train.batched``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from mpifl.data import FederatedData
from mpifl.models import has_batchnorm, layers
from mpifl.schema import TrainConfig
from mpifl.train import batched, evaluation, fused, grouped, loop
from mpifl.train.engine import Engine
from mpifl.train.grouped import GroupedConv, fuse, grouped_convnet
from mpifl.train.layout import Layout
from mpifl.train.mlp import StackedMLP, stacked_mlp
from mpifl.train.objective import Objective, Step
from mpifl.train.optimizer import RowOptimizer
from mpifl.train.plan import SPLIT_INDEX, BatchPlan, gather, make_plan
from mpifl.train.rowmodel import RowByRow, RowModel, Vmap
from mpifl.train.rows import Rows, Snapshot, flat


class NonFiniteError(RuntimeError):
    """A client's loss or parameters became NaN/inf."""

    one_line = True


class Clients:
    """This rank's clients: parameters, optimizer state, data, train/eval."""

    def __init__(self, model: nn.Module, data: FederatedData, cfg: TrainConfig, device: torch.device, seed: int):
        self.cfg = cfg
        self.seed = seed
        self.device = device
        self.model = model.to(device)
        self.layout = Layout(model)
        self.functional = RowModel(self.model, self.layout)
        self.ids = np.asarray(data.local_ids)
        self.n = len(self.ids)
        self.P = self.layout.P
        self.data = data
        self.x = torch.from_numpy(data.x).to(device)
        self.y = torch.from_numpy(data.y).to(device)
        self.sizes = data.sizes[self.ids] if self.n else np.zeros((0, 3), np.int64)
        self.offsets = data.offsets
        self.n_classes = data.n_classes
        init = self.layout.flatten(model).to(device)
        self.init = init
        self.opt = RowOptimizer(cfg, self.n, self.P, device, self.layout.cols)
        self.rows = Rows(init.repeat(self.n, 1), self.layout.flatten_buffers(model).to(device).repeat(self.n, 1),
                         self.opt.state)
        self.skipped = np.zeros(self.n, np.int64)  # updates dropped as non-finite (reset per round)
        self.updates = 0  # client updates trained (skipped or not), to tell "all were skipped"
        # the compute a client spent, per round (reset with skipped, logged as /train/*): a
        # step is one batch trained on, whatever the path or a custom step does with it
        self.steps = np.zeros(self.n, np.int64)
        self.samples = np.zeros(self.n, np.int64)  # training samples those steps took (a sample per epoch)
        self.bn = has_batchnorm(model)
        self.stacked = stacked_mlp(model) if self.layout.B == 0 else None
        self.convnet = grouped_convnet(model) if self.layout.B == 0 else None
        self.conv_unavailable: str | None = None  # why the fused conv kernel, asked for, does not build here
        self._scratch: dict[str, torch.Tensor] = {}  # see scratch()
        self.fused_convnet: list | None = None  # the fused layers where they fit and build (kept if not taken)
        self.conv_times: tuple[float, float] | None = None  # (fused, torch) s, when auto measured them
        self.conv_kernel = self._conv_kernel(cfg, data.in_shape) if self.convnet is not None else None
        # Which path trains: "on" / "off" as asked. Under "auto" a plain MLP is batched
        # (stacked bmm: 6-10x the loop in bench/README.md, at every size measured);
        # any other model is timed on both paths at the start of a run
        # (measure_paths, which runtime.setup calls on every rank), because batched
        # a conv net's convolutions are grouped ones (mpifl.train.grouped, or vmap's),
        # whose speed against the loop depends on the layer sizes and the machine
        # (bench/README.md).
        self.batched = cfg.batched == "on" or (cfg.batched == "auto" and self.stacked is not None)
        self.needs_measuring = cfg.batched == "auto" and self.stacked is None
        self.path_times: tuple[float, float] | None = None  # (batched, loop) s, when measured
        self._engines: dict[str, Engine] = {"row_by_row": RowByRow(self.functional), "vmap": Vmap(self.functional)}
        if self.stacked is not None:
            self._engines["stacked"] = StackedMLP(self.model, self.layout, self.stacked, device)
        if self.convnet is not None:
            self._engines["grouped"] = GroupedConv(self.model, self.layout, self.convnet)

    def _conv_kernel(self, cfg: TrainConfig, in_shape: tuple[int, ...]) -> str:
        """``"fused"`` where some of the conv net's layers run in :mod:`mpifl.train.fused`'s
        kernel on the batched path (``train.fused_conv`` allows it, they fit, the
        kernel builds; :attr:`convnet` then holds the fused layers), else ``"torch"``;
        where it was asked and does not build, :attr:`conv_unavailable` says why (the
        ranks settle on one kernel with :meth:`agree_conv_kernel`)."""
        asked = fused.asked(cfg.fused_conv, cfg.batched, self.device.type)
        head = fuse(self.convnet, tuple(in_shape)) if asked else None
        if head is None:
            return "torch"
        try:
            fused.kernels()
        except fused.FusedUnavailable as e:
            self.conv_unavailable = str(e)
            return "torch"
        self.convnet = self.fused_convnet = head
        return "fused"

    @property
    def conv_needs_measuring(self) -> bool:
        """Whether ``train.fused_conv=auto`` still has to time the fused layers against
        torch's (:meth:`measure_conv`): they fit and build on every rank, and the run
        may train batched (where ``train.batched=auto`` then picks the loop, the timing
        decided nothing it uses)."""
        return self.cfg.fused_conv == "auto" and self.conv_kernel == "fused"

    def measure_conv(self, reps: int = 5) -> tuple[float, float]:
        """Seconds (best of ``reps``) of the conv layers' forward and backward on the
        fused kernel and on torch's, for 64 clients at the run's batch size on random
        inputs (:func:`mpifl.train.fused.timed`: once per build and shapes, then
        cached; no clients' rows or random streams are touched). The same on every
        rank of a machine kind and for any number of ranks, so the choice it makes
        does not depend on the placement."""
        if self.fused_convnet is None:
            return 0.0, 0.0
        m, b = 64, self.cfg.batch_size
        head = self.fused_convnet[:[op[0] for op in self.fused_convnet].index("flatten")]
        conv_ops = [op for op in grouped.unfused(head) if op[0] == "conv"]
        convs = [op[3] for op in conv_ops]
        names = [n for op in conv_ops for n in op[1:3] if n]
        shape = tuple(self.data.in_shape)
        key = (f"conv {shape} " + " ".join(f"{c.in_channels}>{c.out_channels}k{c.kernel_size[0]}" for c in convs)
               + f" clients {m} batch {b} threads {torch.get_num_threads()}")

        def measure() -> tuple[float, float]:
            gen = torch.Generator().manual_seed(0)
            x = torch.randn(m, b, *shape, generator=gen)
            parts = self.layout.parts(self.init.expand(m, -1).contiguous())
            best = {True: float("inf"), False: float("inf")}
            layers = {True: head, False: grouped.unfused(head)}
            with torch.enable_grad():
                for r in range(reps + 1):  # the first round warms both kernels up
                    for kernel in ((True, False) if r % 2 else (False, True)):
                        p = {k: parts[k].detach().clone().requires_grad_() for k in names}
                        t0 = time.perf_counter()
                        h = x
                        for op in layers[kernel]:
                            h = grouped.layer(op, p, h, m)
                        torch.autograd.grad(h.float().square().sum(), list(p.values()))
                        if r:
                            best[kernel] = min(best[kernel], time.perf_counter() - t0)
            return best[True], best[False]

        return fused.timed(key, measure)

    def agree_conv_kernel(self, unavailable: list[str | None]) -> str | None:
        """One conv kernel for the run from every rank's :attr:`conv_unavailable`
        (allgathered, rank by rank; a run whose ranks took different kernels would
        log one and train on two): where it builds on no rank or on some only,
        torch's everywhere, with the line that says so (None: nothing to say);
        ``train.fused_conv=on`` is then refused, naming the ranks."""
        from mpifl.errors import ranges

        failed = [r for r, why in enumerate(unavailable) if why]
        if not failed:
            return None
        where = f"rank(s) {ranges(failed)} of {len(unavailable)} ({unavailable[failed[0]]})"
        if self.cfg.fused_conv == "on":
            from mpifl.errors import ConfigError

            raise ConfigError(f"train.fused_conv=on but its kernel does not build on {where}; allowed: auto "
                              "(torch's kernels on every rank where it does not build on one), off", "train.fused_conv")
        self.keep_conv_kernel("torch")
        self.fused_convnet = None  # not on every rank, so on none: a resume of a fused run is refused
        self.conv_unavailable = f"it does not build on {where}"
        return (f"mpifl: train.fused_conv=auto: the fused conv kernel does not build on {where}: every rank "
                "takes torch's kernels (other sums, other bits)")

    @property
    def trained_conv_kernel(self) -> str | None:
        """The conv kernel that trains this run's clients (what its log and checkpoints
        name): None for a model without grouped layers or on the loop."""
        return self.conv_kernel if self.batched else None

    def keep_conv_kernel(self, kernel: str | None) -> None:
        """Take the conv kernel a checkpoint's run took (a resume continues its bits):
        torch's where it took theirs; where it took the fused one and this process
        cannot, stop."""
        if kernel is None or kernel == self.conv_kernel or self.convnet is None:
            return
        if kernel == "torch":
            self.convnet = grouped.unfused(self.convnet)
        elif self.fused_convnet is not None:  # built, and not taken only because it was timed slower here
            self.convnet = self.fused_convnet
        else:
            from mpifl.errors import ConfigError

            why = self.conv_unavailable or f"train.fused_conv={self.cfg.fused_conv}"
            raise ConfigError(f"the checkpoint's run took the fused conv kernel (train.fused_conv), which this run "
                              f"cannot take ({why}): resume where it builds (python -m mpifl.check says where), or "
                              f"start over with run.resume=never")
        self.conv_kernel = kernel
        self._engines["grouped"] = GroupedConv(self.model, self.layout, self.convnet)

    @property
    def engine(self) -> Engine:
        """What computes the clients' logits and gradients (:mod:`mpifl.train.engine`):
        row by row unless training is batched, else the stacked MLP kernels, grouped
        convolutions or vmap, whichever the model allows (the first of them)."""
        if not self.batched:
            return self._engines["row_by_row"]
        if self.stacked is not None:
            return self._engines["stacked"]
        return self._engines["grouped" if self.convnet is not None else "vmap"]

    @property
    def rows(self) -> Rows:
        """The clients' rows: parameters, buffers, optimizer state (the one
        ``self.opt`` steps)."""
        return self._rows

    @rows.setter
    def rows(self, rows: Rows) -> None:
        self._rows = rows
        self.opt.state = rows.opt

    @property
    def params(self) -> torch.Tensor:
        """``[n_local, P]`` the clients' parameter rows."""
        return self._rows.params

    @property
    def buffers(self) -> torch.Tensor:
        """``[n_local, B]`` the clients' float buffer rows (BatchNorm's running statistics)."""
        return self._rows.buffers

    @contextmanager
    def using(self, params: torch.Tensor, opt_state: dict[str, torch.Tensor] | None = None) -> Iterator[None]:
        """Train and evaluate other rows (``[n_local, P]``: personal models, a copy
        for fine-tuning) through these clients: ``params`` and ``opt_state`` (default:
        a fresh one) stand in for the clients' own for the block, in place (no copy),
        and the clients' own are back after it, whatever happened. The buffers stay
        the clients' own."""
        saved = self.rows
        self.rows = Rows(params, saved.buffers, self.opt.fresh_state(len(params)) if opt_state is None else opt_state)
        try:
            yield
        finally:
            self.rows = saved

    # ------------------------------------------------------------------ rows and data
    def parts(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-parameter views ``[m, *shape]`` of rows ``[m, P]`` (no copy)."""
        return self.layout.parts(params)

    def split_range(self, k: int, split: str) -> tuple[int, int]:
        """Local client ``k``'s samples of ``split``: ``x[lo:hi]``."""
        s = SPLIT_INDEX[split]
        o = int(self.offsets[k, s])
        return o, o + int(self.sizes[k, s])

    def plan(self, local: np.ndarray, epochs: int, round: int, purpose: str = "train",
             batch_size: int | None = None, max_batches: int | None = None,
             subsets: list[np.ndarray] | None = None) -> BatchPlan:
        """Each client's shuffled batches (:func:`mpifl.train.plan.make_plan`)."""
        return make_plan(self, local, epochs, round, purpose, batch_size, max_batches, subsets)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gather a padded index array -> (x, y, w) with w = 0 on padding."""
        return gather(self, idx)

    # ------------------------------------------------------------------ the model on rows
    def grads(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
              local: np.ndarray | None = None, bias: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row gradient ``[m, P]`` and loss ``[m]`` of ``params[i]`` on batch
        ``(x[i], y[i], w[i])``. ``local`` names the clients whose BatchNorm buffers
        the rows use; ``bias`` ``[m, C]`` is added to row i's logits in the loss;
        ``out`` ``[m, P]``: where to write the gradient (a :meth:`scratch`), where the
        engine does not hand back a tensor of its own."""
        g, loss = self.engine.grads(params, x, y, w, self.buffers, local, bias)
        if torch.is_tensor(g):
            return g, loss
        flat = torch.empty(params.shape[0], self.P, dtype=params.dtype, device=params.device) if out is None else out
        self.layout.write(flat, dict(zip(self.layout.names, g)))
        return flat, loss

    def scratch(self, key: str, rows: int) -> torch.Tensor:
        """A ``[rows, P]`` buffer kept under ``key`` from call to call, for a round's
        largest temporaries (the models an algorithm stacks, their gradients): a
        fresh one of hundreds of megabytes is faulted in page by page every round,
        about ten times the cost of writing it (FedeRiCo at 1,000 clients:
        bench/README.md, Performance V). Its contents are whatever was last written:
        the caller writes every row it reads, and keeps none of it past the round."""
        buf = self._scratch.get(key)
        if buf is None or buf.shape[0] < rows:
            buf = self._scratch[key] = torch.empty(rows, self.P, dtype=self.params.dtype, device=self.device)
        return buf[:rows]

    def logits(self, params: torch.Tensor, x: torch.Tensor, local: np.ndarray | None = None) -> torch.Tensor:
        """``[m, b, C]`` outputs of model rows ``params [m, P]`` on inputs ``x [m, b, ...]``."""
        return self.engine.logits(params, x, self.buffers, local)

    # ------------------------------------------------------------------ training
    def train(self, local: np.ndarray, epochs: int, round: int, purpose: str = "train",
              subsets: list[np.ndarray] | None = None, objective: Objective | None = None,
              step: Step | None = None, batch_size: int | None = None,
              max_batches: int | None = None) -> np.ndarray:
        """Train the listed local clients (indices into this rank's block) in place
        for ``epochs`` local epochs (over ``subsets`` of their samples if given, see
        :meth:`plan`); returns each one's mean training loss.

        ``objective`` adds closed-form terms to every path's gradient; ``step``
        replaces the optimisation step itself (:class:`~mpifl.train.objective.Step`),
        with the same batches, chunks and non-finite handling; a dropped update puts
        back the clients' parameters, optimizer state and the step's own state. ``batch_size`` (default
        ``train.batch_size``) sizes the batches a step gets: a step that splits its
        batch into several (Per-FedAvg's inner and outer batches) asks for a multiple.
        ``max_batches``: at most this many steps per client; ``train.max_steps`` caps
        every training call (not the start's timing measurement)."""
        local = np.asarray(local, dtype=np.int64)
        if self.cfg.max_steps and purpose != "measure":
            max_batches = min(max_batches, self.cfg.max_steps) if max_batches else self.cfg.max_steps
        if objective is not None and not objective.active:
            objective = None  # FedProx at mu = 0 is FedAvg bit for bit, Ditto at lam = 0 Local
        losses = np.zeros(len(local))
        seen = np.zeros(len(local))
        if len(local) == 0 or epochs == 0:
            return np.full(len(local), np.nan)
        bp = self.plan(local, epochs, round, purpose, batch_size=batch_size, subsets=subsets, max_batches=max_batches)
        self.updates += len(local)
        real = bp.idx >= 0
        self.count(local, real.any(2).sum(1), real.sum((1, 2)))
        skip = self.cfg.on_nonfinite == "skip"
        if skip:
            # the buffers are not put back: BatchNorm's statistics of a dropped update
            # stay as its batches left them, as before Rows held them
            own = {"params": self.params, **flat({"opt": self.opt.state})}
            start = Snapshot({**own, **flat(step.state if step is not None else {})}, local, self.device)
        bad = np.zeros(len(local), bool)
        if not self.batched and step is None:
            loop.train_loop(self, local, bp, objective, bad, losses, seen)
        else:
            batched.train_steps(self, local, bp, objective, step, bad, losses, seen)
        if bad.any():
            if not skip:
                k = int(np.flatnonzero(bad)[0])
                raise NonFiniteError(f"client {int(self.ids[local[k]])} produced a non-finite loss or parameters "
                                     f"in round {round + 1} ({purpose}); lower train.lr or set train.on_nonfinite=skip")
            start.restore(bad)  # drop the update: the client keeps its rows from before this call
            self.skipped[local[bad]] += 1
            losses[bad] = np.nan
        return losses / np.maximum(seen, 1)

    def count(self, local: np.ndarray, steps: np.ndarray | int, samples: np.ndarray | int) -> None:
        """Add ``steps`` optimizer steps over ``samples`` training samples to each listed
        client's count for the round (:meth:`train` counts its own; an algorithm that
        steps ``opt`` itself counts what it took)."""
        np.add.at(self.steps, np.asarray(local, np.int64), steps)
        np.add.at(self.samples, np.asarray(local, np.int64), samples)

    def measure_paths(self, steps: int = 3, reps: int = 3) -> tuple[float, float]:
        """Seconds (best of ``reps``) that ``steps`` training steps of up to 8 of this
        rank's clients take batched and client by client, on copies of their rows
        and state: no side effect on training (own random streams, buffers put back)."""
        m = min(self.n, 8)
        if m == 0:
            return 0.0, 0.0
        local = np.arange(m)
        saved = self.batched, self.buffers.clone(), self.skipped.copy(), self.updates, self.steps.copy(), \
            self.samples.copy()
        best = {True: float("inf"), False: float("inf")}
        try:
            for r in range(reps + 1):  # the first round warms both paths up
                for path in ((True, False) if r % 2 else (False, True)):
                    self.batched = path
                    with self.using(self.params[:m].clone()):
                        t0 = time.perf_counter()
                        self.train(local, 1, r, purpose="measure", max_batches=steps)
                        if r:
                            best[path] = min(best[path], time.perf_counter() - t0)
        finally:
            self.batched = saved[0]
            self.buffers.copy_(saved[1])
            self.skipped[:] = saved[2]
            self.updates = saved[3]
            self.steps[:], self.samples[:] = saved[4], saved[5]
        return best[True], best[False]

    # ------------------------------------------------------------------ what algorithms use (base.ClientsSurface)
    @property
    def param_names(self) -> list[str]:
        """The model's parameter names, in the order of a row's columns."""
        return self.layout.names

    def slices(self, names: list[str]) -> list[slice]:
        """The columns of a row that hold the named parameters, in row order."""
        return self.layout.slices(names)

    def write_parts(self, out: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        """Write per-parameter tensors ``[m, *shape]`` (as :meth:`parts` gives them) into rows ``out [m, P]``."""
        self.layout.write(out, parts)

    def flatten(self, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """A model built like the clients' as rows: (parameters ``[P]``, float buffers ``[B]``), float32."""
        return self.layout.flatten(model), self.layout.flatten_buffers(model)

    def layers(self) -> list[tuple[str, nn.Module, list[str]]]:
        """(name, module, its parameters' names) of every module of the model holding
        parameters of its own, from the input to the output (:func:`mpifl.models.layers`)."""
        return layers(self.model)

    def buffers_of(self, k: int) -> dict[str, torch.Tensor] | None:
        """Local client ``k``'s float buffers by name (BatchNorm's statistics, views),
        None for a model without any."""
        return self.layout.unflatten_buffers(self.buffers[k]) if self.layout.B else None

    @property
    def rows_at_once(self) -> bool:
        """Whether a block of rows computes in one call (training batched, no BatchNorm
        statistics to keep per client); else a custom step goes row by row."""
        return self.batched and not self.layout.B

    @property
    def n_samples(self) -> int:
        """Samples held on this rank, every local client's splits together."""
        return len(self.x)

    def relabel(self, k: int, perm: torch.Tensor) -> None:
        """Local client ``k``'s labels ``y`` become ``perm[y]`` in every split (a label-flipping client)."""
        for split in SPLIT_INDEX:
            lo, hi = self.split_range(k, split)
            self.y[lo:hi] = perm[self.y[lo:hi]]

    def reset_optimizer(self, sel: torch.Tensor | slice = slice(None)) -> None:
        """The optimizer state of rows ``sel`` (default all) starts afresh."""
        self.opt.reset(sel)

    def fresh_optimizer_state(self, n: int) -> dict[str, torch.Tensor]:
        """Zero ``train.optimizer`` state for ``n`` other rows (personal models)."""
        return self.opt.fresh_state(n)

    def optimizer(self, width: int | None = None, state: dict[str, torch.Tensor] | None = None) -> RowOptimizer:
        """``train.optimizer`` for other rows: rows like the clients' (``width`` None) or
        of ``width`` columns (a personal head), stepping ``state`` (default: fresh, no rows)."""
        if width is None:
            return RowOptimizer(self.cfg, 0, self.P, self.device, self.layout.cols, state=state)
        return RowOptimizer(self.cfg, 0, width, self.device, state=state)

    def apply_gradient(self, g: torch.Tensor) -> None:
        """One step of the clients' optimizer on every row with gradient ``g [n_local, P]``
        (an algorithm that makes its own gradient; it counts the step with :meth:`count`).
        ``g`` is overwritten: the step runs on the rows in place, with no copies of
        them or of ``g`` (two fresh ``[n_local, P]`` a round, page-faulted in)."""
        self.opt.step_(slice(None), self.params, g)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, split: str, params: torch.Tensor | None = None,
                 local: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean loss, accuracy) per client on its own ``split``
        (:func:`mpifl.train.evaluation.evaluate`)."""
        return evaluation.evaluate(self, split, params, local)

    def scorer(self, split: str, local: np.ndarray) -> Callable[[torch.Tensor], np.ndarray]:
        """Mean ``split`` loss of ``[len(local), P]`` model rows, each as its listed
        client's, the samples gathered once (:func:`mpifl.train.evaluation.scorer`)."""
        return evaluation.scorer(self, split, local)

    def split_batches(self, split: str, local: np.ndarray | None = None
                      ) -> Iterator[tuple[slice, np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Every listed client's whole ``split`` in padded chunks of clients
        (:func:`mpifl.train.evaluation.split_batches`)."""
        return evaluation.split_batches(self, split, local)

    def split_index(self, local: np.ndarray, split: str) -> np.ndarray:
        """``[m, n_max]`` indices of each client's split samples, -1 padded."""
        return evaluation.split_index(self, local, split)

    def shared_logits(self, row: torch.Tensor, x: torch.Tensor, local: np.ndarray) -> torch.Tensor:
        """``[m, b, C]`` outputs of one model ``row [P]`` on the listed clients' inputs
        ``x [m, b, ...]`` (a BatchNorm model with each client's own statistics)."""
        return evaluation.shared_logits(self, row, x, local)
