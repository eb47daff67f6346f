// Decode attention for one (row, kv head) task on AVX-512: what decode.cpp runs for head_dim
// 16, 32, 64 and 128 where the build has AVX-512F. Scores 16 tokens at a time (bf16 K on
// vdpbf16ps where the build has AVX-512 BF16, else widened to fp32), a vectorised softmax,
// and P.V with the accumulators in registers; bf16 Q.K and P.V on AMX tiles where
// decode_amx_qk.h says they run.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention/decode_amx_pv.h"
#include "common/bf16_lanes.h"
#include "common/silu_avx512.h"

namespace tide_avx512 {
namespace {  // internal linkage, as in attention/decode.cpp, the one source that includes this

using namespace tide_lanes;
using tide_vec::exp512;

// Sums each of 16 vectors: lane t of the result is the sum of v[t]'s lanes.
__attribute__((always_inline)) inline __m512 transpose_sum16(const __m512* v) {
  __m512 r[8], s[4];
  for (int i = 0; i < 8; ++i)
    r[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int j = 0; j < 4; ++j)
    s[j] = _mm512_add_ps(_mm512_shuffle_ps(r[2 * j], r[2 * j + 1], 0x44),
                         _mm512_shuffle_ps(r[2 * j], r[2 * j + 1], 0xEE));
  const __m512 t0 = _mm512_add_ps(_mm512_shuffle_f32x4(s[0], s[1], 0x88), _mm512_shuffle_f32x4(s[0], s[1], 0xDD));
  const __m512 t1 = _mm512_add_ps(_mm512_shuffle_f32x4(s[2], s[3], 0x88), _mm512_shuffle_f32x4(s[2], s[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD));
}

// out[h] = inv_sum[h] * sum_t p[h, t] V[t] for HN query heads, accumulators in registers.
template <typename T, int NV, int HN>
void pv_heads(const float* p, int64_t Lp, const float* inv_sum, int64_t len, const int64_t* table, int64_t BS,
              const T* v_head, float* out) {
  constexpr int D = 16 * NV;
  constexpr int64_t kAhead = 64;  // as decode_task's K rows
  const int bs_shift = __builtin_ctzll(BS);
  const int64_t bs_mask = BS - 1;
  __m512 acc[HN][NV];
  for (int h = 0; h < HN; ++h)
    for (int v = 0; v < NV; ++v) acc[h][v] = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    if (t + kAhead < len) {
      const int64_t ta = t + kAhead;
      const char* pf = reinterpret_cast<const char*>(v_head + (table[ta >> bs_shift] * BS + (ta & bs_mask)) * D);
      for (int64_t off = 0; off < static_cast<int64_t>(D * sizeof(T)); off += 64) _mm_prefetch(pf + off, _MM_HINT_T0);
    }
    const T* src = v_head + (table[t >> bs_shift] * BS + (t & bs_mask)) * D;
    __m512 vv[NV];
    for (int v = 0; v < NV; ++v) vv[v] = load16(src + 16 * v);
    for (int h = 0; h < HN; ++h) {
      const __m512 ph = _mm512_set1_ps(p[h * Lp + t]);
      for (int v = 0; v < NV; ++v) acc[h][v] = _mm512_fmadd_ps(ph, vv[v], acc[h][v]);
    }
  }
  for (int h = 0; h < HN; ++h) {
    const __m512 scale = _mm512_set1_ps(inv_sum[h]);
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + h * D + 16 * v, _mm512_mul_ps(acc[h][v], scale));
  }
}

// One (row, kv head) task with head_dim = 16 * NV. Scores are computed 16 tokens at a
// time (K rows widened to fp32 once, reduced with one transpose), softmax is
// vectorised, and P.V keeps up to 16 accumulators (16 / NV query heads) in registers.
template <typename T, int NV>
void decode_task(const float* qf, const T* qraw, float scale, int64_t G, int64_t len, const int64_t* table,
                 int64_t BS, const T* k_head, const T* v_head, float* scores, int64_t Lp, float* kbuf, float* out) {
  constexpr int D = 16 * NV;
  const __mmask16 all = 0xFFFF;
  const int bs_shift = __builtin_ctzll(BS);  // block sizes are powers of two
  const int64_t bs_mask = BS - 1;
  // Blocks sit anywhere in the pool, so the hardware prefetcher loses the stream at
  // every block edge: fetch rows kAhead tokens (four 16-token blocks) early by hand. On an
  // AMD EPYC with AVX-512 BF16 (Zen 5), 64 rows of 100-800 scattered keys (bf16, head_dim
  // 64) read at 13-15 GB/s with 32-128 rows ahead, 10.6-11.2 without (the decode read-rate
  // case of python scripts/bench_cpu_attention.py).
  constexpr int64_t kAhead = 64;
  constexpr int64_t row_bytes = D * sizeof(T);
  auto prefetch_row = [&](const T* head, int64_t t) {
    const char* p = reinterpret_cast<const char*>(head + (table[t >> bs_shift] * BS + (t & bs_mask)) * D);
    for (int64_t off = 0; off < row_bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
  };
  auto prefetch_ahead = [&](int64_t t0) {
    for (int64_t t = t0 + kAhead; t < std::min(len, t0 + kAhead + 16); ++t) prefetch_row(k_head, t);
    if (t0 == 0)  // V is read after the softmax: start its first rows now.
      for (int64_t t = 0; t < std::min(len, kAhead); ++t) prefetch_row(v_head, t);
  };
#if defined(TIDE_DECODE_AMX)
  if constexpr (std::is_same_v<T, at::BFloat16> && NV % 2 == 0) {
    if (tide_decode_amx::usable(G, D, BS)) {  // on tiles, scores as [key][head]
      alignas(64) at::BFloat16 qt[16 * 128];
      tide_decode_amx::pack_q(qraw, G, D, qt);
      tide_decode_amx::configure(G);
      tide_decode_amx::scores<NV / 2>(qt, G, len, table, BS, k_head, scores, prefetch_ahead);
      float inv_sum[16];
      tide_decode_amx::softmax_flat(scores, G, len, scale, inv_sum);
      tide_decode_amx::pv(scores, G, len, table, BS, v_head, D, inv_sum, out, [&](int64_t t0) {
        for (int64_t t = t0 + kAhead; t < std::min(len, t0 + kAhead + 16); ++t) prefetch_row(v_head, t);
      });
      _tile_release();
      return;
    }
  }
#endif
  for (int64_t t0 = 0; t0 < len; t0 += 16) {
    const int64_t m = std::min<int64_t>(16, len - t0);
    prefetch_ahead(t0);
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, at::BFloat16> && NV % 2 == 0) {
      // bf16 K against the unrounded bf16 query: products are exact in fp32, so
      // VDPBF16PS needs no widening of K; the scale is applied to the sums.
      const T* rows[16];
      for (int64_t j = 0; j < m; ++j) {
        const int64_t t = t0 + j;
        rows[j] = k_head + (table[t >> bs_shift] * BS + (t & bs_mask)) * D;
      }
      const __m512 vscale = _mm512_set1_ps(scale);
      for (int64_t g = 0; g < G; ++g) {
        __m512bh qv[NV / 2];
        for (int v = 0; v < NV / 2; ++v) qv[v] = as_bh(_mm512_loadu_si512(qraw + g * D + 32 * v));
        __m512 part[16];
        for (int j = 0; j < 16; ++j) {
          if (j >= m) {
            part[j] = _mm512_setzero_ps();
            continue;
          }
          __m512 acc = _mm512_setzero_ps();
          for (int v = 0; v < NV / 2; ++v) acc = _mm512_dpbf16_ps(acc, qv[v], as_bh(_mm512_loadu_si512(rows[j] + 32 * v)));
          part[j] = acc;
        }
        _mm512_storeu_ps(scores + g * Lp + t0, _mm512_mul_ps(transpose_sum16(part), vscale));
      }
      continue;
    }
#endif
    for (int64_t j = 0; j < 16; ++j) {
      float* dst = kbuf + j * D;
      if (j < m) {
        const int64_t t = t0 + j;
        const T* src = k_head + (table[t >> bs_shift] * BS + (t & bs_mask)) * D;
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(dst + 16 * v, load16(src + 16 * v));
      } else {
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(dst + 16 * v, _mm512_setzero_ps());
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      __m512 qv[NV];
      for (int v = 0; v < NV; ++v) qv[v] = _mm512_loadu_ps(qf + g * D + 16 * v);
      __m512 part[16];
      for (int j = 0; j < 16; ++j) {
        __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kbuf + j * D));
        for (int v = 1; v < NV; ++v) acc = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(kbuf + j * D + 16 * v), acc);
        part[j] = acc;
      }
      _mm512_storeu_ps(scores + g * Lp + t0, transpose_sum16(part));
    }
  }
  // Softmax per query head over [0, len); lanes past len are ignored.
  std::vector<float> inv_sum(G);
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * Lp;
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < len; t += 16) {
      const __mmask16 k = len - t >= 16 ? all : static_cast<__mmask16>((1u << (len - t)) - 1);
      mx = _mm512_mask_max_ps(mx, k, mx, _mm512_loadu_ps(s + t));
    }
    const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; t += 16) {
      const __mmask16 k = len - t >= 16 ? all : static_cast<__mmask16>((1u << (len - t)) - 1);
      const __m512 e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), vmax)));
      _mm512_storeu_ps(s + t, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv_sum[g] = 1.f / _mm512_reduce_add_ps(sum);
  }
  // P.V, up to 16 / NV query heads at a time with their accumulators in registers.
  constexpr int HC = 16 / NV > 8 ? 8 : 16 / NV;
  for (int64_t g0 = 0; g0 < G;) {
    const int64_t left = G - g0;
    const int hn = left >= HC ? HC : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    const float* p = scores + g0 * Lp;
    float* o = out + g0 * D;
    switch (hn) {
      case 8: pv_heads<T, NV, (HC >= 8 ? 8 : 1)>(p, Lp, inv_sum.data() + g0, len, table, BS, v_head, o); break;
      case 4: pv_heads<T, NV, (HC >= 4 ? 4 : 1)>(p, Lp, inv_sum.data() + g0, len, table, BS, v_head, o); break;
      case 2: pv_heads<T, NV, (HC >= 2 ? 2 : 1)>(p, Lp, inv_sum.data() + g0, len, table, BS, v_head, o); break;
      default: pv_heads<T, NV, 1>(p, Lp, inv_sum.data() + g0, len, table, BS, v_head, o); break;
    }
    g0 += hn;
  }
}

}  // namespace
}  // namespace tide_avx512
#endif
