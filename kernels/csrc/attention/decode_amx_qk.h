// Decode attention's Q.K on AMX tiles (Sapphire Rapids and later), for bf16 caches whose
// blocks hold a multiple of 16 keys and GQA groups that divide 16 (1, 2, 4, 8, 16 heads).
//
// For 16 keys of one block and the task's G query heads, S^T (16 x G) = K (16 x D) . Q^T:
// the left tile is 16 K rows read in place from the block (row stride D * 2 bytes, 32
// dims per tile), the right tiles are Q^T in VNNI pairs (built once per task), and the
// result lands in the scores as [key][head], 16 keys x G floats in a row. Against
// VDPBF16PS per key and head plus a 16-way transpose per head, that is D / 32 tile
// multiplies per 16 keys. Rows past the context in its last block are read too (the block
// is the pool's); they only reach lanes the softmax masks.
//
// The softmax then runs over the flat [key][head] scores: lane l of a 16-float vector is
// head l % G, so per-head maxima and sums are lane rotations by G, 2G, ... 8.
#pragma once

#include "common/amx_tiles.h"

#if defined(TIDE_AMX_TILES) && defined(__AVX512BF16__)
#define TIDE_DECODE_AMX 1

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <limits>

#include "common/silu_avx512.h"

namespace tide_decode_amx {

// Set by tide::decode_attention_prefer_vector (decode_attention=cpp-avx512bf16 on cpu-amx in
// kernels/dispatch.py): the AVX-512 BF16 path even where tiles would run.
inline std::atomic<bool>& prefer_vector() {
  static std::atomic<bool> flag{false};
  return flag;
}

inline bool enabled() { return !prefer_vector().load(std::memory_order_relaxed); }

// Whether a task of G query heads per KV head, head_dim D and block size BS runs here.
inline bool usable(int64_t G, int64_t D, int64_t BS) {
  return enabled() && G >= 1 && G <= 16 && 16 % G == 0 && (D == 32 || D == 64 || D == 128) && BS % 16 == 0 &&
         tide_amx::tiles_granted();
}

// Tiles 0-1: K rows (16 x 64 bytes); 2-3: scores (16 x 4G bytes); 4-7: Q^T, one per 32
// dims (16 pair rows x 4G bytes).
inline void configure(int64_t G) {
  tide_amx::TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = t < 2 ? 64 : static_cast<uint16_t>(4 * G);
  }
  _tile_loadconfig(&cfg);
}

// qt[c][r][2n + e] = q[n][32c + 2r + e]: chunk c of Q^T as the right operand.
inline void pack_q(const at::BFloat16* q, int64_t G, int64_t D, at::BFloat16* qt) {
  for (int64_t c = 0; c < D / 32; ++c)
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t n = 0; n < G; ++n)
        for (int64_t e = 0; e < 2; ++e) qt[(c * 16 + r) * 2 * G + 2 * n + e] = q[n * D + 32 * c + 2 * r + e];
}

template <int NC>
inline void load_q(const at::BFloat16* qt, int64_t G) {
  const int64_t chunk = 16 * 2 * G, stride = 4 * G;
  _tile_loadd(4, qt, stride);
  if constexpr (NC > 1) _tile_loadd(5, qt + chunk, stride);
  if constexpr (NC > 2) _tile_loadd(6, qt + 2 * chunk, stride);
  if constexpr (NC > 3) _tile_loadd(7, qt + 3 * chunk, stride);
}

// One group of 16 keys (rows k, stride D) into s (16 x G floats), summed in tile C (2 or
// 3: the tile intrinsics take register numbers as literals).
#define TIDE_SCORE16(C)                  \
  _tile_zero(C);                         \
  _tile_loadd(0, k, D * 2);              \
  _tile_dpbf16ps(C, 0, 4);               \
  if constexpr (NC > 1) {                \
    _tile_loadd(1, k + 32, D * 2);       \
    _tile_dpbf16ps(C, 1, 5);             \
  }                                      \
  if constexpr (NC > 2) {                \
    _tile_loadd(0, k + 64, D * 2);       \
    _tile_dpbf16ps(C, 0, 6);             \
  }                                      \
  if constexpr (NC > 3) {                \
    _tile_loadd(1, k + 96, D * 2);       \
    _tile_dpbf16ps(C, 1, 7);             \
  }                                      \
  _tile_stored(C, s, 4 * G);

template <int NC, bool Odd>
inline void score16(const at::BFloat16* k, int64_t G, float* s) {
  constexpr int64_t D = 32 * NC;
  if constexpr (Odd) {
    TIDE_SCORE16(3)
  } else {
    TIDE_SCORE16(2)
  }
}
#undef TIDE_SCORE16

// s[t * G + n] = K[t] . q[n] for t in [0, ceil16(len)), unscaled; K rows prefetched
// ahead (blocks sit anywhere in the pool), V's first rows too. Tiles configured by caller.
template <int NC, typename Prefetch>
void scores(const at::BFloat16* qt, int64_t G, int64_t len, const int64_t* table, int64_t BS,
            const at::BFloat16* k_head, float* s, Prefetch&& prefetch) {
  constexpr int64_t D = 32 * NC;
  const int bs_shift = __builtin_ctzll(BS);
  const int64_t bs_mask = BS - 1;
  load_q<NC>(qt, G);
  int64_t i = 0;
  for (int64_t t0 = 0; t0 < len; t0 += 16, ++i) {
    prefetch(t0);
    const at::BFloat16* k = k_head + (table[t0 >> bs_shift] * BS + (t0 & bs_mask)) * D;
    if (i & 1) score16<NC, true>(k, G, s + t0 * G);
    else score16<NC, false>(k, G, s + t0 * G);
  }
}

inline __m512 rotate(__m512 v, int by) {
  const __m512i idx = _mm512_and_si512(_mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                        _mm512_set1_epi32(by)),
                                       _mm512_set1_epi32(15));
  return _mm512_permutexvar_ps(idx, v);
}

// In place over s[0, ceil16(len) * G): p = e^((s - max) * scale) per head, zeros past the
// context; inv_sum[n] = 1 / sum of head n's p.
inline void softmax_flat(float* s, int64_t G, int64_t len, float scale, float* inv_sum) {
  const int64_t n = len * G;
  auto mask_at = [n](int64_t i) {
    return n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
  };
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) mx = _mm512_mask_max_ps(mx, mask_at(i), mx, _mm512_loadu_ps(s + i));
  for (int64_t by = G; by < 16; by *= 2) mx = _mm512_max_ps(mx, rotate(mx, static_cast<int>(by)));
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512 shift = _mm512_mul_ps(mx, vscale);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 x = _mm512_fmsub_ps(_mm512_loadu_ps(s + i), vscale, shift);
    const __m512 e = _mm512_maskz_mov_ps(mask_at(i), tide_vec::exp512(x));
    _mm512_storeu_ps(s + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  for (int64_t i = (n + 15) / 16 * 16; i < (len + 15) / 16 * 16 * G; i += 16) _mm512_storeu_ps(s + i, _mm512_setzero_ps());
  for (int64_t by = G; by < 16; by *= 2) sum = _mm512_add_ps(sum, rotate(sum, static_cast<int>(by)));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  for (int64_t h = 0; h < G; ++h) inv_sum[h] = 1.f / lanes[h];
}

}  // namespace tide_decode_amx

#endif
