"""FedAvg (McMahan et al., 2017): a fraction C of clients per round trains E
local epochs from the global model; the global model becomes the average of
their models weighted by p_i (training-set size). One Allreduce per round.

    mpiexec -n 2 python -m mpi4py -m mpifl.main jobs/quickstart.yaml algorithm.name=fedavg algorithm.fraction=0.5

Every client is evaluated with the global model on its own val/test split; the
mixing row of every client is p over that round's sampled clients. The round is
:func:`mpifl.algorithms.blocks.step`, which FedProx, FedAvgM, FedAdam and FedYogi
build on too.
"""

from __future__ import annotations

from mpifl.algorithms.base import Context, Round
from mpifl.algorithms.blocks import GlobalModel, evaluate_global, init_global, step

# one line each for the README's algorithm table (python -m mpifl.docs)
SUMMARY = "FedAvg: fraction C sampled, E local epochs, average weighted by train size"
MIXING_ROW = "p over sampled clients"

State = GlobalModel  # the global model [P], identical on every rank
init = init_global


def round(ctx: Context, state: State, t: int) -> Round:
    state.model, out = step(ctx, state.model, t, ctx.cfg.algorithm.fraction)
    return out


evaluate = evaluate_global
