// Decode attention for one (row, kv head) task on AVX2 + FMA, for CPUs without AVX-512
// (AMD Zen 2/3, older Intel): what decode.cpp's decode_attention_impl runs there for
// head_dim 16, 32, 64 and 128. The same three passes as the AVX-512 task: scores 8 tokens
// at a time (one horizontal reduction for eight dot products), a vectorised softmax, and
// P.V with the accumulators in registers. K and V rows are read in place from the block
// pool (bf16 rows widened on load), fetched a few tokens ahead by hand since the blocks sit
// anywhere in the pool.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace tide_avx2 {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// e^x for x <= 0 (softmax arguments): 2^n * e^r with |r| <= ln2/2, a degree-6 Taylor
// polynomial (relative error about 1e-7); inputs below -87 give e^-87.
inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.f / 720.f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2n));
}

// Lane j of the result is the sum of v[j]'s eight lanes.
__attribute__((always_inline)) inline __m256 transpose_sum8(const __m256* v) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline float hmax(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

// Lanes [0, n) set, n in 0..8.
inline __m256 lanes_below(int64_t n) {
  const __m256 iota = _mm256_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f);
  return _mm256_cmp_ps(iota, _mm256_set1_ps(static_cast<float>(n)), _CMP_LT_OQ);
}

template <typename T>
inline const T* row_at(const T* head, const int64_t* table, int64_t t, int bs_shift, int64_t BS, int64_t D) {
  return head + (table[t >> bs_shift] * BS + (t & (BS - 1))) * D;
}

// out[h] = inv_sum[h] * sum_t p[h, t] V[t] for HN query heads, CW vectors of the head's
// columns at a time (HN * CW = 8 accumulators in registers, one V load feeding HN FMAs).
template <typename T, int NV, int HN>
void pv_heads(const float* p, int64_t Lp, const float* inv_sum, int64_t len, const int64_t* table, int64_t BS,
              const T* v_head, float* out) {
  constexpr int D = 8 * NV;
  constexpr int CW = 8 / HN < NV ? 8 / HN : NV;
  constexpr int64_t kAhead = 16;
  const int bs_shift = __builtin_ctzll(BS);
  for (int c0 = 0; c0 < NV; c0 += CW) {
    __m256 acc[HN][CW];
    for (int h = 0; h < HN; ++h)
      for (int c = 0; c < CW; ++c) acc[h][c] = _mm256_setzero_ps();
    for (int64_t t = 0; t < len; ++t) {
      if (t + kAhead < len)
        _mm_prefetch(reinterpret_cast<const char*>(row_at(v_head, table, t + kAhead, bs_shift, BS, D) + 8 * c0),
                     _MM_HINT_T0);
      const T* src = row_at(v_head, table, t, bs_shift, BS, D) + 8 * c0;
      for (int c = 0; c < CW; ++c) {
        const __m256 vv = load8(src + 8 * c);
        for (int h = 0; h < HN; ++h) acc[h][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + h * Lp + t), vv, acc[h][c]);
      }
    }
    for (int h = 0; h < HN; ++h) {
      const __m256 scale = _mm256_set1_ps(inv_sum[h]);
      for (int c = 0; c < CW; ++c) _mm256_storeu_ps(out + h * D + 8 * (c0 + c), _mm256_mul_ps(acc[h][c], scale));
    }
  }
}

// One (row, kv head) task with head_dim = 8 * NV: qf is the task's G query heads in fp32,
// already scaled; scores has Lp >= len (a multiple of 16) floats per head; kbuf holds
// 8 * D floats; out gets the G heads' outputs in fp32.
template <typename T, int NV>
void decode_task(const float* qf, int64_t G, int64_t len, const int64_t* table, int64_t BS, const T* k_head,
                 const T* v_head, float* scores, int64_t Lp, float* kbuf, float* inv_sum, float* out) {
  constexpr int D = 8 * NV;
  constexpr int64_t kAhead = 16;
  const int bs_shift = __builtin_ctzll(BS);  // block sizes are powers of two
  for (int64_t t0 = 0; t0 < len; t0 += 8) {
    const int64_t m = std::min<int64_t>(8, len - t0);
    for (int64_t t = t0 + kAhead; t < std::min(len, t0 + kAhead + 8); ++t) {
      const char* pf = reinterpret_cast<const char*>(row_at(k_head, table, t, bs_shift, BS, D));
      for (int64_t off = 0; off < static_cast<int64_t>(D * sizeof(T)); off += 64) _mm_prefetch(pf + off, _MM_HINT_T0);
    }
    // The eight rows in fp32: float rows are read in place, bf16 rows widened once into
    // kbuf for all G heads. Rows past len repeat the first (their scores are ignored).
    const float* rows[8];
    for (int64_t j = 0; j < 8; ++j) {
      const T* src = row_at(k_head, table, t0 + (j < m ? j : 0), bs_shift, BS, D);
      if constexpr (std::is_same_v<T, float>) {
        rows[j] = src;
      } else {
        for (int v = 0; v < NV; ++v) _mm256_storeu_ps(kbuf + j * D + 8 * v, load8(src + 8 * v));
        rows[j] = kbuf + j * D;
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      const float* q = qf + g * D;
      __m256 part[8];
      for (int j = 0; j < 8; ++j) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(rows[j]));
        for (int v = 1; v < NV; ++v) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * v), _mm256_loadu_ps(rows[j] + 8 * v), acc);
        part[j] = acc;
      }
      _mm256_storeu_ps(scores + g * Lp + t0, transpose_sum8(part));
    }
  }
  // Softmax per query head over [0, len); lanes past len are masked out.
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * Lp;
    __m256 mx = neg_inf;
    for (int64_t t = 0; t < len; t += 8)
      mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(s + t), lanes_below(len - t)));
    const __m256 vmax = _mm256_set1_ps(hmax(mx));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < len; t += 8) {
      const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmax)), lanes_below(len - t));
      _mm256_storeu_ps(s + t, e);
      sum = _mm256_add_ps(sum, e);
    }
    inv_sum[g] = 1.f / hsum(sum);
  }
  for (int64_t g0 = 0; g0 < G;) {
    const int64_t left = G - g0;
    const int hn = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    const float* p = scores + g0 * Lp;
    float* o = out + g0 * D;
    switch (hn) {
      case 8: pv_heads<T, NV, 8>(p, Lp, inv_sum + g0, len, table, BS, v_head, o); break;
      case 4: pv_heads<T, NV, 4>(p, Lp, inv_sum + g0, len, table, BS, v_head, o); break;
      case 2: pv_heads<T, NV, 2>(p, Lp, inv_sum + g0, len, table, BS, v_head, o); break;
      default: pv_heads<T, NV, 1>(p, Lp, inv_sum + g0, len, table, BS, v_head, o); break;
    }
    g0 += hn;
  }
}

}  // namespace tide_avx2
#endif
