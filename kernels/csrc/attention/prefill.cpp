// Prefill attention on bf16 pairs: a chunk of query tokens against its paged K/V, on AMX
// tiles or AVX-512 BF16 dot products (attention/passes.h picks).
//
//   tide::prefill_attention(q, k_cache, v_cache, block_table, start_pos, scale)
//       q [L, H, D] bf16 (any row and head strides) at positions start_pos .. start_pos+L-1
//       of one sequence; its K/V are already in the cache (the step writes them first) and
//       are read through block_table. Query i sees keys 0 ..= start_pos + i. Returns
//       [L, H, D] bf16.
//   tide::prefill_attention_varlen(q, k_cache, v_cache, query_start, start_pos, block_tables,
//                                  first_row, scale, out)
//       every prefill chunk of a step in one call, written into out in place: chunk p's
//       rows are first_row + query_start[p] .. first_row + query_start[p + 1] of q (int32
//       [P + 1]), at positions start_pos[p] .. (int32 [P]), read through block_tables[p]
//       (int64 [P, width]). A block of 64 keys that several chunks read whole through the
//       same cache rows (a shared system prompt) is packed once for all of them.
//   tide::prefill_attention_supported() -> bool: a pass runs here (also gates
//       tide::decode_shared_prefix, decode_shared_prefix.cpp).
//   tide::attention_pass_isa() -> str: "amx", "avx512_bf16" or "".
//   tide::attention_pass_prefer_vector(bool): the AVX-512 BF16 pass even where tiles run.
//
// The chunk's K/V are packed once (kv_pack_bf16.h); each task of 16 (position, query head)
// rows runs the key blocks up to its last row's last visible key (online_softmax.h), so
// blocks past the diagonal are skipped and only blocks crossing it are masked.

#include <torch/library.h>

#include <array>
#include <map>
#include <string>
#include <vector>

#include "attention/passes.h"
#include "common/ops.h"

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

// One call for every chunk of a step (see the top). Identical whole key blocks (the same
// cache rows in the same order) share a packed slot.
void prefill_attention_varlen(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& query_start, const at::Tensor& start_pos,
                              const at::Tensor& block_tables, int64_t first_row, double scale, at::Tensor& out) {
  TORCH_CHECK(prefill_attention_supported(),
              "prefill_attention_varlen: this build or CPU has neither AMX nor AVX-512 BF16");
  check_inputs("prefill_attention_varlen", q, k_cache, v_cache);
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == at::kBFloat16 && out.stride(2) == 1,
              "prefill_attention_varlen: out must be bf16 shaped like q with unit last stride");
  TORCH_CHECK(query_start.scalar_type() == at::kInt && query_start.is_contiguous() && query_start.dim() == 1 &&
                  start_pos.scalar_type() == at::kInt && start_pos.is_contiguous() &&
                  start_pos.numel() + 1 == query_start.numel(),
              "prefill_attention_varlen: query_start int32 [P + 1], start_pos int32 [P]");
  const int64_t P = start_pos.numel(), BS = k_cache.size(2);
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous() && block_tables.dim() == 2 &&
                  block_tables.size(0) == P,
              "prefill_attention_varlen: block_tables int64 [P, width], contiguous");
  const int32_t* qs = query_start.data_ptr<int32_t>();
  const int32_t* sp = start_pos.data_ptr<int32_t>();
  const int64_t width = block_tables.size(1);
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  TORCH_CHECK(qs[0] == 0 && first_row >= 0 && first_row + qs[P] <= q.size(0),
              "prefill_attention_varlen: rows first_row + query_start run past q's ", q.size(0), " rows");
  for (int64_t c = 0; c < P; ++c)
    TORCH_CHECK(qs[c + 1] >= qs[c] && sp[c] >= 0 && (sp[c] + qs[c + 1] - qs[c]) <= width * BS,
                "prefill_attention_varlen: chunk ", c, " needs ", sp[c] + qs[c + 1] - qs[c], " keys, its table holds ",
                width * BS);
#if defined(TIDE_BF16_PAIRS)
  // Slots: one per distinct whole key block (by the cache rows it reads), one per partial one.
  const int64_t run = std::min<int64_t>(BS, kKeys);  // keys per contiguous run of cache rows
  std::map<std::vector<int64_t>, int64_t> seen;
  std::vector<std::vector<int64_t>> slot_of(P);
  std::vector<std::array<int64_t, 3>> todo;  // (chunk, key block, slot)
  for (int64_t c = 0; c < P; ++c) {
    const int64_t ctx = sp[c] + qs[c + 1] - qs[c];
    const int64_t* table = tables + c * width;
    for (int64_t kb = 0; kb * kKeys < ctx; ++kb) {
      int64_t slot = static_cast<int64_t>(todo.size());
      if ((kb + 1) * kKeys <= ctx) {
        std::vector<int64_t> rows;
        for (int64_t t = kb * kKeys; t < (kb + 1) * kKeys; t += run) rows.push_back(table[t / BS] * BS + t % BS);
        auto [it, fresh] = seen.emplace(std::move(rows), slot);
        if (!fresh) {
          slot_of[c].push_back(it->second);
          continue;
        }
      }
      slot_of[c].push_back(slot);
      todo.push_back({c, kb, slot});
    }
  }
  const int64_t KVH = k_cache.size(0), slots = static_cast<int64_t>(todo.size());
  if (slots == 0) return;
  Packed kv = packed_room(k_cache, slots);
  at::parallel_for(0, KVH * slots, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const auto& [c, kb, slot] = todo[item % slots];
      pack_block(kv, k_cache, v_cache, tables + c * width, sp[c] + qs[c + 1] - qs[c], item / slots, kb, slot);
    }
  });
  const float fscale = static_cast<float>(scale);
  for (int64_t c = 0; c < P; ++c) {
    const int64_t len = qs[c + 1] - qs[c];
    if (len == 0) continue;
    kv.slot = slot_of[c].data();
    const at::Tensor qc = q.narrow(0, first_row + qs[c], len);
    at::Tensor oc = out.narrow(0, first_row + qs[c], len);
    with_pass(q.size(2), [&](auto pass) { attend_chunk<decltype(pass)>(qc, kv, KVH, sp[c], fscale, oc); });
  }
#endif
}

}  // namespace

namespace tide_ops {  // for step/step_layers.cpp (common/ops.h)
void prefill_attention_varlen(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& query_start, const at::Tensor& start_pos,
                              const at::Tensor& block_tables, int64_t first_row, double scale, at::Tensor& out) {
  TIDE_RECORD("prefill_attention_varlen");
  ::prefill_attention_varlen(q, k_cache, v_cache, query_start, start_pos, block_tables, first_row, scale, out);
}
}  // namespace tide_ops

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def("prefill_attention_varlen(Tensor q, Tensor k_cache, Tensor v_cache, Tensor query_start, Tensor start_pos, "
        "Tensor block_tables, int first_row, float scale, Tensor(a!) out) -> ()");
  m.def("prefill_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, int start_pos, "
        "float scale) -> Tensor");
  m.def("prefill_attention_supported() -> bool", &prefill_attention_supported);
  m.def("attention_pass_isa() -> str", &attention_pass_isa);
  m.def("attention_pass_prefer_vector(bool enabled) -> ()", &attention_pass_prefer_vector);
}

TORCH_LIBRARY_IMPL(tide, CPU, m) {
  m.impl("prefill_attention", &prefill_attention);
  m.impl("prefill_attention_varlen", &prefill_attention_varlen);
}
