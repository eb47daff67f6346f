// Attention on bf16 pairs, part 3a: the multiply on AMX tiles (Sapphire Rapids and later).
// Eight tiles of 16 rows x 64 bytes: 0 the left operand (Q or P), 1 the right (K^T or V),
// 2 a score tile, 3 an output tile (wide heads), 4-7 the output of heads up to 64 wide,
// which stays in tiles across the key loop.
#pragma once

#include "attention/online_softmax.h"

#include "common/amx_tiles.h"

#if defined(TIDE_BF16_PAIRS) && defined(TIDE_AMX_TILES)
#define TIDE_AMX 1
#endif

namespace tide_attn {

#if defined(TIDE_AMX)

using tide_amx::tiles_granted;

// S (16 x 64) = Q K^T for one key block, into s.
inline void tile_scores(const at::BFloat16* qt, int64_t D, const Packed& kv, int64_t h, int64_t kb, float* s) {
  for (int sub = 0; sub < 4; ++sub) {
    _tile_zero(2);
    for (int64_t c = 0; c < kv.dk; ++c) {
      _tile_loadd(0, qt + 32 * c, D * 2);
      _tile_loadd(1, kv.k_tile(h, kb, sub, c), 64);
      _tile_dpbf16ps(2, 0, 1);
    }
    _tile_stored(2, s + 16 * sub, kKeys * 4);
  }
}

// Output tiles for head_dim 16 * DV <= 64 stay in tiles 4 .. 3 + DV across the key loop.
template <int DV>
struct ResidentOut {
  static void zero() {
    _tile_zero(4);
    if constexpr (DV > 1) _tile_zero(5);
    if constexpr (DV > 2) _tile_zero(6);
    if constexpr (DV > 3) _tile_zero(7);
  }
  static void store(float* o) {
    _tile_stored(4, o, DV * 64);
    if constexpr (DV > 1) _tile_stored(5, o + 16, DV * 64);
    if constexpr (DV > 2) _tile_stored(6, o + 32, DV * 64);
    if constexpr (DV > 3) _tile_stored(7, o + 48, DV * 64);
  }
  static void load(const float* o) {
    _tile_loadd(4, o, DV * 64);
    if constexpr (DV > 1) _tile_loadd(5, o + 16, DV * 64);
    if constexpr (DV > 2) _tile_loadd(6, o + 32, DV * 64);
    if constexpr (DV > 3) _tile_loadd(7, o + 48, DV * 64);
  }
  static void accumulate(const at::BFloat16* pb, const Packed& kv, int64_t h, int64_t kb) {
    for (int half = 0; half < 2; ++half) {
      _tile_loadd(0, pb + 32 * half, kKeys * 2);
      _tile_loadd(1, kv.v_tile(h, kb, half, 0), 64);
      _tile_dpbf16ps(4, 0, 1);
      if constexpr (DV > 1) {
        _tile_loadd(1, kv.v_tile(h, kb, half, 1), 64);
        _tile_dpbf16ps(5, 0, 1);
      }
      if constexpr (DV > 2) {
        _tile_loadd(1, kv.v_tile(h, kb, half, 2), 64);
        _tile_dpbf16ps(6, 0, 1);
      }
      if constexpr (DV > 3) {
        _tile_loadd(1, kv.v_tile(h, kb, half, 3), 64);
        _tile_dpbf16ps(7, 0, 1);
      }
    }
  }
};

// Wider heads: the output rows live in memory; each block loads, accumulates, stores them.
inline void accumulate_in_memory(float* o, int64_t D, const at::BFloat16* pb, const Packed& kv, int64_t h, int64_t kb) {
  for (int64_t c = 0; c < kv.dv; ++c) {
    _tile_loadd(3, o + 16 * c, D * 4);
    for (int half = 0; half < 2; ++half) {
      _tile_loadd(0, pb + 32 * half, kKeys * 2);
      _tile_loadd(1, kv.v_tile(h, kb, half, c), 64);
      _tile_dpbf16ps(3, 0, 1);
    }
    _tile_stored(3, o + 16 * c, D * 4);
  }
}

// The pass for attend_pass; DV = head_dim / 16 where the output stays in tiles (1..4),
// 0: in memory.
template <int DV>
struct AmxPass {
  struct Thread {  // every thread that runs tasks configures its tiles, and frees them
    Thread() { tide_amx::configure_full_tiles(); }
    ~Thread() { _tile_release(); }
  };
  static void start(float* o, int64_t D) {
    if constexpr (DV > 0) ResidentOut<DV>::zero();
    else std::fill(o, o + kRows * D, 0.f);
  }
  static void scores(const at::BFloat16* qt, int64_t D, const Packed& kv, int64_t h, int64_t kb, float* s) {
    tile_scores(qt, D, kv, h, kb, s);
  }
  static void rescale(float* o, int64_t D, __mmask16 rows, __m512 alpha) {
    if constexpr (DV > 0) ResidentOut<DV>::store(o);
    rescale_rows(o, D, rows, alpha);
    if constexpr (DV > 0) ResidentOut<DV>::load(o);
  }
  static void accumulate(float* o, int64_t D, const at::BFloat16* pb, const Packed& kv, int64_t h, int64_t kb) {
    if constexpr (DV > 0) ResidentOut<DV>::accumulate(pb, kv, h, kb);
    else accumulate_in_memory(o, D, pb, kv, h, kb);
  }
  static void finish(float* o, int64_t) {
    if constexpr (DV > 0) ResidentOut<DV>::store(o);
  }
};

#endif  // TIDE_AMX

inline bool tiles_supported() {
#if defined(TIDE_AMX)
  return tiles_granted();
#else
  return false;
#endif
}

}  // namespace tide_attn
