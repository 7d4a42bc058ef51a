"""Can a direct convolution written for many tiny grouped convolutions beat torch's
grouped kernel on the CPU? A measurement for Performance IV (bench/README.md), not
a training path: cnn_dpfl's two convolutions (1->4 and 4->12 channels a client,
5x5) at m clients, their forward and weight gradient, as torch's grouped
``conv2d`` (the batched path's call) and as a small C++ loop nest compiled here
with ``torch.utils.cpp_extension.load_inline`` (-O3 -march=native; the compiler
vectorises the innermost output row; OpenMP over samples for the forward and over
clients for the weight gradient, so a client's sums never depend on the others).

    python bench/direct_conv.py --clients 64 --batch 16 --repeats 5

Prints, per convolution and direction, ms and GFLOP/s of each, their ratio, the
largest difference of the results (float32 sums in another order), and the
machine's matrix-product rate for scale. Needs a C++ compiler and ninja.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roofline import best_of, matmul_rate  # noqa: E402 - bench/ is not a package

_SRC = r"""
#include <torch/extension.h>
#include <omp.h>

// x [B, G*CI, H, W], w [G*CO, CI, K, K] -> y [B, G*CO, OH, OW]; stride 1, no padding
torch::Tensor fwd(torch::Tensor x, torch::Tensor w, int64_t G) {
  const int64_t B = x.size(0), H = x.size(2), W = x.size(3);
  const int64_t CI = w.size(1), K = w.size(2), CO = w.size(0) / G;
  const int64_t OH = H - K + 1, OW = W - K + 1;
  auto y = torch::zeros({B, G * CO, OH, OW}, x.options());
  const float* xp = x.data_ptr<float>(); const float* wp = w.data_ptr<float>(); float* yp = y.data_ptr<float>();
  #pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t o = 0; o < CO; ++o) {
        float* yo = yp + ((b * G + g) * CO + o) * OH * OW;
        const float* wo = wp + (g * CO + o) * CI * K * K;
        for (int64_t c = 0; c < CI; ++c) {
          const float* xc = xp + ((b * G + g) * CI + c) * H * W;
          for (int64_t oy = 0; oy < OH; ++oy) {
            float* yr = yo + oy * OW;
            for (int64_t ky = 0; ky < K; ++ky) {
              const float* xr = xc + (oy + ky) * W;
              for (int64_t kx = 0; kx < K; ++kx) {
                const float wv = wo[(c * K + ky) * K + kx];
                #pragma omp simd
                for (int64_t ox = 0; ox < OW; ++ox) yr[ox] += wv * xr[ox + kx];
              }
            }
          }
        }
      }
  return y;
}

// dW [G*CO, CI, K, K] = sum over b, oy, ox of dy[b, g*CO+o, oy, ox] * x[b, g*CI+c, oy+ky, ox+kx]
torch::Tensor wgrad(torch::Tensor x, torch::Tensor dy, int64_t G, int64_t K) {
  const int64_t B = x.size(0), H = x.size(2), W = x.size(3);
  const int64_t CI = x.size(1) / G, CO = dy.size(1) / G, OH = dy.size(2), OW = dy.size(3);
  auto dw = torch::zeros({G * CO, CI, K, K}, x.options());
  const float* xp = x.data_ptr<float>(); const float* dp = dy.data_ptr<float>(); float* wp = dw.data_ptr<float>();
  #pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < G; ++g)
    for (int64_t o = 0; o < CO; ++o)
      for (int64_t c = 0; c < CI; ++c)
        for (int64_t ky = 0; ky < K; ++ky)
          for (int64_t kx = 0; kx < K; ++kx) {
            float acc[64] = {0};  // per-lane partial sums over ox (OW <= 64), summed in a fixed order
            for (int64_t b = 0; b < B; ++b) {
              const float* d = dp + ((b * G + g) * CO + o) * OH * OW;
              const float* xc = xp + ((b * G + g) * CI + c) * H * W;
              for (int64_t oy = 0; oy < OH; ++oy) {
                const float* dr = d + oy * OW; const float* xr = xc + (oy + ky) * W + kx;
                #pragma omp simd
                for (int64_t ox = 0; ox < OW; ++ox) acc[ox] += dr[ox] * xr[ox];
              }
            }
            float s = 0.f;
            for (int64_t ox = 0; ox < OW; ++ox) s += acc[ox];
            wp[((g * CO + o) * CI + c) * K * K + ky * K + kx] = s;
          }
  return dw;
}
"""


def _compare(ext, ci: int, co: int, hw: int, m: int, b: int, repeats: int, gen: torch.Generator) -> None:  # noqa: ANN001
    """One convolution (ci -> co channels a client, 5x5, on hw x hw): a table row per direction."""
    k = 5
    x = torch.randn(b, m * ci, hw, hw, generator=gen)
    w = torch.randn(m * co, ci, k, k, generator=gen) * 0.1
    oh = hw - k + 1
    dy = torch.randn(b, m * co, oh, oh, generator=gen)
    flop = 2 * b * m * co * ci * k * k * oh * oh

    def torch_fwd() -> torch.Tensor:
        return F.conv2d(x, w, None, 1, 0, 1, m)

    def torch_wgrad() -> torch.Tensor:
        return torch.ops.aten.convolution_backward(dy, x, w, None, (1, 1), (0, 0), (1, 1), False, (0, 0), m,
                                                   (False, False, True))[1]

    rows = (("forward", torch_fwd, lambda: ext.fwd(x, w, m)),
            ("weight grad", torch_wgrad, lambda: ext.wgrad(x, dy, m, k)))
    for name, ours, direct in rows:
        t, d = best_of(ours, repeats), best_of(direct, repeats)
        e = (ours() - direct()).abs().max().item()
        print(f"| {ci}->{co} k5 on {hw}x{hw} | {name} | {1e3 * t:.2f} | {1e3 * d:.2f} | {flop / t / 1e9:.1f} | "
              f"{flop / d / 1e9:.1f} | {t / d:.2f}x | {e:.1e} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    from torch.utils.cpp_extension import load_inline

    ext = load_inline("mpifl_direct_conv", cpp_sources=_SRC, functions=["fwd", "wgrad"],
                      extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])
    print(f"torch.mm 2048x2048: {matmul_rate(3):.1f} GFLOP/s on {torch.get_num_threads()} thread(s), "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    gen = torch.Generator().manual_seed(0)
    print("| convolution | direction | torch ms | direct ms | torch GFLOP/s | direct GFLOP/s | speed-up "
          "| max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for ci, co, hw in ((1, 4, 28), (4, 12, 12)):
        _compare(ext, ci, co, hw, args.clients, args.batch, args.repeats, gen)

if __name__ == "__main__":
    main()
