"""Each method's round at the room's cell against the work it does: its time, its
floor from bench/roofline.py's model (FLOPs at the matrix product's rate, the
bytes its optimizer steps and activations must move at a streaming add's rate),
and how far above that floor it runs compared with FedAvg. A measurement for
Performance V, item 2 (bench/README.md), not a test.

    python bench/method_work.py                       # the room's cell, 100 x 400
    python bench/method_work.py --clients 20 --samples 50 --methods fedavg dpfl

Setting: jobs/room-fashionmnist.yaml (real Fashion-MNIST, MLP 784-64-10, Adam lr
1e-3, batch 20, one local epoch), ``--clients`` x ``--samples``, one process, one
thread, every method at its defaults but DPFL at the room's one local epoch
(``tau_init``, ``tau_train`` 1) and pFedLIA with one warm-up round (its LIA round
is round 1, timed apart; rounds 2+ are FedAvg inside its clusters). A round is
the algorithm's ``round`` and its ``evaluate``, as the runtime runs them.

Work, per round:
- FLOPs: torch's ``FlopCounterMode`` around one round (every matrix product,
  forward and backward, in training and in every evaluation the method makes),
  split into those inside ``Clients.train`` and the rest;
- training bytes: each optimizer step (``Clients.steps``) x the parameters it
  needs x 9 floats (Adam: the forward's read, the gradient, the step's reads and
  writes) plus the samples trained x the model's activations x 4 floats, 4 bytes
  a float (the roofline's model). A step that freezes parameters needs only the
  others (FedRep's head epochs: the head's 650 of 50,890; mpifl's step still
  walks the whole row, so FedRep is judged on the work the method needs);
- floor = max(training FLOPs / matmul rate, training bytes / stream rate) + other
  FLOPs / matmul rate: the training epoch is memory-bound here, the extra
  evaluations are matrix products.

"over its floor" is the measured round over that floor; "against FedAvg" is that
ratio over FedAvg's: how much worse than FedAvg the method uses the machine for
the work it does (Performance V asks for at most 1.5x). Rounds are timed with the
counter off (median of ``--rounds`` rounds after the first, the first timed apart;
pFedLIA's after its LIA round, whose time is its own column) and counted in one
more round, with the counter on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roofline import PARAM_FLOATS, activations_per_sample, matmul_rate, stream_rate  # noqa: E402

from mpifl import algorithms, config, models  # noqa: E402
from mpifl.algorithms.base import Context  # noqa: E402
from mpifl.comm import Comm, keep_freed_memory, solo  # noqa: E402
from mpifl.data import build  # noqa: E402
from mpifl.train import Clients  # noqa: E402

METHODS = {"fedavg": [], "local": [], "oracle": [], "fedfomo": [], "federico": [], "fedc2i": [],
           "pfedlia": ["pfedlia.warmup_rounds=1"], "fedrep": [], "dpfl": ["dpfl.tau_init=1", "dpfl.tau_train=1"]}


def context(method: str, n: int, samples: int) -> Context:
    cfg = config.load("jobs/room-fashionmnist.yaml", [
        f"data.n_clients={n}", f"data.train_per_client={samples}", f"algorithm.name={method}", "run.threads=1",
        *METHODS[method]])
    comm = Comm(n, solo())
    data = build(cfg.data, cfg.run.seed, comm.local_ids)
    model = models.build(cfg.model, data.in_shape, data.n_classes, cfg.run.seed)
    return Context(cfg, comm, Clients(model, data, cfg.train, torch.device("cpu"), cfg.run.seed), data)


class Counted:
    """Wraps ``Clients.train`` to count, while a FlopCounterMode is on, the FLOPs
    inside it, its optimizer steps, and the parameter-steps they needed: a step
    whose ``objective`` freezes parameters (FedRep's head epochs freeze the body)
    needs only the others."""

    def __init__(self, ctx: Context) -> None:
        self.inside = 0
        self.steps = 0
        self.param_steps = 0
        self.counting = False
        c = ctx.clients
        train = c.train

        def wrapper(*a, **k):
            if not self.counting:
                return train(*a, **k)
            frozen = list(getattr(k.get("objective"), "frozen", ()) or ())
            active = c.P - sum(s.stop - s.start for s in c.slices(frozen)) if frozen else c.P
            before = int(c.steps.sum())
            with FlopCounterMode(display=False) as fc:
                out = train(*a, **k)
            self.inside += fc.get_total_flops()
            self.steps += int(c.steps.sum()) - before
            self.param_steps += (int(c.steps.sum()) - before) * active
            return out

        c.train = wrapper


def one(method: str, n: int, samples: int, rounds: int) -> dict:
    ctx = context(method, n, samples)
    mod = algorithms.get(method)
    counted = Counted(ctx)
    state = mod.init(ctx)
    c = ctx.clients
    times = []

    def do(t: int) -> float:
        ctx.comm.reset_counters()
        c.steps[:], c.samples[:] = 0, 0
        t0 = time.perf_counter()
        mod.round(ctx, state, t)
        mod.evaluate(ctx, state, t)
        return time.perf_counter() - t0

    for t in range(rounds + 1):
        times.append(do(t))
    counted.counting = True
    with FlopCounterMode(display=False) as fc:
        do(rounds + 1)
    counted.counting = False
    steps = int(c.steps.sum())
    # a step outside Clients.train (FedeRiCo's one a round) moves whole rows
    param_steps = counted.param_steps + (steps - counted.steps) * int(c.P)
    return {"method": method, "round_s": [round(x, 4) for x in times], "flops": int(fc.get_total_flops()),
            "train_flops": int(counted.inside), "steps": steps, "param_steps": param_steps,
            "samples": int(c.samples.sum()), "P": int(c.P)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3, help="rounds timed after the first")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    a = ap.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    peak, bw = matmul_rate(5), stream_rate(5)
    acts = activations_per_sample("mlp", (1, 28, 28), [64])
    print(json.dumps({"matmul_gflops": round(peak, 1), "stream_gbs": round(bw, 1)}), flush=True)
    rows = []
    for m in a.methods:
        r = one(m, a.clients, a.samples, a.rounds)
        steady = float(np.median(r["round_s"][2 if m == "pfedlia" else 1:]))  # pFedLIA's LIA round apart
        train_bytes = 4 * (PARAM_FLOATS["adam"] * r["param_steps"] + 4 * acts * r["samples"])
        other = (r["flops"] - r["train_flops"]) / peak / 1e9
        floor = max(r["train_flops"] / peak / 1e9, train_bytes / bw / 1e9) + other
        r.update(steady_s=round(steady, 4), floor_s=round(floor, 4), over_floor=round(steady / floor, 2))
        rows.append(r)
        print(json.dumps(r), flush=True)
    base = next((r for r in rows if r["method"] == "fedavg"), None)
    print("\n| method | round 1 s | round 2 s | round s (median) | over FedAvg | optimizer steps | "
          "GFLOP (training + other) | floor s | over its floor | against FedAvg |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        vs = f"{r['steady_s'] / base['steady_s']:.1f}x" if base else "-"
        eff = f"{r['over_floor'] / base['over_floor']:.2f}x" if base else "-"
        print(f"| {r['method']} | {r['round_s'][0]:.2f} | {r['round_s'][1]:.2f} | {r['steady_s']:.3f} | {vs} | "
              f"{r['steps']:,} | "
              f"{r['train_flops'] / 1e9:.1f} + {(r['flops'] - r['train_flops']) / 1e9:.1f} | {r['floor_s']:.3f} | "
              f"{r['over_floor']:.2f} | {eff} |")
    peak2, bw2 = matmul_rate(5), stream_rate(5)
    print(f"\nmatmul {peak:.1f} GFLOP/s ({peak2:.1f} at the end); streaming add {bw:.1f} GB/s ({bw2:.1f} at the end)")


if __name__ == "__main__":
    main()
