// Attention on bf16 pairs, part 3b: the multiply on AVX-512 BF16 (vdpbf16ps), for CPUs
// with the bf16 dot product but no AMX tiles (AMD Zen 4 and later, Cooper Lake).
//
// Each row of a packed K^T or V block (kv_pack_bf16.h) is one register of 16 bf16 pairs;
// one vdpbf16ps against a broadcast pair of a Q (or P) row adds that pair's share to 16
// scores (or 16 output columns). Blocks of 4 rows x 4 registers keep 16 accumulators
// in registers and give each load 4 multiplies.
#pragma once

#include "attention/online_softmax.h"

namespace tide_attn {

#if defined(TIDE_BF16_PAIRS)

// The 32-bit word holding bf16 elements i and i + 1 (i even), in every lane.
inline __m512bh pair_of(const at::BFloat16* row, int64_t i) {
  int32_t word;
  std::memcpy(&word, row + i, sizeof(word));
  return (__m512bh)_mm512_set1_epi32(word);
}

// Keeps a loaded tile row in a register: without this gcc reloads it for every query row
// that multiplies it (16 loads instead of 4 per 16 vdpbf16ps), and the loads, not the
// multiplies, set the pace.
inline void in_register(__m512bh& v) { asm("" : "+v"(v)); }

struct Avx512Bf16Pass {
  struct Thread {};  // no per-thread state
  static constexpr int kBlockRows = 4;

  static void start(float* o, int64_t D) { std::fill(o, o + kRows * D, 0.f); }

  // S (16 x 64) = Q K^T for one key block: per 4 rows, the 4 sub-blocks of 16 keys.
  static void scores(const at::BFloat16* qt, int64_t D, const Packed& kv, int64_t h, int64_t kb, float* s) {
    for (int r0 = 0; r0 < kRows; r0 += kBlockRows) {
      __m512 acc[kBlockRows][4];
      for (auto& row : acc)
        for (auto& a : row) a = _mm512_setzero_ps();
      for (int64_t c = 0; c < kv.dk; ++c) {
        const at::BFloat16* kt[4];
        for (int sub = 0; sub < 4; ++sub) kt[sub] = kv.k_tile(h, kb, sub, c);
        for (int kk = 0; kk < 16; ++kk) {
          __m512bh k[4];
          for (int sub = 0; sub < 4; ++sub) {
            k[sub] = (__m512bh)_mm512_loadu_si512(kt[sub] + 32 * kk);
            in_register(k[sub]);
          }
          for (int r = 0; r < kBlockRows; ++r) {
            const __m512bh q = pair_of(qt + (r0 + r) * D, 32 * c + 2 * kk);
            for (int sub = 0; sub < 4; ++sub) acc[r][sub] = _mm512_dpbf16_ps(acc[r][sub], q, k[sub]);
          }
        }
      }
      for (int r = 0; r < kBlockRows; ++r)
        for (int sub = 0; sub < 4; ++sub) _mm512_storeu_ps(s + (r0 + r) * kKeys + 16 * sub, acc[r][sub]);
    }
  }

  static void rescale(float* o, int64_t D, __mmask16 rows, __m512 alpha) { rescale_rows(o, D, rows, alpha); }

  // o (16 x D) += P V for one key block, CB slices of 16 output columns at a time.
  template <int CB>
  static void accumulate_cols(float* o, int64_t D, const at::BFloat16* pb, const Packed& kv, int64_t h, int64_t kb,
                              int64_t c0) {
    for (int r0 = 0; r0 < kRows; r0 += kBlockRows) {
      __m512 acc[kBlockRows][CB];
      for (int r = 0; r < kBlockRows; ++r)
        for (int c = 0; c < CB; ++c) acc[r][c] = _mm512_loadu_ps(o + (r0 + r) * D + 16 * (c0 + c));
      for (int half = 0; half < 2; ++half) {
        const at::BFloat16* vt[CB];
        for (int c = 0; c < CB; ++c) vt[c] = kv.v_tile(h, kb, half, c0 + c);
        for (int kk = 0; kk < 16; ++kk) {
          __m512bh v[CB];
          for (int c = 0; c < CB; ++c) {
            v[c] = (__m512bh)_mm512_loadu_si512(vt[c] + 32 * kk);
            in_register(v[c]);
          }
          for (int r = 0; r < kBlockRows; ++r) {
            const __m512bh p = pair_of(pb + (r0 + r) * kKeys, 32 * half + 2 * kk);
            for (int c = 0; c < CB; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], p, v[c]);
          }
        }
      }
      for (int r = 0; r < kBlockRows; ++r)
        for (int c = 0; c < CB; ++c) _mm512_storeu_ps(o + (r0 + r) * D + 16 * (c0 + c), acc[r][c]);
    }
  }

  static void accumulate(float* o, int64_t D, const at::BFloat16* pb, const Packed& kv, int64_t h, int64_t kb) {
    int64_t c0 = 0;
    for (; c0 + 4 <= kv.dv; c0 += 4) accumulate_cols<4>(o, D, pb, kv, h, kb, c0);
    if (c0 < kv.dv) accumulate_cols<2>(o, D, pb, kv, h, kb, c0);  // head_dim is a multiple of 32
  }

  static void finish(float*, int64_t) {}
};

#endif  // TIDE_BF16_PAIRS

}  // namespace tide_attn
