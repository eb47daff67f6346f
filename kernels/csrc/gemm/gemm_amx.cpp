// Projections of many rows on AMX tiles (op gemm: cpp-amx): y = x W^T (+ b) for prefill
// chunks and mixed steps, on the GEMV's weight (common/packed_weight.h: 16 output columns by
// 32 K per 1 KB block, the tile's right operand), so one packed copy serves every row count.
//
//   tide::gemm_bf16(x, packed, bias, N)  any number of rows of bf16 activations
//   tide::gemm_rows_ready()              whether this build and CPU run it (AMX tiles)
//
// Each thread takes whole pairs of column groups (32 output columns). Per pair, K runs in
// blocks of kKBlock (the pair's two weight blocks, 16 KB, stay in L1 while every 32-row
// block of x passes over them; the next blocks are prefetched meanwhile); x's rows run in
// chunks whose K-wide slice fits in L2 (kChunkBytes), so the weight is read from memory
// once per chunk. Per 32 rows x 32 columns four tiles hold the sums, carried from K block
// to K block in a small fp32 buffer, and rounded to bf16 (plus bias) once at the end,
// with streaming stores where y's rows are whole 64-byte lines: the next op reads y, this
// one never does, so its lines need not be fetched first (a mixed step's outputs are
// larger than the caches keep between layers: the mixed bench's GEMM time 0.88x).
// A last block of fewer than 16 rows is copied into a zero-padded one first, so no tile
// load reads past x. `python scripts/bench_gemm.py` times it against oneDNN's packed
// matmul.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/amx_tiles.h"
#if defined(__AVX512BF16__) && defined(TIDE_AMX_TILES)
#define TIDE_GEMM_AMX 1
#include <immintrin.h>
#endif

#include "common/ops.h"
#include "common/packed_weight.h"

namespace {

using tide_packed::kBlock;
using tide_packed::kCols;
constexpr int64_t kKBlock = 8;               // 32-K steps per K block: 2 x 8 KB of weight
constexpr int64_t kChunkBytes = 1 << 20;     // x rows per chunk: this many bytes of x

#if defined(TIDE_GEMM_AMX)
using tide_amx::tiles_granted;

using tide_packed::store_row;

struct Operands {
  const at::BFloat16* x;     // [M, K] row-major
  const at::BFloat16* tail;  // the last M % 16 rows, zero-padded to 16 (or null)
  const at::BFloat16* w;     // packed weight
  const at::BFloat16* bias;  // [N] or null
  at::BFloat16* y;           // [M, N]
  int64_t M, N, K;
  bool stream;     // y's rows 64-byte aligned: full lines go straight to memory (no read for ownership)
  int64_t up = 0;  // > 0: gate|up fused, pair p is gate group p and up group up + p; y = SiLU(gate) * up
};

// The weight blocks of group `half` (0, 1) of pair p.
inline const at::BFloat16* pair_group(const Operands& o, int64_t p, int half) {
  const int64_t group_size = o.K / 32 * kBlock;
  return o.w + (o.up > 0 ? (half ? o.up + p : p) : 2 * p + half) * group_size;
}

// The 16-row block b of x (the padded tail for a last partial block).
inline const at::BFloat16* row_block(const Operands& o, int64_t b) {
  return (b + 1) * 16 <= o.M ? o.x + b * 16 * o.K : o.tail;
}

// Rounds the sums of rows [m0, m0 + rows) of one 16-row block into y for pair p.
void store_block(const Operands& o, const float* sums0, const float* sums1, int64_t m0, int64_t p) {
  const int rows = static_cast<int>(std::min<int64_t>(16, o.M - m0));
  if (o.up > 0) {  // 16 columns of SiLU(gate) * up, each rounded to bf16 first as gate_up's y was
    for (int m = 0; m < rows; ++m)
      tide_packed::store_silu_row(sums0 + m * kCols, sums1 + m * kCols, o.y + (m0 + m) * o.N + p * kCols);
    return;
  }
  const int64_t n0 = 2 * p * kCols;
  if (n0 + 2 * kCols <= o.N) {  // both groups inside y: each row's 32 columns in one store
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (o.bias) {
      b0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(o.bias + n0))), 16));
      b1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(o.bias + n0 + kCols))), 16));
    }
    for (int m = 0; m < rows; ++m) {
      const __m512bh r = _mm512_cvtne2ps_pbh(_mm512_add_ps(_mm512_load_ps(sums1 + m * kCols), b1),
                                             _mm512_add_ps(_mm512_load_ps(sums0 + m * kCols), b0));
      at::BFloat16* dst = o.y + (m0 + m) * o.N + n0;
      if (o.stream) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), reinterpret_cast<const __m512i&>(r));
      else _mm512_storeu_si512(dst, reinterpret_cast<const __m512i&>(r));
    }
    return;
  }
  for (int half = 0; half < 2; ++half) {
    const int64_t n0 = (2 * p + half) * kCols;
    if (n0 >= o.N) continue;
    const float* s = half ? sums1 : sums0;
    for (int m = 0; m < rows; ++m) store_row(_mm512_load_ps(s + m * kCols), o.bias, o.y + (m0 + m) * o.N, o.N, n0);
  }
}

// Pairs [p0, p1) for every row.
void gemm_pairs(const Operands& o, int64_t p0, int64_t p1) {
  const int64_t C = o.K / 32, blocks16 = (o.M + 15) / 16;
  const int64_t chunk16 = std::max<int64_t>(2, kChunkBytes / (o.K * 2) / 32 * 2);  // even
  // Sums carried between K blocks: per 16-row block of a chunk, two 16 x 16 fp32 tiles.
  std::vector<float> carry_buf(chunk16 * 2 * 256 + 16);
  float* carry = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(carry_buf.data()) + 63) & ~uintptr_t(63));
  alignas(64) float out[4][256];
  const int64_t lda = o.K * 2;
  // All eight tiles 16 x 64 bytes: 0, 1 rows of x; 2, 3 the pair's weight blocks; 4-7 sums
  // (4, 6: rows 0-15 of groups 0, 1; 5, 7: rows 16-31).
  tide_amx::configure_full_tiles();
  for (int64_t c0 = 0; c0 < blocks16; c0 += chunk16) {
    const int64_t c1 = std::min(blocks16, c0 + chunk16);
    for (int64_t p = p0; p < p1; ++p) {
      const at::BFloat16* w0 = pair_group(o, p, 0);
      const at::BFloat16* w1 = pair_group(o, p, 1);
      for (int64_t k0 = 0; k0 < C; k0 += kKBlock) {
        const int64_t k1 = std::min(C, k0 + kKBlock);
        const bool first = k0 == 0, last = k1 == C;
        // The next weight blocks this thread reads, fetched into L2 over this K block.
        const char* next0 = nullptr;
        const char* next1 = nullptr;
        int64_t lines = 0;
        if (!last) {
          next0 = reinterpret_cast<const char*>(w0 + k1 * kBlock);
          next1 = reinterpret_cast<const char*>(w1 + k1 * kBlock);
          lines = (std::min(C, k1 + kKBlock) - k1) * 16;
        } else if (p + 1 < p1) {
          next0 = reinterpret_cast<const char*>(pair_group(o, p + 1, 0));
          next1 = reinterpret_cast<const char*>(pair_group(o, p + 1, 1));
          lines = std::min(C, kKBlock) * 16;
        }
        const int64_t steps = (c1 - c0 + 1) / 2 * (k1 - k0);
        const int64_t per_step = (lines + steps - 1) / steps;
        int64_t fetched = 0;
        for (int64_t b = c0; b < c1; b += 2) {
          const bool two = b + 1 < c1;
          float* cp = carry + (b - c0) * 2 * 256;
          if (first) {
            _tile_zero(4);
            _tile_zero(6);
            _tile_zero(5);
            _tile_zero(7);
          } else {
            _tile_loadd(4, cp, 64);
            _tile_loadd(6, cp + 256, 64);
            if (two) {
              _tile_loadd(5, cp + 512, 64);
              _tile_loadd(7, cp + 768, 64);
            }
          }
          const at::BFloat16* a0 = row_block(o, b);
          const at::BFloat16* a1 = two ? row_block(o, b + 1) : a0;
          for (int64_t c = k0; c < k1; ++c) {
            for (int64_t i = 0; i < per_step && fetched < lines; ++i, ++fetched) {
              _mm_prefetch(next0 + 64 * fetched, _MM_HINT_T1);
              _mm_prefetch(next1 + 64 * fetched, _MM_HINT_T1);
            }
            _tile_loadd(2, w0 + c * kBlock, 64);
            _tile_loadd(3, w1 + c * kBlock, 64);
            _tile_loadd(0, a0 + c * 32, lda);
            _tile_dpbf16ps(4, 0, 2);
            _tile_dpbf16ps(6, 0, 3);
            if (two) {
              _tile_loadd(1, a1 + c * 32, lda);
              _tile_dpbf16ps(5, 1, 2);
              _tile_dpbf16ps(7, 1, 3);
            }
          }
          if (!last) {
            _tile_stored(4, cp, 64);
            _tile_stored(6, cp + 256, 64);
            if (two) {
              _tile_stored(5, cp + 512, 64);
              _tile_stored(7, cp + 768, 64);
            }
            continue;
          }
          _tile_stored(4, out[0], 64);
          _tile_stored(6, out[1], 64);
          store_block(o, out[0], out[1], b * 16, p);
          if (two) {
            _tile_stored(5, out[2], 64);
            _tile_stored(7, out[3], 64);
            store_block(o, out[2], out[3], (b + 1) * 16, p);
          }
        }
      }
    }
  }
  _tile_release();
  if (o.stream) _mm_sfence();  // the streamed lines visible before the threads join
}
#endif

bool gemm_rows_ready() {
#if defined(TIDE_GEMM_AMX)
  return tiles_granted();
#else
  return false;
#endif
}

// y [M, N] from x [M, K] on the packed weight; up > 0: the fused gate|up (N = intermediate).
at::Tensor run_gemm(const char* op, const at::Tensor& x, const at::Tensor& packed,
                    const c10::optional<at::Tensor>& bias, int64_t N, int64_t up) {
  TORCH_CHECK(gemm_rows_ready(), op, " needs AMX tiles");
  tide_packed::check_operands(op, x, packed, up > 0 ? 2 * N : N);
  const int64_t M = x.size(0);
  const at::Tensor bc = tide_packed::bias_operand(bias, N);
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
#if defined(TIDE_GEMM_AMX)
  const int64_t K = packed.size(1) * 32;
  const int64_t pairs = up > 0 ? N / kCols : packed.size(0) / 2;
  const auto xc = x.contiguous();
  at::Tensor tail;
  if (M % 16) {
    tail = at::zeros({16, K}, x.options());
    tail.narrow(0, 0, M % 16).copy_(xc.narrow(0, M / 16 * 16, M % 16));
  }
  const Operands o{xc.data_ptr<at::BFloat16>(), tail.defined() ? tail.data_ptr<at::BFloat16>() : nullptr,
                   packed.data_ptr<at::BFloat16>(), bc.defined() ? bc.data_ptr<at::BFloat16>() : nullptr,
                   y.data_ptr<at::BFloat16>(), M, N, K,
                   up == 0 && N % 32 == 0 && reinterpret_cast<uintptr_t>(y.data_ptr()) % 64 == 0, up};
  at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) { gemm_pairs(o, p0, p1); });
#endif
  return y;
}

at::Tensor gemm_bf16(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                     int64_t N) {
  return run_gemm("gemm_bf16", x, packed, bias, N, 0);
}

// SiLU(x W_gate^T) * (x W_up^T) from gate|up's packed weight [2I, K], without writing the
// [M, 2I] projection: equal to silu_mul(gemm_bf16(x, packed, None, 2I)) bit for bit.
// Up to the GEMV's rows on the GEMV's tiles, past them on this GEMM.
at::Tensor gate_up_silu_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t intermediate) {
  TORCH_CHECK(intermediate > 0 && intermediate % kCols == 0, "gate_up_silu_bf16: intermediate must be a multiple of ",
              kCols, ", got ", intermediate);
  if (x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= tide_ops::gemv_step_rows())
    return tide_ops::gemv_silu_bf16(x, packed, intermediate);
  return run_gemm("gate_up_silu_bf16", x, packed, c10::nullopt, intermediate, intermediate / kCols);
}

}  // namespace

namespace tide_ops {
at::Tensor gemm_bf16(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                     int64_t N) {
  TIDE_RECORD("gemm_bf16");
  return ::gemm_bf16(x, packed, bias, N);
}
bool gemm_rows_ready() { return ::gemm_rows_ready(); }
at::Tensor gate_up_silu_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t intermediate) {
  TIDE_RECORD("gate_up_silu_bf16");
  return ::gate_up_silu_bf16(x, packed, intermediate);
}
}  // namespace tide_ops

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def("gemm_bf16(Tensor x, Tensor packed, Tensor? bias, int N) -> Tensor");
  m.def("gemm_rows_ready() -> bool", &gemm_rows_ready);
  m.def("gate_up_silu_bf16(Tensor x, Tensor packed, int intermediate) -> Tensor");
}

TORCH_LIBRARY_IMPL(tide, CPU, m) {
  m.impl("gemm_bf16", &gemm_bf16);
  m.impl("gate_up_silu_bf16", &gate_up_silu_bf16);
}
