// The packed weight the GEMV (gemv/gemv.cpp) and the GEMM (gemm/gemm_amx.cpp) both read, and
// what each does with its sums: the layout is the AMX tile's right operand, 16 output
// columns by 32 K in one 1 KB block, K in pairs (the VNNI order tdpbf16ps and vdpbf16ps
// read):
//   packed[g][k / 32][(k % 32) / 2][n % 16][k % 2],  g = n / 16 (zero rows up to an even g)
// built by tide::gemv_pack_bf16.
#pragma once

#include <ATen/ATen.h>

#include "common/silu_avx512.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace tide_packed {

constexpr int64_t kCols = 16;          // output columns per group
constexpr int64_t kBlock = kCols * 32;  // bf16 per (group, 32 K) block: 1 KB

// Checks that `packed` came from gemv_pack_bf16 for an N-column weight and x is [M, K].
inline void check_operands(const char* op, const at::Tensor& x, const at::Tensor& packed, int64_t N) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16, op, " takes bfloat16");
  TORCH_CHECK(packed.dim() == 5 && packed.size(0) % 2 == 0 && packed.size(2) == 16 && packed.size(3) == kCols &&
                  packed.size(4) == 2 && packed.is_contiguous(),
              op, " takes a weight from gemv_pack_bf16");
  const int64_t K = packed.size(1) * 32, groups = packed.size(0);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, op, ": x must be [M, ", K, "], got ", x.sizes());
  TORCH_CHECK(N > (groups - 2) * kCols && N <= groups * kCols, op, ": N ", N, " does not match the packed weight");
}

// The bias, checked and contiguous, or an undefined tensor for none.
inline at::Tensor bias_operand(const c10::optional<at::Tensor>& bias, int64_t N) {
  if (!bias.has_value() || !bias->defined()) return at::Tensor();
  TORCH_CHECK(bias->numel() == N && bias->scalar_type() == at::kBFloat16, "bias must be bfloat16 [N]");
  return bias->contiguous();
}

#if defined(__AVX512BF16__)
inline __mmask16 column_mask(int64_t N, int64_t n0) {
  return N - n0 >= kCols ? __mmask16(0xFFFF) : __mmask16((1u << (N - n0)) - 1);
}

// The 16 sums rounded to bf16 and widened back: what a bf16 y holds, as fp32 lanes.
inline __m512 rounded(__m512 acc) {
  const __m256bh r = _mm512_cvtneps_pbh(acc);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(r)), 16));
}

// 16 columns of SiLU(gate) * up for one row of the fused gate|up, from the two groups' fp32
// sums, each rounded to bf16 first as the unfused projection's y was (silu_mul's rounding).
inline void store_silu_row(const float* gate_sums, const float* up_sums, at::BFloat16* dst) {
  const __m256bh r = tide_vec::silu_mul_bf16(rounded(_mm512_load_ps(gate_sums)), rounded(_mm512_load_ps(up_sums)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), reinterpret_cast<const __m256i&>(r));
}

// y[m, n0 .. n0 + 16) = bf16(acc + bias) for one row: the one rounding of fp32 sums.
inline void store_row(__m512 acc, const at::BFloat16* bias, at::BFloat16* y_row, int64_t N, int64_t n0) {
  const __mmask16 mask = column_mask(N, n0);
  if (bias) {
    const __m256i b = _mm256_maskz_loadu_epi16(mask, bias + n0);
    acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
  }
  const __m256bh r = _mm512_cvtneps_pbh(acc);
  _mm256_mask_storeu_epi16(y_row + n0, mask, reinterpret_cast<const __m256i&>(r));
}
#endif

}  // namespace tide_packed
