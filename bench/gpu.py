"""What mpifl does on a GPU (issue #30): training throughput, seconds per round,
memory per client, and CPU/GPU agreement, in one process that prints a table.

    python bench/gpu.py --out /tmp/gpu                       # on a machine with a GPU
    python bench/gpu.py --device cpu --clients 16 64 --rounds-n 20 40 --out /tmp/gpu   # a dry run

Sections (``--only`` picks some):

``throughput``  client-epochs per second of one rank's clients for the MLP (784-128-128-10)
    and ``cnn_dpfl`` (1x28x28) at ``--clients`` clients: the batched path
    (``train.batched=on``, every client at once on the GPU), the per-client loop
    (``train.batched=off``, timed on the first ``--loop-clients``: its rate does not
    depend on how many clients wait their turn), and the path ``train.batched=auto``
    takes (``Clients.measure_paths``). Data: Gaussian blobs (``data.name=synthetic``,
    784 features) with ``--samples`` per client (60% train, batch 16, 1 epoch a round),
    so every size sees the same work per client. Times: best of ``--repeats``, the
    device synchronised before each clock read. Memory: the peak the CUDA allocator
    held while the batched clients were built and trained, over the clients.
``rounds``  seconds per round of the quickstart's setting with FedAvg (its MLP, 2 local
    epochs, 250 samples a client, 4 label clusters; 40-dimensional Gaussian blobs in place
    of mnist1d's 40-sample signals, whose generator would take minutes at N = 1,000) at
    ``--rounds-n`` clients, ``python -m
    mpifl.main`` on one rank with ``run.device`` = the GPU and = cpu (all cores): the
    median of ``/rounds/wall_s`` after the first round, and the whole process.
``agree``  the quickstart itself, 10 rounds, on the CPU and on the GPU: the largest
    difference of the per-round mean training loss and test accuracy.
``fit``  the largest N one rank holds on this GPU: free memory over the measured bytes
    per client of the largest ``throughput`` size, beside ``mpifl.run.memory``' estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)
from mpifl import config, models  # noqa: E402 - after the sys.path line
from mpifl.comm import faithful_cuda  # noqa: E402
from mpifl.data import build  # noqa: E402
from mpifl.logging.h5 import open_run  # noqa: E402
from mpifl.run import memory as sizes  # noqa: E402
from mpifl.train import Clients  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make(model: str, n: int, batched: str, device: torch.device, samples: int,
         shape: tuple[int, ...] = (1, 28, 28), over: tuple[str, ...] = ()) -> Clients:
    """``n`` clients of Gaussian blobs (``samples`` each, 60% train, batch 16) with
    ``shape``-sized inputs (flat for the MLP); ``over``: more ``key=value`` overrides."""
    cfg = config.load(None, ["data.name=synthetic", "data.partition=iid", f"data.n_clients={n}",
                             f"data.n_samples={samples * n}", f"data.synthetic_dim={int(np.prod(shape))}",
                             f"model.name={model}", f"train.batched={batched}", "train.batch_size=16",
                             "train.lr=0.05", *over])
    data = build(cfg.data, 0, np.arange(n))
    if model in models.IMAGE_MODELS:
        data.x = data.x.reshape(-1, *shape)
        data.in_shape = tuple(shape)
    return Clients(models.build(cfg.model, data.in_shape, data.n_classes, 0), data, cfg.train, device, 0)


def rate(c: Clients, m: int, rounds: int, repeats: int) -> float:
    """Client-epochs per second of ``c.train`` over its first ``m`` clients."""
    local = np.arange(m)
    c.train(local, 1, 0)  # warm-up: kernels, allocator, vmap tracing
    sync(c.device)
    best, r = float("inf"), 1
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(rounds):
            c.train(local, 1, r)
            r += 1
        sync(c.device)
        best = min(best, time.perf_counter() - t0)
    return m * rounds / best


def throughput(a, device: torch.device) -> list[dict]:
    out = []
    for model in a.models:
        for n in a.clients:
            row = {"model": model, "clients": n}
            try:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                    base = torch.cuda.memory_allocated(device)
                on = make(model, n, "on", device, a.samples)
                row["P"] = on.P
                row["batched_ce_s"] = rate(on, n, a.rounds, a.repeats)
                if device.type == "cuda":
                    row["peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
                    row["bytes_per_client"] = row["peak_bytes"] / n
                del on
                m = min(n, a.loop_clients)
                off = make(model, m, "off", device, a.samples)
                row["loop_ce_s"] = rate(off, m, 1, a.repeats)
                del off
                auto = make(model, min(n, 64), "auto", device, a.samples)
                if auto.needs_measuring:
                    tb, tl = auto.measure_paths()
                    auto.batched = tb < tl
                row["auto"] = "batched" if auto.batched else "loop"
                row["auto_ok"] = row["auto"] == ("batched" if row["batched_ce_s"] >= row["loop_ce_s"] else "loop")
                del auto
            except Exception as e:  # noqa: BLE001 - a size that fails is a result, the others still run
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                traceback.print_exc()
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def main_run(out: str, name: str, overrides: list[str]) -> tuple[float, float, object]:
    args = [sys.executable, "-m", "mpifl.main", "jobs/quickstart.yaml", f"run.out_dir={out}", f"run.name={name}",
            *overrides]
    t0 = time.perf_counter()
    p = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(f"{name}: exit {p.returncode}: {(p.stderr or p.stdout).strip()[-600:]}")
    r = open_run(os.path.join(out, name))
    return float(np.median(r.get("rounds/wall_s")[1:])), wall, r


def rounds(a, device: torch.device, out: str) -> list[dict]:
    rows = []
    for n in a.rounds_n:
        for dev in dict.fromkeys([device.type, "cpu"]):
            row = {"clients": n, "device": dev}
            try:
                ov = ["algorithm.name=fedavg", f"data.n_clients={n}", f"data.n_samples={250 * n}",
                      "data.name=synthetic", "data.synthetic_dim=40",
                      f"run.device={dev}", f"run.rounds={a.rounds_r}", f"run.eval_every={a.rounds_r}",
                      f"run.threads={os.cpu_count()}"]
                row["s_per_round"], row["process_s"], _ = main_run(out, f"rounds-{n}-{dev}", ov)
            except Exception as e:  # noqa: BLE001
                row["error"] = str(e)[-400:]
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def agree(device: torch.device, out: str) -> dict:
    logs = {dev: main_run(out, f"agree-{dev}", [f"run.device={dev}", "run.rounds=10"])[2]
            for dev in ("cpu", device.type)}
    a, b = logs["cpu"], logs[device.type]
    la, lb = np.nanmean(a.metric("train_loss"), 1), np.nanmean(b.metric("train_loss"), 1)
    ta, tb = np.nanmean(a.metric("test_acc"), 1), np.nanmean(b.metric("test_acc"), 1)
    row = {"train_loss_cpu": la.tolist(), "train_loss_dev": lb.tolist(),
           "max_rel_loss_diff": float(np.max(np.abs(la - lb) / np.abs(la))),
           "first_round_rel_loss_diff": float(abs(la[0] - lb[0]) / abs(la[0])),
           "max_test_acc_diff": float(np.max(np.abs(ta - tb))), "final_test_acc": [float(ta[-1]), float(tb[-1])]}
    print(json.dumps(row), flush=True)
    return row


def fit(tp: list[dict], free: int, samples: int) -> list[dict]:
    """``free``: the device's free bytes before this process allocated anything."""
    rows = []
    for model in dict.fromkeys(r["model"] for r in tp):
        measured = [r for r in tp if r["model"] == model and "bytes_per_client" in r]
        if not measured:
            continue
        r = max(measured, key=lambda r: r["clients"])
        cfg = config.load(None, ["data.name=synthetic", "data.synthetic_dim=784", f"model.name={model}",
                                 f"data.n_clients={r['clients']}", f"data.n_samples={samples * r['clients']}"])
        est = sizes.estimate(cfg, 1, 0, on_gpu=True)
        row = {"model": model, "free_bytes": free, "bytes_per_client": r["bytes_per_client"],
               "largest_n": int(free // r["bytes_per_client"]),
               "sizes_estimate_per_client": (est.clients / r["clients"]) if est else None}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def table(res: dict) -> None:
    print("\n| model | clients | P | batched ce/s | loop ce/s | auto | MB/client (peak) |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for r in res.get("throughput", []):
        if "error" in r:
            print(f"| {r['model']} | {r['clients']} | | {r['error']} | | | |")
            continue
        mb = f"{r['bytes_per_client'] / 2**20:.2f}" if "bytes_per_client" in r else ""
        print(f"| {r['model']} | {r['clients']:,} | {r['P']:,} | {r['batched_ce_s']:,.0f} | {r['loop_ce_s']:,.0f} "
              f"| {r['auto']}{'' if r['auto_ok'] else ' (slower)'} | {mb} |")
    for r in res.get("rounds", []):
        print(f"rounds N={r['clients']} {r['device']}: " + (r["error"] if "error" in r else
              f"{r['s_per_round'] * 1e3:.1f} ms/round, process {r['process_s']:.1f} s"))
    if "agree" in res:
        g = res["agree"]
        print(f"agree: max rel train-loss diff {g['max_rel_loss_diff']:.2e} (round 0: "
              f"{g['first_round_rel_loss_diff']:.2e}), max test-acc diff {g['max_test_acc_diff']:.4f}")
    for r in res.get("fit", []):
        print(f"fit {r['model']}: {r['bytes_per_client'] / 2**20:.2f} MiB/client measured, "
              f"free {r['free_bytes'] / 2**30:.1f} GiB -> N <= {r['largest_n']:,}; mpifl.run.memory: "
              f"{(r['sizes_estimate_per_client'] or 0) / 2**20:.2f} MiB/client")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", nargs="+", default=["throughput", "rounds", "agree", "fit"])
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn_dpfl"])
    ap.add_argument("--clients", nargs="+", type=int, default=[128, 1024, 10000])
    ap.add_argument("--samples", type=int, default=50, help="samples per client (60%% train)")
    ap.add_argument("--loop-clients", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds-n", nargs="+", type=int, default=[100, 1000])
    ap.add_argument("--rounds-r", type=int, default=10)
    ap.add_argument("--out", default=None, help="folder for gpu.json and the runs' logs")
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda":  # what a run sets where it takes its GPU (comm.pick_device)
        faithful_cuda()
    out = a.out or tempfile.mkdtemp(prefix="mpifl-gpu-")
    os.makedirs(out, exist_ok=True)
    res: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 "torch": torch.__version__,
                 "free_bytes": torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0}
    print(json.dumps(res), flush=True)
    steps = {"throughput": lambda: throughput(a, device), "rounds": lambda: rounds(a, device, out),
             "agree": lambda: agree(device, out),
             "fit": lambda: fit(res.get("throughput", []), res["free_bytes"], a.samples)}
    for name in a.only:
        t0 = time.perf_counter()
        try:
            res[name] = steps[name]()
        except Exception as e:  # noqa: BLE001
            res[name + "_error"] = f"{type(e).__name__}: {e}"[:600]
            traceback.print_exc()
        print(f"== {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        with open(os.path.join(out, "gpu.json"), "w") as f:
            json.dump(res, f, indent=1)
    table(res)


if __name__ == "__main__":
    main()
