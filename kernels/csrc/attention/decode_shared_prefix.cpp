// Decode rows that share a cached prefix (a common system prompt), on AMX tiles or AVX-512
// BF16 dot products (attention/passes.h picks).
//
//   tide::decode_shared_prefix(q, k_cache, v_cache, block_tables, context_lens, shared, scale)
//       q [n, H, D] bf16, one query token per row; the first `shared` keys of every row are
//       the same cached blocks (a multiple of block_size, checked). Returns [n, H, D] bf16.
//
// The shared keys are packed once and attended by every row together, 16 (row, query head)
// pairs per task (online_softmax.h): for 64 rows sharing 1,024 keys each K/V block serves 16
// rows instead of one row's query group. Each row then continues its online softmax over
// its own keys, 16 at a time with bf16 dot products.

#include <torch/library.h>

#include "attention/passes.h"
#include "common/ops.h"

namespace {

using namespace tide_attn;

#if defined(TIDE_BF16_PAIRS)

// Continues one row's online softmax (maximum m, sum l, output orow) over its own keys
// [from, len) of the block table, 16 at a time: scores by bf16 dot products, one transpose.
void own_keys(const at::BFloat16* qrow, int64_t D, const at::BFloat16* k_head, const at::BFloat16* v_head,
              const int64_t* table, int64_t BS, int64_t from, int64_t len, float scale_log2, float& m, float& l,
              float* orow) {
  for (int64_t t0 = from; t0 < len; t0 += 16) {
    const int cnt = static_cast<int>(std::min<int64_t>(16, len - t0));
    int64_t off[16];
    __m512 part[16];
    for (int j = 0; j < 16; ++j) {
      part[j] = _mm512_setzero_ps();
      if (j >= cnt) continue;
      const int64_t t = t0 + j;
      off[j] = (table[t / BS] * BS + t % BS) * D;
      for (int64_t d = 0; d < D; d += 32)
        part[j] = _mm512_dpbf16_ps(part[j], (__m512bh)_mm512_loadu_si512(qrow + d),
                                   (__m512bh)_mm512_loadu_si512(k_head + off[j] + d));
    }
    const __mmask16 keep = cnt == 16 ? 0xFFFF : static_cast<__mmask16>((1u << cnt) - 1);
    const __m512 x = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), keep,
                                        _mm512_mul_ps(across_rows<Sum>(part), _mm512_set1_ps(scale_log2)));
    const float block_max = _mm512_reduce_max_ps(x);
    if (block_max > m) {  // rare once the shared keys are in: move the maximum exactly
      const float alpha = std::exp2(m - block_max);
      l *= alpha;
      for (int64_t d = 0; d < D; d += 16)
        _mm512_storeu_ps(orow + d, _mm512_mul_ps(_mm512_loadu_ps(orow + d), _mm512_set1_ps(alpha)));
      m = block_max;
    }
    const __m512 p = _mm512_maskz_mov_ps(keep, exp2_neg(_mm512_sub_ps(x, _mm512_set1_ps(m))));
    l += _mm512_reduce_add_ps(p);
    alignas(64) float pa[16];
    _mm512_store_ps(pa, p);
    for (int j = 0; j < cnt; ++j) {
      const __m512 pj = _mm512_set1_ps(pa[j]);
      for (int64_t d = 0; d < D; d += 16) {
        const __m512 v = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(v_head + off[j] + d))), 16));
        _mm512_storeu_ps(orow + d, _mm512_fmadd_ps(pj, v, _mm512_loadu_ps(orow + d)));
      }
    }
  }
}

// Decode rows whose first `shared` keys are the same cached blocks (a shared system prompt):
// the shared keys in one pass for every row at once, then each row's own keys one by one.
template <class Pass>
void attend_shared_decode(const at::Tensor& q, const Packed& kv, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const int64_t* tables, int64_t max_blocks, const int32_t* lens, int64_t shared, float scale,
                          at::Tensor& out) {
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(0), G = H / KVH;
  const int64_t NB = k_cache.size(1), BS = k_cache.size(2);
  const TaskRows rows{q.data_ptr<at::BFloat16>(), q.stride(0), q.stride(1), G, n * G, D};
  const auto* kc = k_cache.data_ptr<at::BFloat16>();
  const auto* vc = v_cache.data_ptr<at::BFloat16>();
  auto* op = out.data_ptr<at::BFloat16>();
  const float scale_log2 = scale * 1.4426950408889634f;
  for_each_task<Pass>(rows, KVH, [&](int64_t h, int64_t r0, int real, TaskBuffers& b) {
    for (int r = 0; r < kRows; ++r) b.st.last_key[r] = static_cast<int32_t>(shared - 1);
    attend_pass<Pass>(b.qt.data(), D, kv, h, (shared + kKeys - 1) / kKeys, scale_log2, b.st, b.o.data(), b.s.data(),
                      b.pb.data());
    alignas(64) float m[kRows], l[kRows];
    _mm512_store_ps(m, b.st.m);
    _mm512_store_ps(l, b.st.l);
    for (int r = 0; r < real; ++r) {
      const int64_t i = (r0 + r) / G, g = (r0 + r) % G;
      const int64_t* table = tables + i * max_blocks;
      float* orow = b.o.data() + r * D;
      const at::BFloat16* qrow = b.qt.data() + r * D;
      float mr = m[r], lr = l[r];
      own_keys(qrow, D, kc + h * NB * BS * D, vc + h * NB * BS * D, table, BS, shared, lens[i], scale_log2, mr, lr,
               orow);
      write_row(orow, lr, D, op + i * out.stride(0) + (h * G + g) * out.stride(1));
    }
  });
}

#endif  // TIDE_BF16_PAIRS

at::Tensor decode_shared_prefix(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t shared,
                                double scale) {
  TORCH_CHECK(pass_isa()[0] != '\0', "decode_shared_prefix: this build or CPU has neither AMX nor AVX-512 BF16");
  check_inputs("decode_shared_prefix", q, k_cache, v_cache);
  const int64_t n = q.size(0), BS = k_cache.size(2);
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous() && block_tables.dim() == 2 &&
                  block_tables.size(0) == n,
              "decode_shared_prefix: block_tables must be contiguous int64 [n, max_blocks]");
  TORCH_CHECK(context_lens.scalar_type() == at::kInt && context_lens.is_contiguous() && context_lens.numel() == n,
              "decode_shared_prefix: context_lens must be contiguous int32 [n]");
  TORCH_CHECK(n > 0 && shared > 0 && shared % BS == 0 && shared / BS <= block_tables.size(1),
              "decode_shared_prefix: shared must be a positive multiple of block_size within the tables, got ", shared);
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  const int64_t max_blocks = block_tables.size(1);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(lens[i] >= shared && lens[i] <= max_blocks * BS, "decode_shared_prefix: row ", i, " has context ",
                lens[i], ", outside ", shared, "..", max_blocks * BS);
    TORCH_CHECK(std::equal(tables, tables + shared / BS, tables + i * max_blocks),
                "decode_shared_prefix: row ", i, " does not share the first ", shared / BS, " blocks of row 0");
  }
  at::Tensor out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
#if defined(TIDE_BF16_PAIRS)
  const Packed kv = pack_kv(k_cache, v_cache, tables, shared);
  const float fscale = static_cast<float>(scale);
  with_pass(q.size(2), [&](auto pass) {
    attend_shared_decode<decltype(pass)>(q, kv, k_cache, v_cache, tables, max_blocks, lens, shared, fscale, out);
  });
#endif
  return out;
}

}  // namespace

namespace tide_ops {  // for step/step_layers.cpp (common/ops.h)
at::Tensor decode_shared_prefix(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t shared,
                                double scale) {
  TIDE_RECORD("decode_shared_prefix");
  return ::decode_shared_prefix(q, k_cache, v_cache, block_tables, context_lens, shared, scale);
}
}  // namespace tide_ops

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def("decode_shared_prefix(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, "
        "int shared, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(tide, CPU, m) { m.impl("decode_shared_prefix", &decode_shared_prefix); }
