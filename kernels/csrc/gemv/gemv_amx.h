// The GEMV on AMX tiles (op gemv: cpp-amx): each thread takes two column groups at a time;
// per 32 K, two weight tiles from memory (prefetched), the rows' tiles (16 rows each) from
// cache, and up to four tdpbf16ps; more than 32 rows run in passes of 32 over the same
// weight blocks, cached by the first pass. Also gate|up with SiLU(gate) * up in its epilogue.
#pragma once

#include "common/amx_tiles.h"
#if defined(__AVX512BF16__) && defined(TIDE_AMX_TILES)
#define TIDE_GEMV_AMX 1

#include <immintrin.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

#include "common/packed_weight.h"
#include "gemv/gemv_avx512_bf16.h"

namespace tide_gemv {
namespace {  // internal linkage, as in gemv/gemv.cpp, the one source that includes this

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

}  // namespace
}  // namespace tide_gemv
#endif
