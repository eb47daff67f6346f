// The GEMV on AVX-512 BF16 (op gemv: cpp-avx512bf16): one or two rows on vdpbf16ps, each pair
// of x broadcast across a block row's 16 columns, four accumulators per row; sums in fp32,
// the bias added before the one rounding to bf16.
#pragma once

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include <ATen/ATen.h>

#include <cstdint>

#include "common/packed_weight.h"

namespace tide_gemv {
namespace {  // internal linkage, as in gemv/gemv.cpp, the one source that includes this

using tide_packed::kBlock;
using tide_packed::kCols;
constexpr int64_t kPrefetch = 2048;  // bytes ahead of the weight stream

using tide_packed::store_row;

inline void prefetch_block(const at::BFloat16* block) {
  const char* p = reinterpret_cast<const char*>(block) + kPrefetch;
  for (int i = 0; i < 16; ++i) _mm_prefetch(p + 64 * i, _MM_HINT_T0);
}

// Column groups [g0, g1) for M (1 or 2) rows on vdpbf16ps: each pair x[k, k+1] broadcast
// against a 64-byte row of the block (16 columns), four accumulators per row.
template <int M>
void vector_groups(const at::BFloat16* x, const at::BFloat16* wp, const at::BFloat16* bias, at::BFloat16* y,
                   int64_t N, int64_t K, int64_t g0, int64_t g1) {
  const int64_t chunks = K / 32;
  const auto* pairs = reinterpret_cast<const int32_t*>(x);
  for (int64_t g = g0; g < g1 && g * kCols < N; ++g) {
    const at::BFloat16* w = wp + g * chunks * kBlock;
    __m512 acc[M][4];
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < 4; ++i) acc[m][i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      prefetch_block(w + c * kBlock);
      for (int r = 0; r < 16; ++r) {
        const __m512i wv = _mm512_loadu_si512(w + c * kBlock + r * 32);
        for (int m = 0; m < M; ++m) {
          const __m512i xv = _mm512_set1_epi32(pairs[m * K / 2 + c * 16 + r]);
          acc[m][r & 3] = _mm512_dpbf16_ps(acc[m][r & 3], reinterpret_cast<const __m512bh&>(xv),
                                           reinterpret_cast<const __m512bh&>(wv));
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3]));
      store_row(sum, bias, y + m * N, N, g * kCols);
    }
  }
}

}  // namespace
}  // namespace tide_gemv
#endif
