// Small-batch projections: y = x W^T (+ b) for the few rows of a decode step, where the
// time is the weight read, not the arithmetic.
//
//   tide::gemv_pack_bf16(w)            W [N, K] bf16 into this file's layout (below)
//   tide::gemv_bf16(x, packed, bias, N)  up to gemv_max_rows() rows of bf16 activations
//   tide::gemv_max_rows()              64 on AMX, 2 on AVX-512 BF16 alone, 0 without either
//   tide::gemv_step_rows()             the rows a step gives it: 40 on AMX (past them the GEMM
//                                      of cpu_gemm.cpp is faster), else gemv_max_rows()
//   tide::gemv_bf16_vector(...)        gemv_bf16 on the AVX-512 path whatever the CPU has
//                                      (what a CPU without AMX runs; tests hold it to F.linear)
//
// The layout (packed_weight.h; the GEMM of cpu_gemm.cpp reads it too) is the AMX tile's
// right operand, 16 output columns by 32 K per 1 KB block, so a thread's share of the
// weight is one sequential stream of 1 KB blocks.
//
// On AMX each thread takes two column groups at a time: per 32 K, two weight tiles from
// memory (prefetched), the rows' tiles (16 rows each) from cache, and up to four tdpbf16ps;
// more than 32 rows run in passes of 32 over the same (now cached) weight blocks. oneDNN's
// packed matmul streams the weights at about two thirds of this rate up to 64 rows
// (`python scripts/bench_gemv.py`). Without AMX, one or two rows run on vdpbf16ps with
// each pair of x broadcast across the 16 columns. Sums are fp32; the bias is added before
// the one rounding to bf16.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif
#include "amx_tiles.h"
#if defined(__AVX512BF16__) && defined(TIDE_AMX_TILES)
#define TIDE_GEMV_AMX 1
#endif

#include "cpu_ops.h"
#include "packed_weight.h"

namespace {

using tide_packed::kBlock;
using tide_packed::kCols;
constexpr int64_t kPrefetch = 2048;     // bytes ahead of the weight stream
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

#if defined(__AVX512BF16__)
using tide_packed::store_row;

inline void prefetch_block(const at::BFloat16* block) {
  const char* p = reinterpret_cast<const char*>(block) + kPrefetch;
  for (int i = 0; i < 16; ++i) _mm_prefetch(p + 64 * i, _MM_HINT_T0);
}

// Column groups [g0, g1) for M (1 or 2) rows on vdpbf16ps: each pair x[k, k+1] broadcast
// against a 64-byte row of the block (16 columns), four accumulators per row.
template <int M>
void vector_groups(const at::BFloat16* x, const at::BFloat16* wp, const at::BFloat16* bias, at::BFloat16* y,
                   int64_t N, int64_t K, int64_t g0, int64_t g1) {
  const int64_t chunks = K / 32;
  const auto* pairs = reinterpret_cast<const int32_t*>(x);
  for (int64_t g = g0; g < g1 && g * kCols < N; ++g) {
    const at::BFloat16* w = wp + g * chunks * kBlock;
    __m512 acc[M][4];
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < 4; ++i) acc[m][i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      prefetch_block(w + c * kBlock);
      for (int r = 0; r < 16; ++r) {
        const __m512i wv = _mm512_loadu_si512(w + c * kBlock + r * 32);
        for (int m = 0; m < M; ++m) {
          const __m512i xv = _mm512_set1_epi32(pairs[m * K / 2 + c * 16 + r]);
          acc[m][r & 3] = _mm512_dpbf16_ps(acc[m][r & 3], reinterpret_cast<const __m512bh&>(xv),
                                           reinterpret_cast<const __m512bh&>(wv));
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3]));
      store_row(sum, bias, y + m * N, N, g * kCols);
    }
  }
}
#endif

#if defined(TIDE_GEMV_AMX)
using tide_amx::tiles_granted;
using tide_amx::TileConfig;

// Tiles for a pass of `rows` (1..32) rows: 0, 1 the rows' x (16, then the rest), 2, 3 the
// two groups' weight blocks, 4-7 the sums (group 0: 4, 5; group 1: 6, 7; second tile
// of each the rows past 16).
void configure_pass(int rows) {
  const int chunks = (rows + 15) / 16, tail = rows - 16 * (chunks - 1);
  TileConfig cfg = tide_amx::full_tiles();
  cfg.rows[1] = tail;
  if (chunks == 1) {
    cfg.rows[4] = cfg.rows[6] = tail;
  } else {
    cfg.rows[5] = cfg.rows[7] = tail;
  }
  _tile_loadconfig(&cfg);
}

// Sums of one pass over two groups' blocks (w0, w1), for 16 (MC 1, tile 1) or 17..32 rows.
template <int MC>
void tile_pass(const at::BFloat16* x, const at::BFloat16* w0, const at::BFloat16* w1, int64_t K, bool prefetch) {
  _tile_zero(4);
  _tile_zero(6);
  if constexpr (MC == 2) {
    _tile_zero(5);
    _tile_zero(7);
  }
  for (int64_t c = 0; c < K / 32; ++c) {
    if (prefetch) {
      prefetch_block(w0 + c * kBlock);
      prefetch_block(w1 + c * kBlock);
    }
    _tile_loadd(2, w0 + c * kBlock, 64);
    _tile_loadd(3, w1 + c * kBlock, 64);
    const at::BFloat16* xc = x + c * 32;
    if constexpr (MC == 1) {
      _tile_loadd(1, xc, K * 2);
      _tile_dpbf16ps(4, 1, 2);
      _tile_dpbf16ps(6, 1, 3);
    } else {
      _tile_loadd(0, xc, K * 2);
      _tile_loadd(1, xc + 16 * K, K * 2);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(6, 0, 3);
      _tile_dpbf16ps(5, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
  }
}

// Group pairs [p0, p1) for M (1..64) rows on AMX tiles. up > 0: gate|up fused, pair p is
// gate group p and up group up + p, and y [M, N = intermediate] gets SiLU(gate) * up.
void tile_pairs(const at::BFloat16* x, const at::BFloat16* wp, const at::BFloat16* bias, at::BFloat16* y,
                int64_t M, int64_t N, int64_t K, int64_t p0, int64_t p1, int64_t up = 0) {
  const int64_t group_size = (K / 32) * kBlock;
  alignas(64) float sums[2][32 * kCols];
  int configured = -1;
  for (int64_t p = p0; p < p1; ++p) {
    const at::BFloat16* w0 = wp + (up > 0 ? p : 2 * p) * group_size;
    const at::BFloat16* w1 = wp + (up > 0 ? up + p : 2 * p + 1) * group_size;
    for (int64_t m0 = 0; m0 < M; m0 += 32) {
      const int rows = static_cast<int>(std::min<int64_t>(32, M - m0));
      if (rows != configured) {
        configure_pass(rows);
        configured = rows;
      }
      if (rows > 16) {
        tile_pass<2>(x + m0 * K, w0, w1, K, m0 == 0);
        _tile_stored(5, sums[0] + 16 * kCols, 64);
        _tile_stored(7, sums[1] + 16 * kCols, 64);
      } else {
        tile_pass<1>(x + m0 * K, w0, w1, K, m0 == 0);
      }
      _tile_stored(4, sums[0], 64);
      _tile_stored(6, sums[1], 64);
      if (up > 0) {  // SiLU(gate) * up, each rounded to bf16 first as gate_up's y was
        for (int m = 0; m < rows; ++m)
          tide_packed::store_silu_row(sums[0] + m * kCols, sums[1] + m * kCols, y + (m0 + m) * N + p * kCols);
        continue;
      }
      for (int half = 0; half < 2; ++half) {
        const int64_t n0 = (2 * p + half) * kCols;
        if (n0 >= N) continue;
        for (int m = 0; m < rows; ++m)
          store_row(_mm512_load_ps(sums[half] + m * kCols), bias, y + (m0 + m) * N, N, n0);
      }
    }
  }
  _tile_release();
}
#endif

bool tiles_ready() {
#if defined(TIDE_GEMV_AMX)
  return tiles_granted();
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
    at::parallel_for(0, groups / 2, 4, [&](int64_t p0, int64_t p1) { tile_pairs(xp, wp, bp, yp, M, N, K, p0, p1); });
    return y;
  }
#endif
  at::parallel_for(0, groups, 8, [&](int64_t g0, int64_t g1) {
    if (M == 1) vector_groups<1>(xp, wp, bp, yp, N, K, g0, g1);
    else vector_groups<2>(xp, wp, bp, yp, N, K, g0, g1);
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
// the GEMM's rows (cpu_gemm.cpp).
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
    tile_pairs(xp, wp, nullptr, yp, M, intermediate, K, p0, p1, up);
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
