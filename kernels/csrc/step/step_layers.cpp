// Whole steps in one call: every decoder layer of a step runs here, op after op, with the
// kernels the Python loop (worker/models/llama.py) calls one by one, minus its ~15
// dispatches per layer, so the logits are the same bit for bit. The model calls these only
// where every op they embed takes its class's default (kernels/dispatch.py).
//
//   tide::decode_layers(...)       one or two decode rows: the projections on the native GEMV
//   tide::step_layers_packed(...)  any other step the native kernels attend (decode rows
//                                  and/or prefill chunks): the projections on the GEMV's
//                                  weights where the step has few enough rows, else on
//                                  the AMX GEMM over the same weights (gemm_amx.cpp) or,
//                                  where Linear took oneDNN's path, its packed matmul
//                                  (mkldnn::_linear_pointwise, what kernels/linear.py calls)
//
// `layers` holds 6 tensors per layer: input_norm, qkv, o, post_norm, gate_up, down (the
// projections in the layout their path takes); `qkv_bias` is empty or one tensor per
// layer. Both update the KV caches and return the final residual stream (before the
// model's last norm).

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "common/ops.h"

namespace {

// Every decoder layer for a step of one or two decode rows, in one call: the same
// kernels the Python loop calls op by op, minus ~15 Python dispatches per layer (about
// a sixth of a batch-1 step). `layers` holds 6 tensors per layer: input_norm,
// qkv (packed), o (packed), post_norm, gate_up (packed), down (packed); `qkv_bias` is
// empty or one tensor per layer. Updates the KV caches; returns the final residual
// stream (before the model's last norm).
at::Tensor decode_layers(const at::Tensor& hidden_in, const at::Tensor& positions, at::TensorList layers,
                         at::TensorList qkv_bias, at::TensorList k_caches, at::TensorList v_caches,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& context_lens, const at::Tensor& cos, const at::Tensor& sin,
                         int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t intermediate,
                         double eps, double scale) {
  const int64_t num_layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(static_cast<int64_t>(layers.size()) == 6 * num_layers && v_caches.size() == k_caches.size(),
              "decode_layers: expected 6 weights and one K/V cache pair per layer");
  TORCH_CHECK(qkv_bias.empty() || static_cast<int64_t>(qkv_bias.size()) == num_layers,
              "decode_layers: qkv_bias must be empty or one per layer");
  const int64_t n = hidden_in.size(0), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  const int64_t hidden_size = hidden_in.size(1);
  at::Tensor hidden = hidden_in.clone();
  at::Tensor delta;
  // SiLU(gate) * up straight from the GEMV's tiles (no [n, 2I] projection written).
  const bool fused_silu = tide_ops::gemm_rows_ready() && intermediate % 16 == 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    const at::Tensor* w = layers.data() + 6 * l;
    at::Tensor x = delta.defined() ? tide_ops::add_rms_norm_(hidden, delta, w[0], eps)
                                   : tide_ops::rms_norm(hidden, w[0], eps);
    c10::optional<at::Tensor> bias;
    if (!qkv_bias.empty()) bias = qkv_bias[l];
    at::Tensor qkv = tide_ops::gemv_bf16(x, w[1], bias, q_size + 2 * kv_size);
    tide_ops::rotary_(qkv, positions, cos, sin, num_heads + num_kv_heads, head_dim);
    const at::Tensor q = qkv.narrow(1, 0, q_size).view({n, num_heads, head_dim});
    const at::Tensor k = qkv.narrow(1, q_size, kv_size).view({n, num_kv_heads, head_dim});
    const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({n, num_kv_heads, head_dim});
    at::Tensor kc = k_caches[l], vc = v_caches[l];
    tide_ops::write_kv_cache(k, v, kc, vc, slot_mapping);
    const at::Tensor attn = tide_ops::paged_decode_attention(q, kc, vc, block_tables, context_lens, scale);
    const at::Tensor attn_out = tide_ops::gemv_bf16(attn.view({n, q_size}), w[2], c10::nullopt, hidden_size);
    x = tide_ops::add_rms_norm_(hidden, attn_out, w[3], eps);
    const at::Tensor act = fused_silu ? tide_ops::gate_up_silu_bf16(x, w[4], intermediate)
                                      : tide_ops::silu_mul(tide_ops::gemv_bf16(x, w[4], c10::nullopt, 2 * intermediate));
    delta = tide_ops::gemv_bf16(act, w[5], c10::nullopt, hidden_size);
  }
  if (delta.defined()) hidden.add_(delta);
  return hidden;
}

// y = x W^T (+ b) on oneDNN's packed weight, through the op kernels/linear.py calls; more
// than `split` rows (> 0) run in pieces of `split` rows, as Linear does where that won.
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                         int64_t split) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  const int64_t rows = x.size(0);
  if (split > 0 && rows > split) {
    std::vector<at::Tensor> pieces;
    for (int64_t i = 0; i < rows; i += split)
      pieces.push_back(packed_linear(x.narrow(0, i, std::min(split, rows - i)), w, bias, 0));
    return at::cat(pieces);
  }
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(x);
  stack.emplace_back(w);
  stack.emplace_back(bias);
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<c10::optional<at::Scalar>>());
  stack.emplace_back(std::string(""));
  op.callBoxed(&stack);
  return stack.back().toTensor();
}

// The projection a step of x's rows takes, as kernels/linear.py's Linear picks: the GEMV's
// weight (`small`, where given) up to small_rows rows; past them the AMX GEMM where `w` is
// in the GEMV's layout too (5-d: Linear keeps no oneDNN copy then), float32 on the AVX2
// GEMM where `w` is its packed weight (1-d, gemm/gemm_f32_avx2.cpp), else oneDNN's packed
// matmul. N: the projection's output columns.
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor* small, int64_t small_rows,
                   const c10::optional<at::Tensor>& bias, int64_t split, int64_t N) {
  if (small != nullptr && x.size(0) <= small_rows) return tide_ops::gemv_bf16(x, *small, bias, N);
  if (w.dim() == 5) return tide_ops::gemm_bf16(x, w, bias, N);
  if (w.dim() == 1) return tide_ops::gemm_f32(x, w, bias, N);
  return packed_linear(x, w, bias, split);
}

// Any step the native kernels attend (decode rows first, then prefill chunks) that
// decode_layers does not take. `small` is empty or holds the GEMV weights of qkv, o,
// gate_up and down per layer; with them, a step of up to small_rows rows projects on the
// GEMV, unpadded. Larger steps on oneDNN's path come with hidden [rows, hidden] and
// positions [rows] padded to the packed matmul's row bucket (on the GEMM's, unpadded); the
// first n = slot_mapping.size(0) rows are the step's, the padding rows get zero attention
// output, as in the Python loop. Decode rows (rows
// 0 .. decode_lens.size(0)) attend through decode_tables: with shared > 0 their first
// `shared` keys are the same cached blocks, attended once for all rows
// (tide::decode_shared_prefix). Prefill chunks go to tide::prefill_attention_varlen with
// the step's PrefillBatch. `splits` holds the row pieces of qkv, o, gate_up and down on
// oneDNN's path, `out_features` their output widths.
at::Tensor step_layers_packed(const at::Tensor& hidden_in, const at::Tensor& positions, at::TensorList layers,
                              at::TensorList qkv_bias, at::TensorList k_caches, at::TensorList v_caches,
                              const at::Tensor& slot_mapping, const c10::optional<at::Tensor>& decode_tables,
                              const c10::optional<at::Tensor>& decode_lens, int64_t shared,
                              const c10::optional<at::Tensor>& prefill_query_start,
                              const c10::optional<at::Tensor>& prefill_start_pos,
                              const c10::optional<at::Tensor>& prefill_tables, int64_t prefill_first_row,
                              at::IntArrayRef splits, at::IntArrayRef out_features, at::TensorList small,
                              int64_t small_rows,
                              const at::Tensor& cos, const at::Tensor& sin, int64_t num_heads,
                              int64_t num_kv_heads, int64_t head_dim, double eps, double scale) {
  const int64_t num_layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(static_cast<int64_t>(layers.size()) == 6 * num_layers && v_caches.size() == k_caches.size(),
              "step_layers_packed: expected 6 weights and one K/V cache pair per layer");
  TORCH_CHECK(qkv_bias.empty() || static_cast<int64_t>(qkv_bias.size()) == num_layers,
              "step_layers_packed: qkv_bias must be empty or one per layer");
  TORCH_CHECK(splits.size() == 4, "step_layers_packed: splits holds 4 row pieces (qkv, o, gate_up, down)");
  TORCH_CHECK(out_features.size() == 4, "step_layers_packed: out_features holds 4 widths (qkv, o, gate_up, down)");
  TORCH_CHECK(small.empty() || static_cast<int64_t>(small.size()) == 4 * num_layers,
              "step_layers_packed: small must be empty or hold 4 GEMV weights per layer");
  const bool has_decode = decode_lens.has_value() && decode_lens->defined();
  const bool has_prefill = prefill_query_start.has_value() && prefill_query_start->defined();
  TORCH_CHECK(has_decode || has_prefill, "step_layers_packed: a step of neither decode rows nor prefill chunks");
  TORCH_CHECK(!has_decode || (decode_tables.has_value() && decode_tables->defined()),
              "step_layers_packed: decode_lens without decode_tables");
  TORCH_CHECK(!has_prefill || (prefill_start_pos.has_value() && prefill_tables.has_value()),
              "step_layers_packed: prefill_query_start without start_pos and tables");
  const int64_t rows = hidden_in.size(0), n = slot_mapping.size(0);
  const int64_t nd = has_decode ? decode_lens->size(0) : 0;
  TORCH_CHECK(nd <= n && n <= rows && positions.size(0) == rows,
              "step_layers_packed: ", nd, " decode rows and ", n, " step rows in ", rows, " padded rows");
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  at::Tensor hidden = hidden_in.clone();
  at::Tensor attn_in = at::zeros({rows, q_size}, hidden.options());  // padding rows stay zero
  // SiLU(gate) * up straight from the GEMV's or GEMM's tiles where gate|up sits in their
  // layout (AMX): no [rows, 2I] projection written and read back.
  const bool fused_silu = num_layers > 0 && layers[4].dim() == 5 && tide_ops::gemm_rows_ready() &&
                          out_features[2] % 32 == 0;
  at::Tensor delta;
  for (int64_t l = 0; l < num_layers; ++l) {
    const at::Tensor* w = layers.data() + 6 * l;
    const at::Tensor* sw = small.empty() ? nullptr : small.data() + 4 * l;
    auto proj = [&](const at::Tensor& in, int i, const c10::optional<at::Tensor>& b) {
      const int widx[4] = {1, 2, 4, 5};
      return project(in, w[widx[i]], sw == nullptr ? nullptr : sw + i, small_rows, b, splits[i], out_features[i]);
    };
    at::Tensor x = delta.defined() ? tide_ops::add_rms_norm_(hidden, delta, w[0], eps)
                                   : tide_ops::rms_norm(hidden, w[0], eps);
    c10::optional<at::Tensor> bias;
    if (!qkv_bias.empty()) bias = qkv_bias[l];
    at::Tensor qkv = proj(x, 0, bias);
    tide_ops::rotary_(qkv, positions, cos, sin, num_heads + num_kv_heads, head_dim);
    const at::Tensor step = qkv.narrow(0, 0, n);
    const at::Tensor q = step.narrow(1, 0, q_size).view({n, num_heads, head_dim});
    const at::Tensor k = step.narrow(1, q_size, kv_size).view({n, num_kv_heads, head_dim});
    const at::Tensor v = step.narrow(1, q_size + kv_size, kv_size).view({n, num_kv_heads, head_dim});
    at::Tensor kc = k_caches[l], vc = v_caches[l];
    tide_ops::write_kv_cache(k, v, kc, vc, slot_mapping);
    at::Tensor attn;
    if (has_decode) {
      const at::Tensor qd = q.narrow(0, 0, nd);
      attn = shared > 0 ? tide_ops::decode_shared_prefix(qd, kc, vc, *decode_tables, *decode_lens, shared, scale)
                        : tide_ops::paged_decode_attention(qd, kc, vc, *decode_tables, *decode_lens, scale);
    }
    if (has_prefill) {
      at::Tensor out = at::empty({n, num_heads, head_dim}, q.options());
      if (nd > 0) out.narrow(0, 0, nd).copy_(attn);
      tide_ops::prefill_attention_varlen(q, kc, vc, *prefill_query_start, *prefill_start_pos, *prefill_tables,
                                         prefill_first_row, scale, out);
      attn = out;
    }
    attn_in.narrow(0, 0, n).copy_(attn.view({n, q_size}));
    x = tide_ops::add_rms_norm_(hidden, proj(attn_in, 1, c10::nullopt), w[3], eps);
    const at::Tensor act = fused_silu ? tide_ops::gate_up_silu_bf16(x, w[4], out_features[2] / 2)
                                      : tide_ops::silu_mul(proj(x, 2, c10::nullopt));
    delta = proj(act, 3, c10::nullopt);
  }
  if (delta.defined()) hidden.add_(delta);
  return hidden;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def("decode_layers(Tensor hidden, Tensor positions, Tensor[] layers, Tensor[] qkv_bias, Tensor[] k_caches, "
        "Tensor[] v_caches, Tensor slot_mapping, Tensor block_tables, Tensor context_lens, Tensor cos, Tensor sin, "
        "int num_heads, int num_kv_heads, int head_dim, int intermediate, float eps, float scale) -> Tensor");
  m.def("step_layers_packed(Tensor hidden, Tensor positions, Tensor[] layers, Tensor[] qkv_bias, "
        "Tensor[] k_caches, Tensor[] v_caches, Tensor slot_mapping, Tensor? decode_tables, Tensor? decode_lens, "
        "int shared, Tensor? prefill_query_start, Tensor? prefill_start_pos, Tensor? prefill_tables, "
        "int prefill_first_row, int[] splits, int[] out_features, Tensor[] small, int small_rows, Tensor cos, Tensor sin, "
        "int num_heads, int num_kv_heads, int head_dim, float eps, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(tide, CPU, m) {
  m.impl("decode_layers", &decode_layers);
  m.impl("step_layers_packed", &step_layers_packed);
}

// oneDNN's packed float32 weights are opaque MKLDNN tensors, which dispatch here.
TORCH_LIBRARY_IMPL(tide, MkldnnCPU, m) { m.impl("step_layers_packed", &step_layers_packed); }
