// Paged decode attention (op decode_attention: cpp-amx, cpp-avx512bf16, cpp-avx512, cpp-avx2, cpp).
//
//   tide::paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
//       one query token per row against its paged K/V, read in place from the block
//       pool (no gather copy); each (row, kv head) pair is one task, its query heads
//       (GQA group) share every K/V row read; tasks run longest context first.
//   A padding row (a decode batch padded to a fixed size) has context length 0 and
//   attends to nothing (zeros).
//   tide::decode_attention_isa() -> "avx512" | "avx2" | "scalar", tide::decode_attention_tiles().
//
// The task per ISA, chosen at build time (-march=native): decode_avx512.h (bf16 Q.K and P.V
// on AMX tiles where Linux grants them: decode_amx_qk.h, decode_amx_pv.h), decode_avx2.h;
// other head dims and CPUs without either take the portable loop below.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <string>
#include <vector>

#include "attention/decode_amx_qk.h"
#include "attention/decode_avx2.h"
#include "attention/decode_avx512.h"
#include "common/bf16_lanes.h"
#include "common/longest_first.h"
#include "common/ops.h"

namespace {

using namespace tide_lanes;

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
        case 16: tide_avx512::decode_task<T, 1>(qf.data(), qraw.data(), fscale, G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), acc.data()); break;
        case 32: tide_avx512::decode_task<T, 2>(qf.data(), qraw.data(), fscale, G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), acc.data()); break;
        case 64: tide_avx512::decode_task<T, 4>(qf.data(), qraw.data(), fscale, G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), acc.data()); break;
        case 128: tide_avx512::decode_task<T, 8>(qf.data(), qraw.data(), fscale, G, len, table, BS, k_head, v_head, scores.data(), Lp, kbuf.data(), acc.data()); break;
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

// Whether bf16 decode attention runs Q.K and P.V on AMX tiles here (decode_amx_qk.h: groups
// of 1-16 query heads dividing 16, head_dim 32/64/128, blocks of a multiple of 16 keys).
bool decode_attention_tiles() {
#if defined(TIDE_DECODE_AMX)
  return tide_decode_amx::usable(4, 64, 16);
#else
  return false;
#endif
}

// On: the AVX-512 BF16 path even where tiles would run (kernels/dispatch.py sets it from
// the table: decode_attention=cpp-avx512bf16 on cpu-amx).
void decode_attention_prefer_vector(bool enabled) {
#if defined(TIDE_DECODE_AMX)
  tide_decode_amx::prefer_vector().store(enabled);
#else
  (void)enabled;
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

}  // namespace

// The same kernel for step/step_layers.cpp (common/ops.h).
namespace tide_ops {
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TIDE_RECORD("paged_decode_attention");
  return ::paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale);
}
}  // namespace tide_ops

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
  m.def("decode_attention_isa() -> str", &decode_attention_isa);
  m.def("decode_attention_tiles() -> bool", &decode_attention_tiles);
  m.def("decode_attention_prefer_vector(bool enabled) -> ()", &decode_attention_prefer_vector);
}

TORCH_LIBRARY_IMPL(tide, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }
