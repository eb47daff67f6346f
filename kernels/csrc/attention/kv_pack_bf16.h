// Attention on bf16 pairs, part 1: K/V repacked from the paged cache into the layout that
// both AMX's tile multiply and AVX-512 BF16's vdpbf16ps take as their right operand
// (included by prefill.cpp and decode_shared_prefix.cpp through the passes; all inline).
//
// K^T per 16 keys and 32 dims, V per 32 keys and 16 dims, pairs of bf16 along the reduced
// dimension, keys past the context zeros; packed once per call, in a buffer kept per
// calling thread. One row of such a 16 x 64-byte block is 16 lanes of bf16 pairs: one
// AVX-512 register, the operand of one vdpbf16ps against a broadcast pair of the left side.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define TIDE_BF16_PAIRS 1
#include <immintrin.h>
#endif

namespace tide_attn {

inline void check_inputs(const char* op, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), op,
              ": q [rows, H, D], caches [kv_heads, blocks, block_size, D]");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16 &&
                  v_cache.scalar_type() == at::kBFloat16,
              op, ": bfloat16 only");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && q.stride(2) == 1, op,
              ": caches contiguous, q rows contiguous along head_dim");
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(2) % 32 == 0, op,
              ": head_dim must match and be a multiple of 32");
  TORCH_CHECK(q.size(1) % k_cache.size(0) == 0, op, ": heads ", q.size(1), " not a multiple of kv heads ",
              k_cache.size(0));
}

#if defined(TIDE_BF16_PAIRS)

constexpr int kRows = 16;  // query rows per task (one tile's rows)
constexpr int kKeys = 64;  // keys per softmax step
constexpr int kTile = 512;  // bf16 elements in one 16 x 64-byte block (an AMX tile)

// A buffer that grows and is kept (per calling thread): a fresh allocation per call would
// fault in its pages each time, costing more than the packing.
struct Scratch {
  std::unique_ptr<at::BFloat16[]> data;
  size_t size = 0;
  at::BFloat16* get(size_t n) {
    if (n > size) {
      data.reset(new at::BFloat16[n]);
      size = n;
    }
    return data.get();
  }
};

struct Packed {
  at::BFloat16* kt = nullptr;
  at::BFloat16* vv = nullptr;
  int64_t blocks = 0, dk = 0, dv = 0;  // packed key blocks (slots), 32-dim chunks of K, 16-dim slices of V
  const int64_t* slot = nullptr;       // key block -> packed slot (nullptr: the same index)
  int64_t at(int64_t kb) const { return slot ? slot[kb] : kb; }
  const at::BFloat16* k_slot(int64_t h, int64_t s, int64_t sub, int64_t c) const {
    return kt + (((h * blocks + s) * 4 + sub) * dk + c) * kTile;
  }
  const at::BFloat16* v_slot(int64_t h, int64_t s, int64_t half, int64_t c) const {
    return vv + (((h * blocks + s) * 2 + half) * dv + c) * kTile;
  }
  const at::BFloat16* k_tile(int64_t h, int64_t kb, int64_t sub, int64_t c) const { return k_slot(h, at(kb), sub, c); }
  const at::BFloat16* v_tile(int64_t h, int64_t kb, int64_t half, int64_t c) const { return v_slot(h, at(kb), half, c); }
};

// Transposes 16 x 16 32-bit lanes in place: w[i] lane j <- w[j] lane i.
inline void transpose16x16(__m512i* w) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved within 128-bit lanes
    t[i] = _mm512_unpacklo_epi32(w[i], w[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(w[i], w[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + j] lane L: rows i..i+3, column 4L + j
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // a 4 x 4 transpose of 128-bit lanes across u[j], u[4+j], ...
    const __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88), x1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
    w[j] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    w[4 + j] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    w[8 + j] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    w[12 + j] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// K^T tile (keys n of a 16-key sub-block, dims 32c..32c+31): element [kk][n][j] = K[n][32c+2kk+j].
// V tile (keys of a 32-key half, dims 16c..16c+15): element [kk][n][j] = V[2kk+j][16c+n].
// Keys past the context are zeros. Packs key block kb of the sequence read through `table`
// (context ctx), kv head h, into slot `slot` of p.
inline void pack_block(const Packed& p, const at::Tensor& k_cache, const at::Tensor& v_cache, const int64_t* table,
                       int64_t ctx, int64_t h, int64_t kb, int64_t slot) {
  const int64_t NB = k_cache.size(1), BS = k_cache.size(2), D = k_cache.size(3);
  const auto* kc = k_cache.data_ptr<at::BFloat16>();
  const auto* vc = v_cache.data_ptr<at::BFloat16>();
  const at::BFloat16* krow[kKeys];
  const at::BFloat16* vrow[kKeys];
  for (int64_t n = 0; n < kKeys; ++n) {
    const int64_t t = kb * kKeys + n;
    const int64_t off = t < ctx ? ((h * NB + table[t / BS]) * BS + t % BS) * D : -1;
    krow[n] = off < 0 ? nullptr : kc + off;
    vrow[n] = off < 0 ? nullptr : vc + off;
  }
  for (int64_t sub = 0; sub < 4; ++sub)
    for (int64_t c = 0; c < p.dk; ++c) {
      __m512i w[16];
      for (int n = 0; n < 16; ++n) {
        const at::BFloat16* src = krow[sub * 16 + n];
        w[n] = src ? _mm512_loadu_si512(src + 32 * c) : _mm512_setzero_si512();
      }
      transpose16x16(w);
      auto* dst = const_cast<at::BFloat16*>(p.k_slot(h, slot, sub, c));
      for (int kk = 0; kk < 16; ++kk) _mm512_storeu_si512(dst + 32 * kk, w[kk]);
    }
  for (int64_t half = 0; half < 2; ++half)
    for (int64_t c = 0; c < p.dv; ++c) {
      auto* dst = const_cast<at::BFloat16*>(p.v_slot(h, slot, half, c));
      for (int kk = 0; kk < 16; ++kk) {
        const at::BFloat16* even = vrow[half * 32 + 2 * kk];
        const at::BFloat16* odd = vrow[half * 32 + 2 * kk + 1];
        const __m512i lo = even ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(even + 16 * c)))
                                : _mm512_setzero_si512();
        const __m512i hi = odd ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(odd + 16 * c)))
                               : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + 32 * kk, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
    }
}

// Room for `slots` packed key blocks of every kv head, in buffers kept per calling thread.
inline Packed packed_room(const at::Tensor& k_cache, int64_t slots) {
  const int64_t KVH = k_cache.size(0), D = k_cache.size(3);
  Packed p;
  p.blocks = slots;
  p.dk = D / 32;
  p.dv = D / 16;
  static thread_local Scratch k_scratch, v_scratch;
  p.kt = k_scratch.get(KVH * slots * kKeys * D);
  p.vv = v_scratch.get(KVH * slots * kKeys * D);
  return p;
}

// Every key block of one sequence's first ctx keys, slot = block.
inline Packed pack_kv(const at::Tensor& k_cache, const at::Tensor& v_cache, const int64_t* table, int64_t ctx) {
  const int64_t KVH = k_cache.size(0);
  Packed p = packed_room(k_cache, (ctx + kKeys - 1) / kKeys);
  at::parallel_for(0, KVH * p.blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item)
      pack_block(p, k_cache, v_cache, table, ctx, item / p.blocks, item % p.blocks, item % p.blocks);
  });
  return p;
}

#endif  // TIDE_BF16_PAIRS

}  // namespace tide_attn
