"""FedAvgM's server update against Flower's definition, on the same client models.

    python bench/peer_flower_fedavgm.py --flower-python /work/venvs/flwr/bin/python
    python bench/peer_flower_fedavgm.py --flower-python ... --rounds 10 fedavgm.lr=0.5 fedavgm.momentum=0.7
    python bench/peer_flower_fedavgm.py --flower-python ... --method fedyogi     # the adaptive ones too

mpifl runs the method (its own module's ``round``, every client in this one
process, on ``--config`` with the overrides) and records each round's global
model x_t, the sampled clients' trained models and their training-set sizes.
Flower's strategy of the same name (``FedAvgM``, ``FedAdam``, ``FedYogi`` of
``flwr.server.strategy``) runs in a child process started with
``--flower-python`` (an interpreter whose environment has flwr; mpifl never
imports it): it gets ``initial_parameters = x_0`` and, round by round, the same
client models as ``FitRes`` with ``num_examples`` = the client's training-set
size, and its ``aggregate_fit`` returns its next model. Flower keeps its own
server state (its x and momentum or moments); the client models are mpifl's,
trained from mpifl's x_t, so equal definitions give equal trajectories up to
float rounding, and a different definition shows as a gap from the first round.

Printed per round: max |x_mpifl - x_flower| over coordinates, the same relative to
max |x_mpifl - x_0|, and the flwr version.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Flower's side: runs under --flower-python, reads the client models, writes its models
FLOWER = r"""
import sys
import numpy as np
import flwr
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import strategy

d = np.load(sys.argv[1])
method, hp = str(d["method"]), {k[3:]: float(d[k]) for k in d.files if k.startswith("hp_")}
init = ndarrays_to_parameters([d["x0"]])
if method == "fedavgm":
    s = strategy.FedAvgM(initial_parameters=init, server_learning_rate=hp["lr"], server_momentum=hp["momentum"])
else:
    cls = strategy.FedAdam if method == "fedadam" else strategy.FedYogi
    s = cls(initial_parameters=init, eta=hp["lr"], beta_1=hp["beta1"], beta_2=hp["beta2"], tau=hp["tau"])
out = []
for r in range(int(d["rounds"])):
    rows, n = d[f"rows_{r}"], d[f"n_{r}"]
    res = [(None, FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters([row]),
                         num_examples=int(k), metrics={})) for row, k in zip(rows, n)]
    params, _ = s.aggregate_fit(r + 1, res, [])  # Flower's rounds count from 1
    out.append(parameters_to_ndarrays(params)[0])
np.savez(sys.argv[2], x=np.stack(out), version=flwr.__version__)
"""


def mpifl_side(method: str, config_path: str, overrides: list[str], rounds: int):
    """(x_0, [x_1..x_R], per round (sampled clients' models, their n_train), hyper-parameters)."""
    from mpifl import algorithms, config, models
    from mpifl.algorithms.base import Context
    from mpifl.comm import Comm, solo
    from mpifl.data import build
    from mpifl.train import Clients

    cfg = config.load(REPO / config_path, [f"algorithm.name={method}", f"run.rounds={rounds}", *overrides])
    comm = Comm(cfg.data.n_clients, solo())
    data = build(cfg.data, cfg.run.seed, comm.local_ids)
    model = models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)
    ctx = Context(cfg, comm, Clients(model, data, cfg.train, torch.device("cpu"), cfg.run.seed), data)
    algo = algorithms.get(method)
    state = algo.init(ctx)
    x0, xs, clients = state.model.clone(), [], []
    for t in range(rounds):
        algo.round(ctx, state, t)
        sampled = ctx.sample(t, cfg.algorithm.fraction)
        # after the round each sampled client's row still holds its trained model
        clients.append((ctx.clients.params[sampled].numpy().copy(), data.sizes[sampled, 0].copy()))
        xs.append(state.model.numpy().copy())
    hp = {k: float(v) for k, v in vars(getattr(cfg, method)).items()}
    return x0.numpy(), xs, clients, hp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flower-python", required=True, help="a Python whose environment has flwr")
    ap.add_argument("--method", default="fedavgm", choices=["fedavgm", "fedadam", "fedyogi"])
    ap.add_argument("--config", default="jobs/quickstart.yaml")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("overrides", nargs="*", help="mpifl config overrides (key=value)")
    a = ap.parse_args()
    x0, xs, clients, hp = mpifl_side(a.method, a.config, ["algorithm.fraction=0.5", *a.overrides], a.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        arrays = {"method": a.method, "rounds": a.rounds, "x0": x0, **{f"hp_{k}": v for k, v in hp.items()}}
        for r, (rows, n) in enumerate(clients):
            arrays[f"rows_{r}"], arrays[f"n_{r}"] = rows, n
        np.savez(Path(tmp) / "in.npz", **arrays)
        subprocess.run([a.flower_python, "-c", FLOWER, str(Path(tmp) / "in.npz"), str(Path(tmp) / "out.npz")],
                       check=True)
        got = np.load(Path(tmp) / "out.npz")
        flower, version = got["x"], str(got["version"])
    print(f"{a.method} {hp} on {a.config} {' '.join(a.overrides)}; flwr {version}")
    worst = 0.0
    for r, (mine, theirs) in enumerate(zip(xs, flower)):
        diff = float(np.abs(mine - theirs).max())
        rel = diff / float(np.abs(mine - x0).max())
        worst = max(worst, rel)
        print(f"round {r + 1:3d}: max |x_mpifl - x_flower| {diff:.3e}  relative to the distance moved {rel:.3e}")
    print(f"largest relative gap: {worst:.3e}")


if __name__ == "__main__":
    main()
