// Small-batch projections (op gemv): y = x W^T (+ b) for the few rows of a decode step,
// where the time is the weight read, not the arithmetic.
//
//   tide::gemv_pack_bf16(w)            W [N, K] bf16 into the packed layout
//   tide::gemv_bf16(x, packed, bias, N)  up to gemv_max_rows() rows of bf16 activations
//   tide::gemv_max_rows()              64 on AMX, 2 on AVX-512 BF16 alone, 0 without either
//   tide::gemv_step_rows()             the rows a step gives it: 40 on AMX (past them the GEMM
//                                      of gemm/gemm_amx.cpp is faster), else gemv_max_rows()
//   tide::gemv_bf16_vector(...)        gemv_bf16 on the AVX-512 BF16 path whatever the CPU has
//                                      (what a CPU without AMX runs; tests hold it to F.linear)
//
// The layout (common/packed_weight.h; gemm/gemm_amx.cpp reads it too) is the AMX tile's right
// operand, 16 output columns by 32 K per 1 KB block, so a thread's share of the weight is one
// sequential stream of 1 KB blocks. The variants: gemv_amx.h (cpp-amx: oneDNN's packed matmul
// streams the weights at about two thirds of its rate up to 64 rows, python
// scripts/bench_gemv.py) and gemv_avx512_bf16.h (cpp-avx512bf16).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "common/ops.h"
#include "common/packed_weight.h"
#include "gemv/gemv_amx.h"
#include "gemv/gemv_avx512_bf16.h"

namespace {

using tide_packed::kCols;
constexpr int64_t kVectorRows = 2;      // rows the vdpbf16ps path takes
constexpr int64_t kTileRows = 64;       // rows the AMX path takes
// Rows a step gives the AMX path: past 40 the GEMM, whose output streams past the caches,
// ran 1.07-1.18x faster at 48-64 rows (36 weights streamed) and the mix 1.01-1.03x.
constexpr int64_t kStepRows = 40;

at::Tensor gemv_pack_bf16(const at::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2, "gemv_pack_bf16 takes a bfloat16 [N, K] weight");
  TORCH_CHECK(w.size(1) % 32 == 0, "gemv_pack_bf16 needs K % 32 == 0, got ", w.size(1));
  const int64_t N = w.size(0), K = w.size(1), groups = 2 * ((N + 2 * kCols - 1) / (2 * kCols));
  auto padded = at::zeros({groups * kCols, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  // [g, n, k/32, pair, 2] -> [g, k/32, pair, n, 2]
  return padded.view({groups, kCols, K / 32, 16, 2}).permute({0, 2, 3, 1, 4}).contiguous();
}

bool tiles_ready() {
#if defined(TIDE_GEMV_AMX)
  return tide_amx::tiles_granted();
#else
  return false;
#endif
}

int64_t gemv_max_rows() {
#if defined(__AVX512BF16__)
  return tiles_ready() ? kTileRows : kVectorRows;
#else
  return 0;
#endif
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias, int64_t N,
                bool tiles) {
  const int64_t max_rows = tiles ? gemv_max_rows() : std::min(gemv_max_rows(), kVectorRows);
  TORCH_CHECK(max_rows > 0, "gemv_bf16 needs AVX-512 BF16");
  tide_packed::check_operands("gemv_bf16", x, packed, N);
  const int64_t M = x.size(0);
  TORCH_CHECK(M >= 1 && M <= max_rows, "gemv_bf16 takes 1..", max_rows, " rows, got ", M);
  const at::Tensor bc = tide_packed::bias_operand(bias, N);
  auto y = at::empty({M, N}, x.options());
#if defined(__AVX512BF16__)
  const int64_t K = packed.size(1) * 32, groups = packed.size(0);
  const auto xc = x.contiguous();
  const auto* xp = xc.data_ptr<at::BFloat16>();
  const auto* wp = packed.data_ptr<at::BFloat16>();
  const auto* bp = bc.defined() ? bc.data_ptr<at::BFloat16>() : nullptr;
  auto* yp = y.data_ptr<at::BFloat16>();
#if defined(TIDE_GEMV_AMX)
  if (tiles && max_rows == kTileRows) {
    at::parallel_for(0, groups / 2, 4,
                     [&](int64_t p0, int64_t p1) { tide_gemv::tile_pairs(xp, wp, bp, yp, M, N, K, p0, p1); });
    return y;
  }
#endif
  at::parallel_for(0, groups, 8, [&](int64_t g0, int64_t g1) {
    if (M == 1) tide_gemv::vector_groups<1>(xp, wp, bp, yp, N, K, g0, g1);
    else tide_gemv::vector_groups<2>(xp, wp, bp, yp, N, K, g0, g1);
  });
#endif
  return y;
}

at::Tensor gemv_bf16(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                     int64_t N) {
  return gemv(x, packed, bias, N, true);
}

int64_t gemv_step_rows() { return gemv_max_rows() == kTileRows ? kStepRows : gemv_max_rows(); }

// SiLU(x W_gate^T) * (x W_up^T) for 1..64 rows on the tiles: tide::gate_up_silu_bf16 below
// the GEMM's rows (gemm/gemm_amx.cpp).
at::Tensor gemv_silu_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t intermediate) {
  TORCH_CHECK(gemv_max_rows() == kTileRows, "gate_up_silu_bf16 needs AMX tiles");
  TORCH_CHECK(intermediate > 0 && intermediate % kCols == 0, "gate_up_silu_bf16: intermediate must be a multiple of ",
              kCols, ", got ", intermediate);
  tide_packed::check_operands("gate_up_silu_bf16", x, packed, 2 * intermediate);
  const int64_t M = x.size(0);
  TORCH_CHECK(M >= 1 && M <= kTileRows, "gate_up_silu_bf16 on the GEMV takes 1..", kTileRows, " rows, got ", M);
  auto y = at::empty({M, intermediate}, x.options());
#if defined(TIDE_GEMV_AMX)
  const int64_t K = packed.size(1) * 32, up = intermediate / kCols;
  const auto xc = x.contiguous();
  const auto* xp = xc.data_ptr<at::BFloat16>();
  const auto* wp = packed.data_ptr<at::BFloat16>();
  auto* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, up, 4, [&](int64_t p0, int64_t p1) {
    tide_gemv::tile_pairs(xp, wp, nullptr, yp, M, intermediate, K, p0, p1, up);
  });
#endif
  return y;
}

at::Tensor gemv_bf16_vector(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                            int64_t N) {
  return gemv(x, packed, bias, N, false);
}

}  // namespace

namespace tide_ops {
int64_t gemv_step_rows() { return ::gemv_step_rows(); }
at::Tensor gemv_silu_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t intermediate) {
  return ::gemv_silu_bf16(x, packed, intermediate);
}
at::Tensor gemv_bf16(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                     int64_t N) {
  TIDE_RECORD("gemv_bf16");
  return ::gemv_bf16(x, packed, bias, N);
}
}  // namespace tide_ops

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def("gemv_pack_bf16(Tensor w) -> Tensor");
  m.def("gemv_bf16(Tensor x, Tensor packed, Tensor? bias, int N) -> Tensor");
  m.def("gemv_bf16_vector(Tensor x, Tensor packed, Tensor? bias, int N) -> Tensor");
  m.def("gemv_max_rows() -> int", &gemv_max_rows);
  m.def("gemv_step_rows() -> int", &gemv_step_rows);
}

TORCH_LIBRARY_IMPL(tide, CPU, m) {
  m.impl("gemv_pack_bf16", &gemv_pack_bf16);
  m.impl("gemv_bf16", &gemv_bf16);
  m.impl("gemv_bf16_vector", &gemv_bf16_vector);
}
