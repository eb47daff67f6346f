// float32 projections on AVX2 + FMA (op gemm: cpp-avx2), for CPUs without AVX-512 (AMD Zen
// 2/3, older Intel), where it beats oneDNN's packed fp32 matmul at 1-64 rows.
//
//   tide::gemm_f32_pack(w) -> packed       w [N, K] float32 (a Hugging Face weight)
//   tide::gemm_f32(x, packed, bias, N)     y [M, N] = x [M, K] W^T (+ bias), any M >= 1
//   tide::gemm_f32_preferred() -> bool     built with AVX2 + FMA and not AVX-512F (the class
//                                          cpu-avx2 of kernels/dispatch.py)
//
// Layout: W's columns in panels of 16 (the last padded with zeros), K cut into blocks of
// kKc; block b holds every panel's kc x 16 floats one after another, so for one K block
// the panels of a thread's column range are one sequential stream. Each thread owns a
// range of panels (the weight is read from memory once per kMc rows) and runs, per kMc
// rows of x and per K block, a 6 x 16 register tile (12 accumulators: two weight loads and
// six broadcasts feed twelve FMAs) over every row group for one panel block while it sits
// in L1, then the next panel. Partial sums go through y between K blocks; the bias is
// added with the last. Each output is one fp32 FMA chain over k in order.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TIDE_GEMM_F32 1
#endif

namespace {

constexpr int64_t kNr = 16;   // columns per panel (two ymm registers)
constexpr int64_t kMr = 6;    // rows per register tile
constexpr int64_t kKc = 256;  // K per block: a panel block is 16 KB
constexpr int64_t kMc = 96;   // rows of x per pass over the weight (96 x 1 KB in L2)

int64_t panels(int64_t N) { return (N + kNr - 1) / kNr; }

#if defined(TIDE_GEMM_F32)

// Lanes [0, n) of a 16-column row, as two masks of eight.
inline __m256i lane_mask(int64_t n) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), iota);
}

// c[r, 0:cols] (+)= sum_k x[r, k] w[k, 0:16] for MR rows over kc keys; `first`: start from
// zero instead of c; `bias`: added at the end (the last K block), else nullptr.
template <int MR>
inline void tile(const float* x, const float* w, int64_t kc, float* c, int64_t ldc, int64_t cols, bool first,
                 const float* bias) {
  __m256 acc[MR][2];
  const bool whole = cols == kNr;
  const __m256i m0 = lane_mask(cols), m1 = lane_mask(cols - 8);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    if (first) {
      acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    } else if (whole) {
      acc[r][0] = _mm256_loadu_ps(c + r * ldc);
      acc[r][1] = _mm256_loadu_ps(c + r * ldc + 8);
    } else {
      acc[r][0] = _mm256_maskload_ps(c + r * ldc, m0);
      acc[r][1] = _mm256_maskload_ps(c + r * ldc + 8, m1);
    }
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + k * kNr), w1 = _mm256_loadu_ps(w + k * kNr + 8);
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + k * kMr + r);
      acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
    }
  }
  if (bias != nullptr) {
    const __m256 b0 = _mm256_maskload_ps(bias, m0), b1 = _mm256_maskload_ps(bias + 8, m1);
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
      acc[r][0] = _mm256_add_ps(acc[r][0], b0);
      acc[r][1] = _mm256_add_ps(acc[r][1], b1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    if (whole) {
      _mm256_storeu_ps(c + r * ldc, acc[r][0]);
      _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
    } else {
      _mm256_maskstore_ps(c + r * ldc, m0, acc[r][0]);
      _mm256_maskstore_ps(c + r * ldc + 8, m1, acc[r][1]);
    }
  }
}

using TileFn = void (*)(const float*, const float*, int64_t, float*, int64_t, int64_t, bool, const float*);
constexpr TileFn kTiles[kMr + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// Panels [p0, p1) of y for every row of x.
void gemm_panels(const float* x, int64_t ldx, int64_t M, int64_t K, const float* packed, int64_t NP,
                 const float* bias, float* y, int64_t N, int64_t p0, int64_t p1) {
  thread_local std::vector<float> xbuf(kMc * kKc);
  float* xb = xbuf.data();
  for (int64_t m0 = 0; m0 < M; m0 += kMc) {
    const int64_t mc = std::min(kMc, M - m0);
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = std::min(kKc, K - k0);
      // x's block as row groups of kMr, k-major inside a group: a tile's six broadcasts
      // per k read one 24-byte run (rows of x lie K floats apart, which maps them to the
      // same L1 sets when K is a multiple of 1,024).
      for (int64_t r = 0; r < mc; ++r) {
        const float* src = x + (m0 + r) * ldx + k0;
        float* dst = xb + (r / kMr) * kc * kMr + r % kMr;
        for (int64_t k = 0; k < kc; ++k) dst[k * kMr] = src[k];
      }
      const float* block = packed + k0 * NP * kNr;  // K block k0 / kKc: NP panels of kc x 16
      const bool first = k0 == 0, last = k0 + kc == K;
      for (int64_t p = p0; p < p1; ++p) {
        const float* w = block + p * kc * kNr;
        const int64_t cols = std::min(kNr, N - p * kNr);
        const float* b = last && bias != nullptr ? bias + p * kNr : nullptr;
        for (int64_t r = 0; r < mc; r += kMr) {
          const int64_t mr = std::min(kMr, mc - r);
          kTiles[mr](xb + r * kc, w, kc, y + (m0 + r) * N + p * kNr, N, cols, first, b);
        }
      }
    }
  }
}

#endif  // TIDE_GEMM_F32

bool gemm_f32_preferred() {
#if defined(TIDE_GEMM_F32) && !defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

at::Tensor gemm_f32_pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "gemm_f32_pack: w must be float32 [N, K], got ",
              w.scalar_type(), " ", w.sizes());
  const int64_t N = w.size(0), K = w.size(1), NP = panels(N);
  TORCH_CHECK(N > 0 && K > 0, "gemm_f32_pack: an empty weight ", w.sizes());
  const at::Tensor src = w.contiguous();
  const float* s = src.data_ptr<float>();
  at::Tensor packed = at::zeros({NP * kNr * K}, w.options());
  float* d = packed.data_ptr<float>();
  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    const int64_t kc = std::min(kKc, K - k0);
    for (int64_t p = 0; p < NP; ++p) {
      float* panel = d + k0 * NP * kNr + p * kc * kNr;
      for (int64_t j = 0; j < kNr && p * kNr + j < N; ++j)
        for (int64_t k = 0; k < kc; ++k) panel[k * kNr + j] = s[(p * kNr + j) * K + k0 + k];
    }
  }
  return packed;
}

at::Tensor gemm_f32(const at::Tensor& x_in, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                    int64_t N) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "gemm_f32: x must be float32 [M, K], got ",
              x_in.scalar_type(), " ", x_in.sizes());
  const at::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), NP = panels(N);
  TORCH_CHECK(N > 0 && packed.dim() == 1 && packed.scalar_type() == at::kFloat && packed.is_contiguous() &&
                  packed.numel() == NP * kNr * K,
              "gemm_f32: packed must be gemm_f32_pack's float32 weight for N=", N, " K=", K, " (", NP * kNr * K,
              " floats), got ", packed.numel());
  const float* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N, "gemm_f32: bias must be float32 [", N, "]");
    bias_c = bias->contiguous();
    b = bias_c.data_ptr<float>();
  }
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
#if defined(TIDE_GEMM_F32)
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  at::parallel_for(0, NP, 1, [&](int64_t p0, int64_t p1) { gemm_panels(xp, ldx, M, K, wp, NP, b, yp, N, p0, p1); });
#else
  TORCH_CHECK(false, "gemm_f32: this build has no AVX2 + FMA");
#endif
  return y;
}

}  // namespace

namespace tide_ops {  // for step/step_layers.cpp (common/ops.h)
at::Tensor gemm_f32(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias, int64_t N) {
  TIDE_RECORD("gemm_f32");
  return ::gemm_f32(x, packed, bias, N);
}
}  // namespace tide_ops

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def("gemm_f32_pack(Tensor w) -> Tensor");
  m.def("gemm_f32(Tensor x, Tensor packed, Tensor? bias, int N) -> Tensor");
  m.def("gemm_f32_preferred() -> bool", &gemm_f32_preferred);
  m.def("gemm_f32_supported() -> bool", [] {
#if defined(TIDE_GEMM_F32)
    return true;
#else
    return false;
#endif
  });
}

TORCH_LIBRARY_IMPL(tide, CPU, m) {
  m.impl("gemm_f32_pack", &gemm_f32_pack);
  m.impl("gemm_f32", &gemm_f32);
}
