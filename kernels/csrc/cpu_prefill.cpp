// Prefill attention on bf16 pairs: a chunk of query tokens against its paged K/V, on AMX
// tiles or AVX-512 BF16 dot products (attention_passes.h picks).
//
//   tide::prefill_attention(q, k_cache, v_cache, block_table, start_pos, scale)
//       q [L, H, D] bf16 (any row and head strides) at positions start_pos .. start_pos+L-1
//       of one sequence; its K/V are already in the cache (the step writes them first) and
//       are read through block_table. Query i sees keys 0 ..= start_pos + i. Returns
//       [L, H, D] bf16.
//   tide::prefill_attention_supported() -> bool: a pass runs here (also gates
//       tide::decode_shared_prefix, cpu_shared_decode.cpp).
//   tide::attention_pass_isa() -> str: "amx", "avx512_bf16" or "".
//   tide::attention_pass_prefer_vector(bool): the AVX-512 BF16 pass even where tiles run.
//
// The chunk's K/V are packed once (kv_pack_bf16.h); each task of 16 (position, query head)
// rows runs the key blocks up to its last row's last visible key (online_softmax.h), so
// blocks past the diagonal are skipped and only blocks crossing it are masked.

#include <torch/library.h>

#include <string>

#include "attention_passes.h"

namespace {

using namespace tide_attn;

#if defined(TIDE_BF16_PAIRS)

template <class Pass>
void attend_chunk(const at::Tensor& q, const Packed& kv, int64_t KVH, int64_t start, float scale, at::Tensor& out) {
  const int64_t L = q.size(0), H = q.size(1), D = q.size(2), G = H / KVH;
  const TaskRows rows{q.data_ptr<at::BFloat16>(), q.stride(0), q.stride(1), G, L * G, D};
  auto* op = out.data_ptr<at::BFloat16>();
  const float scale_log2 = scale * 1.4426950408889634f;
  for_each_task<Pass>(rows, KVH, [&](int64_t h, int64_t r0, int real, TaskBuffers& b) {
    // Query i sees keys ..= start + i; rows past the end see what the last real one sees.
    for (int r = 0; r < kRows; ++r) b.st.last_key[r] = static_cast<int32_t>(start + (r0 + std::min(r, real - 1)) / G);
    attend_pass<Pass>(b.qt.data(), D, kv, h, b.st.last_key[kRows - 1] / kKeys + 1, scale_log2, b.st, b.o.data(),
                      b.s.data(), b.pb.data());
    alignas(64) float l[kRows];
    _mm512_store_ps(l, b.st.l);
    for (int r = 0; r < real; ++r) {
      const int64_t i = (r0 + r) / G, g = (r0 + r) % G;
      write_row(b.o.data() + r * D, l[r], D, op + i * out.stride(0) + (h * G + g) * out.stride(1));
    }
  });
}

#endif  // TIDE_BF16_PAIRS

bool prefill_attention_supported() { return pass_isa()[0] != '\0'; }

std::string attention_pass_isa() { return pass_isa(); }

void attention_pass_prefer_vector(bool enabled) { prefer_vector().store(enabled); }

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& block_table, int64_t start_pos, double scale) {
  TORCH_CHECK(prefill_attention_supported(), "prefill_attention: this build or CPU has neither AMX nor AVX-512 BF16");
  check_inputs("prefill_attention", q, k_cache, v_cache);
  const int64_t L = q.size(0), KVH = k_cache.size(0), BS = k_cache.size(2);
  TORCH_CHECK(block_table.scalar_type() == at::kLong && block_table.is_contiguous(),
              "prefill_attention: block_table int64, contiguous");
  const int64_t ctx = start_pos + L;
  TORCH_CHECK(start_pos >= 0 && block_table.numel() * BS >= ctx, "prefill_attention: block_table covers ",
              block_table.numel() * BS, " tokens, the chunk needs ", ctx);
  at::Tensor out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
#if defined(TIDE_BF16_PAIRS)
  if (L == 0) return out;
  const Packed kv = pack_kv(k_cache, v_cache, block_table.data_ptr<int64_t>(), ctx);
  const float fscale = static_cast<float>(scale);
  with_pass(q.size(2), [&](auto pass) { attend_chunk<decltype(pass)>(q, kv, KVH, start_pos, fscale, out); });
#endif
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def("prefill_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, int start_pos, "
        "float scale) -> Tensor");
  m.def("prefill_attention_supported() -> bool", &prefill_attention_supported);
  m.def("attention_pass_isa() -> str", &attention_pass_isa);
  m.def("attention_pass_prefer_vector(bool enabled) -> ()", &attention_pass_prefer_vector);
}

TORCH_LIBRARY_IMPL(tide, CPU, m) { m.impl("prefill_attention", &prefill_attention); }
