"""DPFL's reward pair two ways, on one client of the room's cell (MLP 784-64-10, 70
validation samples, 25 candidates): as mpifl scores it (the two models X + j and Y - j
rebuilt from float64 running sums of the parameters, each run forward on the split)
and from the candidates' first-layer outputs (the first layer is linear in its
weights, so the averaged model's first-layer output is the average of the
candidates'; computed once a candidate, then running sums of [70, 64] outputs and
of the 650 parameters after it). Microseconds a pair and a candidate; the loss
differences of one pair. A measurement for Performance V item 3 (bench/README.md),
with random weights, not a change to DPFL.

    python bench/dpfl_preact.py
"""

from __future__ import annotations

import time

import torch

N_VAL, D, H, C = 70, 784, 64, 10
P1, P2 = D * H + H, H * C + C
K = 25  # candidates a client considers in a GGC round at the room's cell (24.7 on average)


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N_VAL, D, generator=g), torch.randint(0, C, (N_VAL,), generator=g)
    rows = torch.randn(K, P1 + P2, generator=g) * 0.05
    S = rows[:5].double().sum(0)  # the running sum of the current set, parameter space

    def loss(h1: torch.Tensor, p2: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(torch.relu(h1) @ p2[:H * C].view(C, H).T + p2[H * C:], y)

    def first(p: torch.Tensor) -> torch.Tensor:
        return x @ p[:D * H].view(H, D).T + p[D * H:P1]

    def current(j: int, w: float = 6.0):
        X, Y = ((S + rows[j].double()) / w).float(), ((S - rows[j].double()) / (w - 2)).float()
        return loss(first(X), X[P1:]), loss(first(Y), Y[P1:])

    def precompute() -> torch.Tensor:
        return torch.stack([first(r) for r in rows]).double()  # [K, N_VAL, H]

    Hs = precompute()
    SH, S2 = Hs[:5].sum(0), rows[:5, P1:].double().sum(0)

    def preact(j: int, w: float = 6.0):
        r2 = rows[j, P1:].double()
        return (loss(((SH + Hs[j]) / w).float(), ((S2 + r2) / w).float()),
                loss(((SH - Hs[j]) / (w - 2)).float(), ((S2 - r2) / (w - 2)).float()))

    for name, f in (("as mpifl scores it", current), ("from first-layer outputs", preact)):
        for i in range(200):
            f(i % K)
        t0 = time.perf_counter()
        for i in range(2000):
            f(i % K)
        print(f"{name}: {(time.perf_counter() - t0) / 2000 * 1e6:.0f} us a pair")
    t0 = time.perf_counter()
    for _ in range(50):
        precompute()
    print(f"first-layer outputs: {(time.perf_counter() - t0) / 50 / K * 1e6:.0f} us a candidate, once a round")
    (a, b), (c, d) = current(3), preact(3)
    print(f"loss differences of one pair: {float(a - c):.3g}, {float(b - d):.3g}")


if __name__ == "__main__":
    main()
