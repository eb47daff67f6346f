// The native ops one C++ file calls from another (the whole-step loops of
// step/step_layers.cpp call the element, attention and GEMV kernels directly, without a
// trip through the dispatcher). Each is also a torch op of the same name ("tide::"), and
// each direct call is recorded under that name for torch.profiler (a flag test when no
// profiler runs), so a profile of a whole-step call still splits its time by op.
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#define TIDE_RECORD(name) RECORD_FUNCTION("tide::" name, std::vector<c10::IValue>())

namespace tide_ops {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);
at::Tensor add_rms_norm_(at::Tensor& hidden, const at::Tensor& delta, const at::Tensor& w, double eps);
at::Tensor silu_mul(const at::Tensor& gate_up);
void rotary_(at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
             int64_t heads, int64_t head_dim);
void write_kv_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                    const at::Tensor& slot_mapping);
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale);
at::Tensor decode_shared_prefix(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t shared,
                                double scale);
void prefill_attention_varlen(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& query_start, const at::Tensor& start_pos,
                              const at::Tensor& block_tables, int64_t first_row, double scale, at::Tensor& out);
at::Tensor gemv_bf16(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                     int64_t N);
at::Tensor gemm_bf16(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                     int64_t N);
bool gemm_rows_ready();
// SiLU(gate) * up straight from gate|up's packed weight (AMX tiles; intermediate % 16 == 0).
at::Tensor gate_up_silu_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t intermediate);
at::Tensor gemv_silu_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t intermediate);
int64_t gemv_step_rows();
// float32 on AVX2 + FMA over gemm_f32_pack's weight (gemm/gemm_f32_avx2.cpp).
at::Tensor gemm_f32(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias, int64_t N);  // rows a step gives the GEMV (40 on AMX), past them the GEMM

}  // namespace tide_ops
