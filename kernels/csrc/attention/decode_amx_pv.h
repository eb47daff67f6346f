// Decode attention's P.V on AMX tiles, after decode_amx_qk.h's Q.K and softmax (same cases).
//
// The right operand is 16 V rows read in place from their block, 32 dims per tile, as
// they are: a tile multiply sums over pairs of adjacent elements, so with the left
// operand's pairs (p, 0) it sums p * V[key][even dim], with (0, p) p * V[key][odd dim].
// Each 32 dims of output are two result tiles (G heads x 16 even, 16 odd dims), resident
// across the keys and interleaved once at the end; that wastes half the multiplies but
// needs no repacking of V. The left operands come from the flat [key][head] probabilities
// per 16 keys: G lane permutes per head to gather its 16 keys, rounded to bf16 (as the
// attention on bf16 pairs rounds P). The last, partial group of keys is copied with zeros
// past the context: the pool's rows there may hold anything, NaN included, and 0 * NaN
// would reach the sums.
#pragma once

#include "attention/decode_amx_qk.h"

#if defined(TIDE_DECODE_AMX)

#include <cstring>

namespace tide_decode_amx {

// Tiles 0-1: P as (p, 0) and (0, p) pairs (G rows x 64 bytes); 2: V rows (16 x 64 bytes);
// 4-7: outputs (G rows x 16 floats): even and odd dims of up to two 32-dim chunks.
inline void configure_pv(int64_t G) {
  tide_amx::TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    if (t == 3) continue;
    cfg.rows[t] = static_cast<uint8_t>(t == 2 ? 16 : G);
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// Head h's p for the 16 keys of one group (flat: 16 x G floats, [key][head]) as the two
// left operands: even[h] = (bf16(p), 0) pairs, odd[h] = (0, bf16(p)).
inline void p_operands(const float* flat, int64_t G, uint32_t* even, uint32_t* odd) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i jg = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(G)));  // j * G
  const __m512i source = _mm512_srli_epi32(jg, 4);  // which of the G vectors key j is in
  for (int64_t h = 0; h < G; ++h) {
    const __m512i idx = _mm512_and_si512(_mm512_add_epi32(jg, _mm512_set1_epi32(static_cast<int>(h))),
                                         _mm512_set1_epi32(15));
    __m512 p = _mm512_setzero_ps();
    for (int64_t v = 0; v < G; ++v) {
      const __mmask16 from_v = _mm512_cmpeq_epi32_mask(source, _mm512_set1_epi32(static_cast<int>(v)));
      p = _mm512_mask_permutexvar_ps(p, from_v, idx, _mm512_loadu_ps(flat + 16 * v));
    }
    const __m256bh b = _mm512_cvtneps_pbh(p);
    const __m512i lo = _mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(b));
    _mm512_storeu_si512(even + 16 * h, lo);
    _mm512_storeu_si512(odd + 16 * h, _mm512_slli_epi32(lo, 16));
  }
}

// Accumulate one group of 16 keys (V rows v, stride D) into the output tiles of the NCH
// chunks of this pass; left operands in tiles 0 and 1.
template <int NCH>
inline void pv16(const at::BFloat16* v, int64_t D) {
  _tile_loadd(2, v, D * 2);
  _tile_dpbf16ps(4, 0, 2);
  _tile_dpbf16ps(5, 1, 2);
  if constexpr (NCH > 1) {
    _tile_loadd(2, v + 32, D * 2);
    _tile_dpbf16ps(6, 0, 2);
    _tile_dpbf16ps(7, 1, 2);
  }
}

// out[h][d] (h < G, d in [d0, d0 + 32 * NCH)) = inv_sum[h] * sum_t p[t * G + h] V[t][d].
// Tiles configured by configure_pv.
template <int NCH, typename Prefetch>
void pv_pass(const float* p, int64_t G, int64_t len, const int64_t* table, int64_t BS, const at::BFloat16* v_head,
             int64_t D, int64_t d0, const float* inv_sum, float* out, Prefetch&& prefetch) {
  const int bs_shift = __builtin_ctzll(BS);
  const int64_t bs_mask = BS - 1;
  alignas(64) uint32_t even[16 * 16], odd[16 * 16];
  alignas(64) at::BFloat16 tail[16 * 128];
  _tile_zero(4);
  _tile_zero(5);
  if constexpr (NCH > 1) {
    _tile_zero(6);
    _tile_zero(7);
  }
  for (int64_t t0 = 0; t0 < len; t0 += 16) {
    prefetch(t0);
    const at::BFloat16* v = v_head + (table[t0 >> bs_shift] * BS + (t0 & bs_mask)) * D;
    if (len - t0 < 16) {  // rows past the context: zeros, not whatever the pool holds
      const int64_t m = len - t0;
      std::memcpy(tail, v, m * D * sizeof(at::BFloat16));
      std::memset(tail + m * D, 0, (16 - m) * D * sizeof(at::BFloat16));
      v = tail;
    }
    p_operands(p + t0 * G, G, even, odd);
    _tile_loadd(0, even, 64);
    _tile_loadd(1, odd, 64);
    pv16<NCH>(v + d0, D);
  }
  alignas(64) float res[4][16 * 16];
  _tile_stored(4, res[0], 64);
  _tile_stored(5, res[1], 64);
  if constexpr (NCH > 1) {
    _tile_stored(6, res[2], 64);
    _tile_stored(7, res[3], 64);
  }
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  for (int64_t h = 0; h < G; ++h) {
    const __m512 scale = _mm512_set1_ps(inv_sum[h]);
    for (int c = 0; c < NCH; ++c) {
      const __m512 e = _mm512_load_ps(res[2 * c] + 16 * h), o = _mm512_load_ps(res[2 * c + 1] + 16 * h);
      float* dst = out + h * D + d0 + 32 * c;
      _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_permutex2var_ps(e, lo, o), scale));
      _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_permutex2var_ps(e, hi, o), scale));
    }
  }
}

// P.V for all D dims: one pass per 64 dims (V's rows of a second pass come from the cache
// the first one filled).
template <typename Prefetch>
void pv(const float* p, int64_t G, int64_t len, const int64_t* table, int64_t BS, const at::BFloat16* v_head,
        int64_t D, const float* inv_sum, float* out, Prefetch&& prefetch) {
  configure_pv(G);
  if (D == 32) {
    pv_pass<1>(p, G, len, table, BS, v_head, D, 0, inv_sum, out, prefetch);
  } else {
    for (int64_t d0 = 0; d0 < D; d0 += 64) pv_pass<2>(p, G, len, table, BS, v_head, D, d0, inv_sum, out, prefetch);
  }
}

}  // namespace tide_decode_amx

#endif
