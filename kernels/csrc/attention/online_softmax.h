// Attention on bf16 pairs, part 2: the online softmax that both passes share. A task is 16
// (position or decode row, query head) rows of one KV head, so every K/V block read serves
// 16 rows; per 64 keys: S = Q K^T (the pass's multiply), a softmax step here in AVX-512
// (fp32, base 2, the maximum moved lazily), then P (bf16) V accumulated by the pass.
//
// A pass (pass_amx.h: AMX tiles; pass_avx512_bf16.h: vdpbf16ps in registers) is a type
// with start / scores / rescale / accumulate / finish and a per-thread Thread guard;
// attend_pass<Pass> drives it over a task's key blocks.
#pragma once

#include "attention/kv_pack_bf16.h"

namespace tide_attn {

#if defined(TIDE_BF16_PAIRS)

// 2^x for x <= 0: 2^round(x) times a cubic in the rest, relative error about 1e-4 (the
// probabilities are rounded to bf16, 4e-3, anyway). x = -inf gives NaN: mask those lanes.
inline __m512 exp2_neg(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);  // [-0.5, 0.5]
  __m512 p = _mm512_set1_ps(5.5504109e-2f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022651e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// Lane r of each vector is query row r of the task.
struct RowState {
  __m512 m;  // the running maximum (scaled, base 2) the probabilities are taken against
  __m512 l;  // sum of probabilities
  int32_t last_key[kRows];  // the last key each row sees
};

struct Sum {
  static __m512 op(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
};
struct Max {
  static __m512 op(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
};

// Lane t: v[t]'s lanes reduced by Op (a transpose folded into the reduction).
template <typename Op>
inline __m512 across_rows(const __m512* v) {
  __m512 r[8], s[4];
  for (int i = 0; i < 8; ++i)
    r[i] = Op::op(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int j = 0; j < 4; ++j)
    s[j] = Op::op(_mm512_shuffle_ps(r[2 * j], r[2 * j + 1], 0x44), _mm512_shuffle_ps(r[2 * j], r[2 * j + 1], 0xEE));
  const __m512 t0 = Op::op(_mm512_shuffle_f32x4(s[0], s[1], 0x88), _mm512_shuffle_f32x4(s[0], s[1], 0xDD));
  const __m512 t1 = Op::op(_mm512_shuffle_f32x4(s[2], s[3], 0x88), _mm512_shuffle_f32x4(s[2], s[3], 0xDD));
  return Op::op(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD));
}

inline __mmask16 visible(int64_t key0, int32_t last_key) {
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i key = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int>(key0)));
  return _mm512_cmple_epi32_mask(key, _mm512_set1_epi32(last_key));
}

// A row's maximum moves only when the block's exceeds it by more than this (base 2): the
// probabilities stay below 2^8 and the output is rescaled a few times per row, not per block.
constexpr float kSlack = 8.f;

// One softmax step over a 64-key block: scores s (16 x 64, unscaled) -> probabilities pb
// (bf16, 16 x 64). Returns the rows whose maximum moved, with their factors in alpha.
inline __mmask16 softmax_step(const float* s, at::BFloat16* pb, int64_t key0, bool mask, float scale_log2, RowState& st,
                       __m512& alpha) {
  __m512 row_max[kRows];
  for (int r = 0; r < kRows; ++r) {
    __m512 x[4];
    for (int c = 0; c < 4; ++c) {
      x[c] = _mm512_loadu_ps(s + r * kKeys + 16 * c);
      if (mask) x[c] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), visible(key0 + 16 * c, st.last_key[r]), x[c]);
    }
    row_max[r] = _mm512_max_ps(_mm512_max_ps(x[0], x[1]), _mm512_max_ps(x[2], x[3]));
  }
  const __m512 bmax = _mm512_mul_ps(across_rows<Max>(row_max), _mm512_set1_ps(scale_log2));
  const __mmask16 moved = _mm512_cmp_ps_mask(bmax, _mm512_add_ps(st.m, _mm512_set1_ps(kSlack)), _CMP_GT_OQ);
  if (moved) {
    const __m512 m_new = _mm512_mask_mov_ps(st.m, moved, bmax);
    // 0 where m was -inf (the first block): clamped, as exp2_neg takes no -inf.
    alpha = exp2_neg(_mm512_max_ps(_mm512_sub_ps(st.m, m_new), _mm512_set1_ps(-150.f)));
    st.l = _mm512_mul_ps(st.l, alpha);
    st.m = m_new;
  }
  alignas(64) float m[kRows];
  _mm512_store_ps(m, st.m);
  __m512 sums[kRows];
  const __m512 c = _mm512_set1_ps(scale_log2);
  for (int r = 0; r < kRows; ++r) {
    const __m512 neg_m = _mm512_set1_ps(-m[r]);
    __m512 sum = _mm512_setzero_ps();
    for (int cc = 0; cc < 4; cc += 2) {
      __m512 p0 = exp2_neg(_mm512_fmadd_ps(_mm512_loadu_ps(s + r * kKeys + 16 * cc), c, neg_m));
      __m512 p1 = exp2_neg(_mm512_fmadd_ps(_mm512_loadu_ps(s + r * kKeys + 16 * cc + 16), c, neg_m));
      if (mask) {
        p0 = _mm512_maskz_mov_ps(visible(key0 + 16 * cc, st.last_key[r]), p0);
        p1 = _mm512_maskz_mov_ps(visible(key0 + 16 * cc + 16, st.last_key[r]), p1);
      }
      sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
      _mm512_storeu_si512(pb + r * kKeys + 16 * cc, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    }
    sums[r] = sum;
  }
  st.l = _mm512_add_ps(st.l, across_rows<Sum>(sums));
  return moved;
}

// Multiplies output row r (16 x D floats) by lane r of alpha, for the rows in `rows`.
inline void rescale_rows(float* o, int64_t D, __mmask16 rows, __m512 alpha) {
  alignas(64) float a[kRows];
  _mm512_store_ps(a, alpha);
  for (int r = 0; r < kRows; ++r) {
    if (!((rows >> r) & 1)) continue;
    const __m512 f = _mm512_set1_ps(a[r]);
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(o + r * D + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * D + d), f));
  }
}

// Rows of a task: (position or decode row i, query head g) pairs of KV head h, r = i * G + g.
struct TaskRows {
  const at::BFloat16* q;
  int64_t qs0, qs1, G, R, D;
  // Copies the task's query rows into qt (rows past R: zeros) and returns how many are real.
  int load(int64_t h, int64_t r0, at::BFloat16* qt) const {
    for (int r = 0; r < kRows; ++r) {
      if (r0 + r < R) {
        const int64_t i = (r0 + r) / G, g = (r0 + r) % G;
        std::memcpy(qt + r * D, q + i * qs0 + (h * G + g) * qs1, D * sizeof(at::BFloat16));
      } else {
        std::memset(qt + r * D, 0, D * sizeof(at::BFloat16));
      }
    }
    return static_cast<int>(std::min<int64_t>(kRows, R - r0));
  }
};

// out row = o row / l, rounded to bf16.
inline void write_row(const float* o, float l, int64_t D, at::BFloat16* dst) {
  const __m512 inv = _mm512_set1_ps(1.f / l);
  for (int64_t d = 0; d < D; d += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(o + d), inv);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), (__m256i)_mm512_cvtneps_pbh(v));
  }
}

// One task's rows against key blocks [0, kb_end) of the packed K/V: the output rows are
// left unnormalised in o (16 x D), the running maximum and sum in st.
template <class Pass>
void attend_pass(const at::BFloat16* qt, int64_t D, const Packed& kv, int64_t h, int64_t kb_end, float scale_log2,
                 RowState& st, float* o, float* s, at::BFloat16* pb) {
  st.m = _mm512_set1_ps(-INFINITY);
  st.l = _mm512_setzero_ps();
  Pass::start(o, D);
  const int64_t first_last = st.last_key[0];
  for (int64_t kb = 0; kb < kb_end; ++kb) {
    Pass::scores(qt, D, kv, h, kb, s);
    __m512 alpha;
    const bool mask = (kb + 1) * kKeys - 1 > first_last;
    const __mmask16 moved = softmax_step(s, pb, kb * kKeys, mask, scale_log2, st, alpha);
    if (moved && kb > 0) Pass::rescale(o, D, moved, alpha);
    Pass::accumulate(o, D, pb, kv, h, kb);
  }
  Pass::finish(o, D);
}

// One thread's working set for its tasks: query rows, block scores and probabilities, the
// output rows and the softmax state.
struct TaskBuffers {
  std::vector<at::BFloat16> qt, pb;
  std::vector<float> s, o;
  RowState st;
  explicit TaskBuffers(int64_t D) : qt(kRows * D), pb(kRows * kKeys), s(kRows * kKeys), o(kRows * D) {}
};

// Runs body(h, r0, real, buffers) for every task (16 query rows of one KV head, rows r0..)
// on the thread pool, the task's query rows loaded into buffers.qt; every thread holds the
// pass's per-thread state (the AMX tile configuration) while it runs tasks.
template <class Pass, class Body>
void for_each_task(const TaskRows& rows, int64_t KVH, Body&& body) {
  const int64_t tasks = (rows.R + kRows - 1) / kRows;
  at::parallel_for(0, KVH * tasks, 1, [&](int64_t begin, int64_t end) {
    const typename Pass::Thread thread;
    TaskBuffers b(rows.D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / tasks, r0 = (item % tasks) * kRows;
      body(h, r0, rows.load(h, r0, b.qt.data()), b);
    }
  });
}

#endif  // TIDE_BF16_PAIRS

}  // namespace tide_attn
