"""What ``train.fused_conv=auto`` would choose on this CPU: the conv layers'
forward and backward on mpifl's fused kernel and on torch's, timed as
``Clients.measure_conv`` times them at the start of a run (64 clients, random
inputs), but fresh each call (the cached timing beside the build is neither read
nor written), for cnn_dpfl's two input shapes, a few batch sizes and thread counts.

    python bench/conv_choice.py
    python bench/conv_choice.py --shapes 1x28x28 --batches 16 --threads 1 2 --repeats 3

One JSON line per setting: fused_ms, torch_ms (best of the measure's repetitions,
the median of ``--repeats`` calls), their ratio and auto's choice (torch's kernels
where the fused ones are over ``runtime.FUSED_MARGIN`` slower).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpifl import config, models  # noqa: E402
from mpifl.comm import keep_freed_memory  # noqa: E402
from mpifl.data import build  # noqa: E402
from mpifl.run.runtime import FUSED_MARGIN  # noqa: E402
from mpifl.train import Clients, fused  # noqa: E402


def clients(shape: tuple[int, ...], batch: int) -> Clients:
    n = 64
    cfg = config.load(None, ["data.name=synthetic", "data.partition=iid", f"data.n_clients={n}",
                             f"data.n_samples={40 * n}", f"data.synthetic_dim={int(np.prod(shape))}",
                             "model.name=cnn_dpfl", "train.batched=on", f"train.batch_size={batch}"])
    data = build(cfg.data, 0, np.arange(n))
    data.x = data.x.reshape(-1, *shape)
    data.in_shape = shape
    return Clients(models.build(cfg.model, shape, data.n_classes, 0), data, cfg.train, torch.device("cpu"), 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["1x28x28", "3x32x32"])
    ap.add_argument("--batches", nargs="+", type=int, default=[10, 16, 20, 50])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    keep_freed_memory()
    fused.timed = lambda key, measure: measure()  # fresh timings: the cache is neither read nor written
    for s in a.shapes:
        shape = tuple(int(v) for v in s.split("x"))
        for b in a.batches:
            c = clients(shape, b)
            if c.conv_kernel != "fused":
                print(json.dumps({"shape": s, "batch": b, "fused": f"not taken ({c.conv_unavailable})"}))
                continue
            for t in a.threads:
                torch.set_num_threads(t)
                got = [c.measure_conv() for _ in range(a.repeats)]
                tf, tt = (1e3 * statistics.median(v) for v in zip(*got))
                print(json.dumps({"shape": s, "batch": b, "threads": t, "fused_ms": round(tf, 3),
                                  "torch_ms": round(tt, 3), "torch_over_fused": round(tt / tf, 2),
                                  "auto": "torch" if tf > FUSED_MARGIN * tt else "fused"}), flush=True)


if __name__ == "__main__":
    main()
