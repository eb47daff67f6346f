// CPU kernels for the engine's hot loops, registered as torch ops (namespace "tide").
//
//   tide::gemv_bf16(x, w, bias)  y = x w^T + b for a few rows of bf16 activations
//       (batch-1 to small-batch decode). Weight rows are streamed once with
//       AVX-512 BF16 dot products, two accumulation chains per row, fp32 sums.
//   tide::paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
//       one query token per row against its paged K/V, read in place from the block
//       pool (no gather copy); each (row, kv head) pair is one task, its query heads
//       (GQA group) share every K/V row read.
//
// Built on first use by kernels/cpu.py with -march=native; where AVX-512 BF16 is
// missing the GEMV is not offered (Python falls back), and attention uses a portable
// scalar loop.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

// ---------------------------------------------------------------- attention

template <typename T>
inline float to_float(T v) {
  return static_cast<float>(v);
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
#if defined(__AVX512BF16__)
inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }
#endif
inline __m512 load16(const at::BFloat16* p) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
#endif

#if defined(__AVX512F__)
// e^x for x <= 0 (softmax after subtracting the max): 2^n * e^r with |r| <= ln2/2 and
// a degree-6 Taylor polynomial, relative error about 1e-7.
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

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
  constexpr int64_t kAhead = 16;
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
  // every block edge: fetch rows kAhead tokens early by hand.
  constexpr int64_t kAhead = 16;
  constexpr int64_t row_bytes = D * sizeof(T);
  auto prefetch_row = [&](const T* head, int64_t t) {
    const char* p = reinterpret_cast<const char*>(head + (table[t >> bs_shift] * BS + (t & bs_mask)) * D);
    for (int64_t off = 0; off < row_bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
  };
  for (int64_t t0 = 0; t0 < len; t0 += 16) {
    const int64_t m = std::min<int64_t>(16, len - t0);
    for (int64_t t = t0 + kAhead; t < std::min(len, t0 + kAhead + 16); ++t) prefetch_row(k_head, t);
    if (t0 == 0)  // V is read after the softmax: start its first rows now.
      for (int64_t t = 0; t < std::min(len, kAhead); ++t) prefetch_row(v_head, t);
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
    TORCH_CHECK(lens[i] >= 1 && lens[i] <= max_blocks * BS, "context length ", lens[i], " of row ", i,
                " is outside 1..", max_blocks * BS);

  at::parallel_for(0, n * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), acc(G * D), scores, kbuf(16 * D);
    std::vector<T> qraw(G * D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / KVH, h = item % KVH;
      const int64_t len = lens[i];
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
#endif
      if (!done) decode_task_scalar<T>(qf.data(), G, D, len, table, BS, k_head, v_head, scores.data(), Lp, acc.data());
      for (int64_t g = 0; g < G; ++g) {
        T* dst = op + i * o_s0 + (h * G + g) * o_s1;
        for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(acc[g * D + d]);
      }
    }
  });
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

// ---------------------------------------------------------------- GEMV

#if defined(__AVX512BF16__)

// Rows [r0, r1) of y[M, N] = x[M, K] w[N, K]^T; K % 32 == 0.
template <int M>
void gemv_rows(const at::BFloat16* x, const at::BFloat16* w, const at::BFloat16* bias, at::BFloat16* y,
               int64_t N, int64_t K, int64_t r0, int64_t r1) {
  constexpr int R = M == 1 ? 8 : 4;
  int64_t n = r0;
  for (; n + R <= r1; n += R) {
    __m512 acc[M][R];
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
    const at::BFloat16* wr = w + n * K;
    for (int64_t k = 0; k < K; k += 32) {
      __m512i wv[R];
      for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_si512(wr + r * K + k);
      for (int m = 0; m < M; ++m) {
        const __m512bh xv = as_bh(_mm512_loadu_si512(x + m * K + k));
        for (int r = 0; r < R; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, as_bh(wv[r]));
      }
    }
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) {
        float s = _mm512_reduce_add_ps(acc[m][r]);
        if (bias) s += static_cast<float>(bias[n + r]);
        y[m * N + n + r] = at::BFloat16(s);
      }
  }
  for (; n < r1; ++n) {
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
      const __m512bh wv = as_bh(_mm512_loadu_si512(w + n * K + k));
      for (int m = 0; m < M; ++m) acc[m] = _mm512_dpbf16_ps(acc[m], as_bh(_mm512_loadu_si512(x + m * K + k)), wv);
    }
    for (int m = 0; m < M; ++m) {
      float s = _mm512_reduce_add_ps(acc[m]);
      if (bias) s += static_cast<float>(bias[n]);
      y[m * N + n] = at::BFloat16(s);
    }
  }
}
#endif

constexpr int64_t kMaxGemvRows = 4;

bool gemv_supported() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

at::Tensor gemv_bf16(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(gemv_supported(), "gemv_bf16 needs AVX-512 BF16");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "gemv_bf16 takes bfloat16");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K] and w [N, K] must agree on K");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= kMaxGemvRows, "gemv_bf16 takes 1..", kMaxGemvRows, " rows, got ",
              x.size(0));
  TORCH_CHECK(w.size(1) % 32 == 0, "gemv_bf16 needs K % 32 == 0, got ", w.size(1));
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  auto xc = x.contiguous();
  auto wc = w.contiguous();
  at::Tensor bc;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N && bias->scalar_type() == at::kBFloat16, "bias must be bfloat16 [N]");
    bc = bias->contiguous();
  }
  auto y = at::empty({M, N}, x.options());
#if defined(__AVX512BF16__)
  const auto* xp = xc.data_ptr<at::BFloat16>();
  const auto* wp = wc.data_ptr<at::BFloat16>();
  const auto* bp = bc.defined() ? bc.data_ptr<at::BFloat16>() : nullptr;
  auto* yp = y.data_ptr<at::BFloat16>();
  // Split rows in multiples of 8 so every chunk runs the wide inner loop.
  const int64_t units = (N + 7) / 8;
  at::parallel_for(0, units, 16, [&](int64_t u0, int64_t u1) {
    const int64_t r0 = u0 * 8, r1 = std::min(N, u1 * 8);
    switch (M) {
      case 1: gemv_rows<1>(xp, wp, bp, yp, N, K, r0, r1); break;
      case 2: gemv_rows<2>(xp, wp, bp, yp, N, K, r0, r1); break;
      case 3: gemv_rows<3>(xp, wp, bp, yp, N, K, r0, r1); break;
      default: gemv_rows<4>(xp, wp, bp, yp, N, K, r0, r1); break;
    }
  });
#endif
  return y;
}

int64_t gemv_max_rows() { return gemv_supported() ? kMaxGemvRows : 0; }

}  // namespace

TORCH_LIBRARY(tide, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
  m.def("gemv_bf16(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("gemv_max_rows() -> int", &gemv_max_rows);
}

TORCH_LIBRARY_IMPL(tide, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention);
  m.impl("gemv_bf16", &gemv_bf16);
}
