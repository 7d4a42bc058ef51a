"""Client-epochs per second on one rank: mpifl's batched training (``torch.func.vmap``
over the stacked parameter rows), mpifl's per-client loop (``train.batched=off``),
and a peer-style loop that keeps one ``nn.Module`` + ``torch.optim.SGD`` per client
and trains them one after another (as PFLlib and most FL simulators do).

All draw the same batches (``Clients.plan``: same seed, same order) from the
same tensors, for the same epochs. The peer loop is given pre-loaded tensors (no
DataLoader), so its figure is an upper bound for such code; a fourth variant,
"peer + DataLoader", feeds the same loop as PFLlib's clients are fed (a
``DataLoader`` per client and round, ``.to(device)`` per batch).

    python bench/train_throughput.py                       # digits MLP and LeNet-5, 8/32/128 clients
    python bench/train_throughput.py --models cnn_dpfl lenet --clients 20 100 --threads 1 2   # mpifl's conv nets
    python bench/train_throughput.py --models mlp --clients 32 128 --repeats 5 --threads 1 2

With several ``--threads`` every variant runs at each count, and a last table sets
each variant's best count against the others' best: batched at its best over the
peer loop at its best (one thread for the peer's small ops, as it turns out).

Data: scikit-learn's digits (1797 images), iid over the clients, 60% of each client's
samples for training. MLP: the default ``model.hidden=[128, 128]`` on the 8x8
images. LeNet-5 (conv 6@5x5, pool, conv 16@5x5, pool, fc 120, fc 84, fc 10; defined
here: ``mpifl.models.lenet`` is the FedC2I paper's larger one) on the digits resized to
3x32x32; mpifl's ``cnn_dpfl`` and ``lenet`` (``mpifl.models``) on the digits resized to
1x28x28. "auto picks": the path ``train.batched=auto`` takes there (its own timing,
``Clients.measure_paths``), flagged when it is the slower of the two measured here.
Times: the best of ``--repeats`` runs of ``--rounds`` rounds (after one
warm-up round), the variants interleaved so load drift hits them alike.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from mpifl import config, models
from mpifl.data import build
from mpifl.train import Clients


def lenet5(n_classes: int = 10, channels: int = 3) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_classes))


def make(model_name: str, n: int, batched: str, lr: float, batch_size: int) -> Clients:
    cfg = config.load(None, ["data.name=digits", "data.partition=iid", f"data.n_clients={n}",
                             f"train.batched={batched}", f"train.lr={lr}", f"train.batch_size={batch_size}"])
    data = build(cfg.data, 0, np.arange(n))
    if model_name in models.IMAGE_MODELS:  # mpifl's own conv nets on 1x28x28, as Fashion-MNIST's
        data.x = F.interpolate(torch.from_numpy(data.x), size=(28, 28), mode="bilinear", align_corners=False).numpy()
        data.in_shape = (1, 28, 28)
        cfg = config.load(None, [f"model.name={model_name}", *[f"train.{k}={v}" for k, v in
                                 (("batched", batched), ("lr", lr), ("batch_size", batch_size))]])
        model = models.build(cfg.model, data.in_shape, data.n_classes, 0)
    elif model_name == "lenet5":
        x = torch.from_numpy(data.x)
        data.x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1).numpy()
        data.in_shape = (3, 32, 32)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = lenet5(data.n_classes)
    else:
        model = models.build(cfg.model, data.in_shape, data.n_classes, 0)
    return Clients(model, data, cfg.train, torch.device("cpu"), 0)


class Peer:
    """One nn.Module and one torch.optim.SGD per client, trained in turn."""

    def __init__(self, c: Clients):
        self.c = c
        self.models = []
        self.opts = []
        for _ in range(c.n):
            m = copy.deepcopy(c.model)
            self.models.append(m)
            self.opts.append(torch.optim.SGD(m.parameters(), lr=c.cfg.lr))

    def train(self, epochs: int, round: int) -> None:
        c = self.c
        plan = c.plan(np.arange(c.n), epochs, round)
        for k in range(c.n):
            model, opt = self.models[k], self.opts[k]
            model.train()
            for s in range(plan.steps):
                idx = plan.idx[k, s]
                idx = idx[idx >= 0]
                if len(idx) == 0:
                    break
                opt.zero_grad()
                F.cross_entropy(model(c.x[idx]), c.y[idx]).backward()
                opt.step()

    def params(self) -> torch.Tensor:
        return torch.stack([self.c.layout.flatten(m) for m in self.models])


class PeerLoader(Peer):
    """:class:`Peer` fed the way PFLlib's clients are: a ``DataLoader`` built for the
    client each round, samples collated one by one and moved with ``.to(device)``
    (here over the plan's batches, so the math stays that of the other variants)."""

    def train(self, epochs: int, round: int) -> None:
        c = self.c
        plan = c.plan(np.arange(c.n), epochs, round)
        data = TensorDataset(c.x, c.y)
        for k in range(c.n):
            model, opt = self.models[k], self.opts[k]
            batches = [b[b >= 0].tolist() for b in plan.idx[k] if (b >= 0).any()]
            loader = DataLoader(data, batch_sampler=batches)
            model.train()
            for x, y in loader:
                x, y = x.to(c.device), y.to(c.device)
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()


def bench(model_name: str, n: int, epochs: int, rounds: int, repeats: int, lr: float, bs: int) -> dict:
    on, off = make(model_name, n, "on", lr, bs), make(model_name, n, "off", lr, bs)
    peer = Peer(make(model_name, n, "off", lr, bs))
    loader = PeerLoader(make(model_name, n, "off", lr, bs))
    everyone = np.arange(n)
    runs = {"batched": lambda r: on.train(everyone, epochs, r),
            "loop": lambda r: off.train(everyone, epochs, r),
            "peer": lambda r: peer.train(epochs, r),
            "pfllib": lambda r: loader.train(epochs, r)}
    for fn in runs.values():  # warm-up (vmap tracing, allocator)
        fn(0)
    best = {k: float("inf") for k in runs}
    best_cpu = {k: float("inf") for k in runs}
    r0 = 1
    for _ in range(repeats):
        for k, fn in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            for r in range(r0, r0 + rounds):
                fn(r)
            best[k] = min(best[k], time.perf_counter() - t0)
            best_cpu[k] = min(best_cpu[k], time.process_time() - c0)
        r0 += rounds  # every variant sees the same rounds, so the same batches
    ce = n * epochs * rounds
    auto = make(model_name, n, "auto", lr, bs)  # what train.batched=auto would pick here
    picked = "batched" if not auto.needs_measuring else ("batched" if np.less(*auto.measure_paths()) else "loop")
    diff = max(float((on.params - off.params).abs().max()), float((on.params - peer.params()).abs().max()),
               float((on.params - loader.params()).abs().max()))
    return {"model": model_name, "clients": n, "P": on.P, "train_per_client": float(on.sizes[:, 0].mean()),
            **{f"{k}_ce_s": ce / best[k] for k in runs}, **{f"{k}_ce_cpu_s": ce / best_cpu[k] for k in runs},
            "max_param_diff": diff, "auto": picked,
            "auto_ok": picked == ("batched" if best["batched"] <= best["loop"] else "loop")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "lenet5"], choices=["mlp", "lenet5", "cnn_dpfl", "lenet"])
    ap.add_argument("--clients", nargs="+", type=int, default=[8, 32, 128])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    a = ap.parse_args()
    print(f"# torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}, "
          f"epochs {a.epochs} x rounds {a.rounds}, best of {a.repeats}")
    print("| model | clients/rank | threads | train samples/client | batched ce/s | loop (batched=off) ce/s "
          "| peer ce/s | peer + DataLoader ce/s | batched / peer | batched / loop | batched / peer (CPU time) "
          "| batched / peer + DataLoader | max param diff | auto picks |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    best: dict[tuple[str, int], dict[str, tuple[float, int]]] = {}
    for m in a.models:
        for n in a.clients:
            for th in a.threads:
                torch.set_num_threads(th)
                r = bench(m, n, a.epochs, a.rounds, a.repeats, a.lr, a.batch_size)
                print(f"| {m} | {n} | {th} | {r['train_per_client']:.1f} | {r['batched_ce_s']:.0f} "
                      f"| {r['loop_ce_s']:.0f} | {r['peer_ce_s']:.0f} | {r['pfllib_ce_s']:.0f} "
                      f"| {r['batched_ce_s'] / r['peer_ce_s']:.2f}x | {r['batched_ce_s'] / r['loop_ce_s']:.2f}x "
                      f"| {r['batched_ce_cpu_s'] / r['peer_ce_cpu_s']:.2f}x "
                      f"| {r['batched_ce_s'] / r['pfllib_ce_s']:.2f}x | {r['max_param_diff']:.1e} "
                      f"| {r['auto']}{'' if r['auto_ok'] else ' (the slower)'} |", flush=True)
                b = best.setdefault((m, n), {})
                for k in ("batched", "loop", "peer", "pfllib"):
                    if r[f"{k}_ce_s"] > b.get(k, (0.0, 0))[0]:
                        b[k] = (r[f"{k}_ce_s"], th)
    if len(a.threads) > 1:
        print("\n| model | clients/rank | batched ce/s (threads) | peer ce/s (threads) "
              "| peer + DataLoader ce/s (threads) | batched / peer, each at its best | batched / peer + DataLoader |")
        print("|---|---|---|---|---|---|---|")
        for (m, n), b in best.items():
            (bc, bt), (pc, pt), (lc, lt) = b["batched"], b["peer"], b["pfllib"]
            print(f"| {m} | {n} | {bc:.0f} ({bt}) | {pc:.0f} ({pt}) | {lc:.0f} ({lt}) "
                  f"| {bc / pc:.2f}x | {bc / lc:.2f}x |")
    print(f"# load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
