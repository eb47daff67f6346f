// The KV write (op kv_write: cpp): the step's new K and V rows into their cache slots.
//
//   tide::write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
//       a row whose slot is -1 (a padding row) is skipped.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

#include "common/ops.h"

namespace {

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

// The same kernel for step/step_layers.cpp (common/ops.h).
namespace tide_ops {
void write_kv_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                    const at::Tensor& slot_mapping) {
  TIDE_RECORD("write_kv_cache");
  ::write_kv_cache(key, value, k_cache, v_cache, slot_mapping);
}
}  // namespace tide_ops

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def("write_kv_cache(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(tide, CPU, m) { m.impl("write_kv_cache", &write_kv_cache); }
