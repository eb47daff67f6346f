// CPU kernels for the engine's hot loops, registered as torch ops (namespace "tide").
//
//   tide::paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
//       one query token per row against its paged K/V, read in place from the block
//       pool (no gather copy); each (row, kv head) pair is one task, its query heads
//       (GQA group) share every K/V row read; tasks run longest context first.
//   Padding rows (a decode batch padded to a fixed size): a KV write to slot -1 is
//   skipped and a context of length 0 attends to nothing (zeros).
//
//   tide::write_kv_cache, and the schemas of the fused elementwise ops, whose kernels are
//   in cpu_elementwise.cpp.
// The small-batch projections are in cpu_gemv.cpp. Built on first use by kernels/cpu.py
// with -march=native; where AVX-512 BF16 is missing decode attention runs on AVX2 + FMA
// (decode_avx2.h) or, without those or at other head dims, a portable loop; bf16 Q.K and
// P.V run on AMX tiles where Linux grants them (decode_amx.h, decode_amx_pv.h).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <string>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "decode_amx_pv.h"
#include "decode_avx2.h"
#include "bf16_lanes.h"
#include "cpu_ops.h"
#include "longest_first.h"
#include "silu_avx512.h"

namespace {

// ---------------------------------------------------------------- attention

using namespace tide_lanes;

#if defined(__AVX512F__)
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
  constexpr int64_t kAhead = 64;  // as decode_task_avx512's K rows
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
void decode_task_avx512(const float* qf, const T* qraw, float scale, int64_t G, int64_t len, const int64_t* table,
                        int64_t BS, const T* k_head, const T* v_head, float* scores, int64_t Lp, float* kbuf,
                        float* out) {
  constexpr int D = 16 * NV;
  const __mmask16 all = 0xFFFF;
  const int bs_shift = __builtin_ctzll(BS);  // block sizes are powers of two
  const int64_t bs_mask = BS - 1;
  // Blocks sit anywhere in the pool, so the hardware prefetcher loses the stream at
  // every block edge: fetch rows kAhead tokens (four 16-token blocks) early by hand. On an
  // AMD EPYC with AVX-512 BF16 (Zen 5), 64 rows of 100-800 scattered keys, bf16, head_dim
  // 64, read 13.3-14.1 GB/s at 64 ahead, 12.1-12.4 at 16, 11.2-11.8 at 32, 10.9-11.0 at
  // 128 (a copy of scripts/bench_cpu_attention.py's decode read-rate case, builds alternated);
  // a later rerun with the distance a run-time switch put 32, 64 and 128 within 13.3-15.3
  // GB/s of each other and no prefetch at 10.6-11.2 (docs/benchmarks.md, session 26).
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
#endif

// Portable version of the same task (any head_dim): two passes over the context.
template <typename T>
void decode_task_scalar(const float* qf, int64_t G, int64_t D, int64_t len, const int64_t* table, int64_t BS,
                        const T* k_head, const T* v_head, float* scores, int64_t Lp, float* out) {
  const int bs_shift = __builtin_ctzll(BS);
  const int64_t bs_mask = BS - 1;
  for (int64_t t = 0; t < len; ++t) {
    const T* k = k_head + (table[t >> bs_shift] * BS + (t & bs_mask)) * D;
    for (int64_t g = 0; g < G; ++g) {
      float s = 0.f;
      for (int64_t d = 0; d < D; ++d) s += qf[g * D + d] * to_float(k[d]);
      scores[g * Lp + t] = s;
    }
  }
  std::fill(out, out + G * D, 0.f);
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * Lp;
    const float mx = *std::max_element(s, s + len);
    float sum = 0.f;
    for (int64_t t = 0; t < len; ++t) sum += (s[t] = std::exp(s[t] - mx));
    for (int64_t t = 0; t < len; ++t) {
      const T* v = v_head + (table[t >> bs_shift] * BS + (t & bs_mask)) * D;
      const float p = s[t] / sum;
      for (int64_t d = 0; d < D; ++d) out[g * D + d] += p * to_float(v[d]);
    }
  }
}

template <typename T>
void decode_attention_impl(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                           at::Tensor& out) {
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KVH = k_cache.size(0), NB = k_cache.size(1), BS = k_cache.size(2);
  const int64_t G = H / KVH;
  const int64_t q_s0 = q.stride(0), q_s1 = q.stride(1);
  const int64_t o_s0 = out.stride(0), o_s1 = out.stride(1);
  const int64_t max_blocks = block_tables.size(1);
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const float fscale = static_cast<float>(scale);
  TORCH_CHECK(BS > 0 && (BS & (BS - 1)) == 0, "block_size must be a power of two, got ", BS);
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(lens[i] >= 0 && lens[i] <= max_blocks * BS, "context length ", lens[i], " of row ", i,
                " is outside 0..", max_blocks * BS);

  struct Scratch {
    std::vector<float> qf, acc, scores, kbuf, inv_sum;
    std::vector<T> qraw;
  };
  auto make_scratch = [&] {
    return Scratch{std::vector<float>(G * D), std::vector<float>(G * D), {}, std::vector<float>(16 * D),
                   std::vector<float>(G), std::vector<T>(G * D)};
  };
  // One task per (row, kv head), longest context first (rows' lengths are heavy-tailed).
  tide_sched::longest_first(n * KVH, [&](int64_t item) { return int64_t{lens[item / KVH]}; }, make_scratch,
                            [&](int64_t item, Scratch& sc) {
      auto& [qf, acc, scores, kbuf, inv_sum, qraw] = sc;
      const int64_t i = item / KVH, h = item % KVH;
      const int64_t len = lens[i];
      if (len == 0) {  // a padding row attends to nothing: zeros
        for (int64_t g = 0; g < G; ++g) std::fill_n(op + i * o_s0 + (h * G + g) * o_s1, D, static_cast<T>(0.f));
        return;
      }
      const int64_t Lp = (len + 15) / 16 * 16;
      for (int64_t g = 0; g < G; ++g) {
        const T* src = qp + i * q_s0 + (h * G + g) * q_s1;
        for (int64_t d = 0; d < D; ++d) {
          qraw[g * D + d] = src[d];
          qf[g * D + d] = to_float(src[d]) * fscale;
        }
      }
      scores.resize(static_cast<size_t>(G * Lp));
      const int64_t* table = tables + i * max_blocks;
      const T* k_head = kp + h * NB * BS * D;
      const T* v_head = vp + h * NB * BS * D;
      bool done = false;
#if defined(__AVX512F__)
      done = true;
      switch (D) {
        case 16: decode_task_avx512<T, 1>(qf.data(), qraw.data(), fscale, G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), acc.data()); break;
        case 32: decode_task_avx512<T, 2>(qf.data(), qraw.data(), fscale, G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), acc.data()); break;
        case 64: decode_task_avx512<T, 4>(qf.data(), qraw.data(), fscale, G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), acc.data()); break;
        case 128: decode_task_avx512<T, 8>(qf.data(), qraw.data(), fscale, G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), acc.data()); break;
        default: done = false;
      }
#elif defined(__AVX2__) && defined(__FMA__)
      done = true;
      switch (D) {
        case 16: tide_avx2::decode_task<T, 2>(qf.data(), G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), inv_sum.data(), acc.data()); break;
        case 32: tide_avx2::decode_task<T, 4>(qf.data(), G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), inv_sum.data(), acc.data()); break;
        case 64: tide_avx2::decode_task<T, 8>(qf.data(), G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), inv_sum.data(), acc.data()); break;
        case 128: tide_avx2::decode_task<T, 16>(qf.data(), G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), inv_sum.data(), acc.data()); break;
        default: done = false;
      }
#endif
      if (!done) decode_task_scalar<T>(qf.data(), G, D, len, table, BS, k_head, v_head, scores.data(), Lp, acc.data());
      for (int64_t g = 0; g < G; ++g) {
        T* dst = op + i * o_s0 + (h * G + g) * o_s1;
        for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(acc[g * D + d]);
      }
  });
}

// The vector unit decode attention runs on for head_dim 16/32/64/128 (others: "scalar").
std::string decode_attention_isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "scalar";
#endif
}

// Whether bf16 decode attention runs Q.K and P.V on AMX tiles here (decode_amx.h: groups
// of 1-16 query heads dividing 16, head_dim 32/64/128, blocks of a multiple of 16 keys).
bool decode_attention_tiles() {
#if defined(TIDE_DECODE_AMX)
  return tide_decode_amx::usable(4, 64, 16);
#else
  return false;
#endif
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [n, heads, head_dim] with unit last stride");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "k_cache/v_cache must be contiguous [kv_heads, blocks, block_size, head_dim]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache shapes differ");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "q, k_cache and v_cache must share a dtype");
  TORCH_CHECK(q.size(2) == k_cache.size(3), "q head_dim ", q.size(2), " != cache head_dim ", k_cache.size(3));
  TORCH_CHECK(q.size(1) % k_cache.size(0) == 0, "heads ", q.size(1), " not a multiple of kv heads ",
              k_cache.size(0));
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous() && block_tables.dim() == 2 &&
                  block_tables.size(0) == q.size(0),
              "block_tables must be contiguous int64 [n, max_blocks]");
  TORCH_CHECK(context_lens.scalar_type() == at::kInt && context_lens.is_contiguous() &&
                  context_lens.numel() == q.size(0),
              "context_lens must be contiguous int32 [n]");
  auto out = at::empty(q.sizes(), q.options());
  if (q.scalar_type() == at::kBFloat16) {
    decode_attention_impl<at::BFloat16>(q, k_cache, v_cache, block_tables, context_lens, scale, out);
  } else if (q.scalar_type() == at::kFloat) {
    decode_attention_impl<float>(q, k_cache, v_cache, block_tables, context_lens, scale, out);
  } else {
    TORCH_CHECK(false, "paged_decode_attention supports float32 and bfloat16, got ", q.scalar_type());
  }
  return out;
}

// k_cache/v_cache [kv_heads, blocks, block_size, head_dim]: row t of key/value
// ([T, kv_heads, head_dim], unit last stride) goes to slot slot_mapping[t].
void write_kv_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                    const at::Tensor& slot_mapping) {
  TORCH_CHECK(key.dim() == 3 && key.stride(2) == 1 && value.sizes() == key.sizes() && value.stride(2) == 1,
              "write_kv_cache: key/value must be [T, kv_heads, head_dim] with unit last stride");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.size(0) == key.size(1) && k_cache.size(3) == key.size(2),
              "write_kv_cache: caches must be contiguous [kv_heads, blocks, block_size, head_dim] matching key");
  TORCH_CHECK(key.scalar_type() == k_cache.scalar_type() && value.scalar_type() == v_cache.scalar_type(),
              "write_kv_cache: dtypes differ");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                  slot_mapping.numel() == key.size(0),
              "write_kv_cache: slot_mapping must be contiguous int64 [T]");
  const int64_t T = key.size(0), H = key.size(1), D = key.size(2);
  const int64_t slots = k_cache.size(1) * k_cache.size(2);
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(slot[t] >= -1 && slot[t] < slots, "write_kv_cache: slot ", slot[t], " outside -1..", slots - 1);
  const int64_t bytes = D * key.element_size();
  const auto* kp = static_cast<const char*>(key.data_ptr());
  const auto* vp = static_cast<const char*>(value.data_ptr());
  auto* kc = static_cast<char*>(k_cache.data_ptr());
  auto* vc = static_cast<char*>(v_cache.data_ptr());
  const int64_t es = key.element_size();
  at::parallel_for(0, T, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H && slot[t] >= 0; ++h) {  // slot -1: a padding row, skipped
        const int64_t dst = (h * slots + slot[t]) * bytes;
        std::memcpy(kc + dst, kp + (t * key.stride(0) + h * key.stride(1)) * es, bytes);
        std::memcpy(vc + dst, vp + (t * value.stride(0) + h * value.stride(1)) * es, bytes);
      }
  });
}

}  // namespace

// The same kernels for cpu_step.cpp (cpu_ops.h).
namespace tide_ops {
void write_kv_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                    const at::Tensor& slot_mapping) {
  TIDE_RECORD("write_kv_cache");
  ::write_kv_cache(key, value, k_cache, v_cache, slot_mapping);
}
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TIDE_RECORD("paged_decode_attention");
  return ::paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale);
}
}  // namespace tide_ops

TORCH_LIBRARY(tide, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
  m.def("write_kv_cache(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("add_rms_norm_(Tensor(a!) hidden, Tensor delta, Tensor w, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("rotary_(Tensor(a!) x, Tensor positions, Tensor cos, Tensor sin, int heads, int head_dim) -> ()");
  m.def("decode_attention_isa() -> str", &decode_attention_isa);
  m.def("decode_attention_tiles() -> bool", &decode_attention_tiles);
}

TORCH_LIBRARY_IMPL(tide, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention);
  m.impl("write_kv_cache", &write_kv_cache);
}
