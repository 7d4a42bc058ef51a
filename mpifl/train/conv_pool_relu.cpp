// A convolution of many clients, its 2x2 max-pooling and ReLU in one pass
// (mpifl/train/fused.py compiles and documents it). Each client's sums run in an
// order fixed by its own shapes: the same bits whatever clients share the call
// and on any number of threads (a task is one client's sample, or one client).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

namespace {

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef int32_t i8 __attribute__((vector_size(32)));

inline v8 load(const float* p) { return *reinterpret_cast<const v8u*>(p); }
inline v8 splat(float s) { return v8{s, s, s, s, s, s, s, s}; }

// One sample of one client: conv rows 2py and 2py+1 for all C outputs (NV vectors
// of 8 columns each, held in registers over the K x K x CI taps), then their 2x2
// maxima, the index of each window's first maximum (row-major, as torch's
// max-pooling picks it) and the ReLU. xp: the sample, rows padded to WP columns.
template <int C, int NV>
void forward_sample(const float* xp, int64_t CI, int64_t H, int64_t WP, int64_t K, const float* wg,
                    const float* bg, float* out, uint8_t* arg, int64_t PH, int64_t PW) {
  constexpr int NP = (NV + 1) / 2;  // blocks of 8 pooled columns
  alignas(32) float R[2][C][NP * 16] = {};
  for (int64_t py = 0; py < PH; ++py) {
    for (int r = 0; r < 2; ++r) {
      const int64_t oy = 2 * py + r;
      v8 acc[C][NV];
#pragma GCC unroll 16
      for (int o = 0; o < C; ++o)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[o][v] = splat(bg[o]);
      for (int64_t c = 0; c < CI; ++c)
        for (int64_t ky = 0; ky < K; ++ky) {
          const float* xr = xp + (c * H + oy + ky) * WP;
          const float* wr = wg + (c * K + ky) * K;
          for (int64_t kx = 0; kx < K; ++kx) {
            v8 xv[NV];
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) xv[v] = load(xr + kx + 8 * v);
#pragma GCC unroll 16
            for (int o = 0; o < C; ++o) {
              const v8 wv = splat(wr[o * CI * K * K + kx]);
#pragma GCC unroll 8
              for (int v = 0; v < NV; ++v) acc[o][v] += wv * xv[v];
            }
          }
        }
#pragma GCC unroll 16
      for (int o = 0; o < C; ++o)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) *reinterpret_cast<v8*>(&R[r][o][8 * v]) = acc[o][v];
    }
    // branch-free over 8 windows at a time: as scalar code the compiler branches,
    // and the branches on random maxima mispredict (half the kernel's time)
    alignas(32) float P[C][NP * 8];
    alignas(32) int32_t A[C][NP * 8];
    for (int o = 0; o < C; ++o)
      for (int j = 0; j < NP; ++j) {
        const v8 t0 = *reinterpret_cast<const v8*>(&R[0][o][16 * j]);
        const v8 t1 = *reinterpret_cast<const v8*>(&R[0][o][16 * j + 8]);
        const v8 b0 = *reinterpret_cast<const v8*>(&R[1][o][16 * j]);
        const v8 b1 = *reinterpret_cast<const v8*>(&R[1][o][16 * j + 8]);
        const v8 a0 = __builtin_shufflevector(t0, t1, 0, 2, 4, 6, 8, 10, 12, 14);
        const v8 a1 = __builtin_shufflevector(t0, t1, 1, 3, 5, 7, 9, 11, 13, 15);
        const v8 a2 = __builtin_shufflevector(b0, b1, 0, 2, 4, 6, 8, 10, 12, 14);
        const v8 a3 = __builtin_shufflevector(b0, b1, 1, 3, 5, 7, 9, 11, 13, 15);
        // a NaN wins, the last one in the window, as in torch's kernel (v > max || isnan(v))
        const i8 upper = (a1 > a0) | (a1 != a1), lower = (a3 > a2) | (a3 != a3);  // -1 where true
        const v8 m01 = upper ? a1 : a0, m23 = lower ? a3 : a2;
        const i8 down = (m23 > m01) | (m23 != m23);
        *reinterpret_cast<v8*>(&P[o][8 * j]) = down ? m23 : m01;
        *reinterpret_cast<i8*>(&A[o][8 * j]) = down ? (2 - lower) : (0 - upper);
      }
    for (int64_t px = 0; px < PW; ++px)
      for (int o = 0; o < C; ++o) {
        arg[(py * PW + px) * C + o] = static_cast<uint8_t>(A[o][px]);
        out[(o * PH + py) * PW + px] = P[o][px] <= 0.f ? 0.f : P[o][px];  // relu(NaN) = NaN, as torch's
      }
  }
}

template <int C, int NV>
void forward_t(const float* x, const float* w, const float* bias, float* out, uint8_t* arg, int64_t m, int64_t B,
               int64_t CI, int64_t H, int64_t W, int64_t K) {
  const int64_t OH = H - K + 1, PH = OH / 2, PW = (W - K + 1) / 2, WP = NV * 8 + K - 1;
  at::parallel_for(0, m * B, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> pad(CI * H * WP, 0.f);  // the vectors read past a row's end
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t g = t / B, b = t % B;
      const float* xs = x + t * CI * H * W;
      for (int64_t i = 0; i < CI * H; ++i) std::memcpy(pad.data() + i * WP, xs + i * W, W * sizeof(float));
      forward_sample<C, NV>(pad.data(), CI, H, WP, K, w + g * C * CI * K * K, bias + g * C, out + t * C * PH * PW,
                            arg + t * PH * PW * C, PH, PW);
    }
  });
}

// One client's weight, bias and (dx not null) input gradients from the pooled
// gradient: a window passes its gradient to its first maximum alone, and only where
// the ReLU let it through, so a quarter or less of the convolution's outputs carry
// one. Each K-wide patch row is one vector (K <= 8, lanes past K unused, the
// weights' rows padded with zeros so that they add nothing past K); an output
// channel's J = CI x K rows stay in registers over the client's samples.
template <int J>
void backward_t(const float* x, const float* w, const float* gy, const float* y, const uint8_t* arg, float* dx,
                float* dw, float* db, int64_t m, int64_t B, int64_t C, int64_t CI, int64_t H, int64_t W, int64_t K,
                int64_t PH, int64_t PW) {
  const int64_t WP = W + 8, S = CI * H * WP;
  at::parallel_for(0, m, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> pad(B * S, 0.f), gx(dx ? B * S : 0);
    std::vector<v8> wrow(C * J);
    int64_t off[J];
    for (int j = 0; j < J; ++j) off[j] = ((j / K) * H + j % K) * WP;
    for (int64_t g = lo; g < hi; ++g) {
      for (int64_t i = 0; i < B * CI * H; ++i)
        std::memcpy(pad.data() + i * WP, x + (g * B * CI * H + i) * W, W * sizeof(float));
      if (dx) {
        std::fill(gx.begin(), gx.end(), 0.f);
        for (int64_t r = 0; r < C * J; ++r) {
          alignas(32) float row[8] = {};
          std::memcpy(row, w + (g * C * J + r) * K, K * sizeof(float));
          wrow[r] = *reinterpret_cast<const v8*>(row);
        }
      }
      for (int64_t o = 0; o < C; ++o) {
        v8 acc[J];
#pragma GCC unroll 32
        for (int j = 0; j < J; ++j) acc[j] = splat(0.f);
        float sb = 0.f;
        for (int64_t b = 0; b < B; ++b) {
          const int64_t base = ((g * B + b) * C + o) * PH * PW;
          const uint8_t* ar = arg + (g * B + b) * PH * PW * C + o;
          for (int64_t py = 0; py < PH; ++py)
            for (int64_t px = 0; px < PW; ++px) {
              const int64_t at = base + py * PW + px;
              if (y[at] <= 0.f) continue;  // a NaN passes its gradient, as torch's ReLU (threshold_backward) does
              const float s = gy[at];
              const uint8_t a = ar[(py * PW + px) * C];
              const int64_t p = b * S + (2 * py + (a >> 1)) * WP + 2 * px + (a & 1);
              sb += s;
              const v8 sv = splat(s);
              const float* xp = pad.data() + p;
#pragma GCC unroll 32
              for (int j = 0; j < J; ++j) acc[j] += sv * load(xp + off[j]);
              if (dx) {
                float* gp = gx.data() + p;
#pragma GCC unroll 32
                for (int j = 0; j < J; ++j) {
                  v8u* q = reinterpret_cast<v8u*>(gp + off[j]);
                  *q = *q + sv * wrow[o * J + j];
                }
              }
            }
        }
        for (int j = 0; j < J; ++j)
          for (int64_t kx = 0; kx < K; ++kx) dw[((g * C + o) * J + j) * K + kx] = acc[j][kx];
        db[g * C + o] = sb;
      }
      if (dx)
        for (int64_t i = 0; i < B * CI * H; ++i)
          std::memcpy(dx + (g * B * CI * H + i) * W, gx.data() + i * WP, W * sizeof(float));
    }
  });
}

void check(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), name, " must be a contiguous CPU tensor");
}

}  // namespace

// x [m, B, CI, H, W], w [m, C, CI, K, K], bias [m, C] -> out [m, B, C, PH, PW] (relu
// of the pooled convolution), arg [m, B, PH, PW, C] (each window's argmax, 0-3)
void forward(torch::Tensor x, torch::Tensor w, torch::Tensor bias, torch::Tensor out, torch::Tensor arg) {
  check(x, "x"); check(w, "w"); check(bias, "bias"); check(out, "out"); check(arg, "arg");
  const int64_t m = x.size(0), B = x.size(1), CI = x.size(2), H = x.size(3), W = x.size(4), K = w.size(3);
  const int64_t c = w.size(1), nv = (W - K + 1 + 7) / 8;
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>(), *bp = bias.data_ptr<float>();
  float* op = out.data_ptr<float>();
  uint8_t* ap = arg.data_ptr<uint8_t>();
#define FWD(C_, NV_) \
  if (c == C_ && nv == NV_) return forward_t<C_, NV_>(xp, wp, bp, op, ap, m, B, CI, H, W, K);
#define FWD_C(C_) FWD(C_, 1) FWD(C_, 2) FWD(C_, 3) FWD(C_, 4)
  FWD_C(1) FWD_C(2) FWD_C(3) FWD_C(4) FWD_C(5) FWD_C(6) FWD_C(7) FWD_C(8)
  FWD_C(9) FWD_C(10) FWD_C(11) FWD_C(12) FWD_C(13) FWD_C(14) FWD_C(15) FWD_C(16)
  TORCH_CHECK(false, "conv_pool_relu: no kernel for ", c, " output channels of width ", W - K + 1);
}

// the gradients of forward's output gradient gy [m, B, C, PH, PW]: dw [m, C, CI, K, K],
// db [m, C], and dx [m, B, CI, H, W] where given; y and arg as forward left them
void backward(torch::Tensor x, torch::Tensor w, torch::Tensor gy, torch::Tensor y, torch::Tensor arg,
              c10::optional<torch::Tensor> dx, torch::Tensor dw, torch::Tensor db) {
  check(x, "x"); check(w, "w"); check(gy, "gy"); check(y, "y"); check(arg, "arg"); check(dw, "dw"); check(db, "db");
  if (dx) check(*dx, "dx");
  const int64_t m = x.size(0), B = x.size(1), CI = x.size(2), H = x.size(3), W = x.size(4), K = dw.size(3);
  const int64_t C = dw.size(1), J = CI * K, PH = arg.size(2), PW = arg.size(3);
  TORCH_CHECK(K <= 8, "conv_pool_relu: kernels up to 8 wide, not ", K);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>(), *gp = gy.data_ptr<float>();
  const float* yp = y.data_ptr<float>();
  const uint8_t* ap = arg.data_ptr<uint8_t>();
  float *xg = dx ? dx->data_ptr<float>() : nullptr, *wg = dw.data_ptr<float>(), *bg = db.data_ptr<float>();
#define BWD(J_) \
  if (J == J_) return backward_t<J_>(xp, wp, gp, yp, ap, xg, wg, bg, m, B, C, CI, H, W, K, PH, PW);
  BWD(1) BWD(2) BWD(3) BWD(4) BWD(5) BWD(6) BWD(7) BWD(8) BWD(9) BWD(10) BWD(11) BWD(12) BWD(13) BWD(14) BWD(15)
  BWD(16) BWD(17) BWD(18) BWD(19) BWD(20) BWD(21) BWD(22) BWD(23) BWD(24) BWD(25) BWD(26) BWD(27) BWD(28) BWD(29)
  BWD(30) BWD(31) BWD(32)
  TORCH_CHECK(false, "conv_pool_relu: no kernel for ", CI, " x ", K, " rows");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward);
  m.def("backward", &backward);
}
