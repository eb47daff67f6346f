// Prefill attention on AMX tiles: a chunk of query tokens against its paged K/V.
//
//   tide::prefill_attention(q, k_cache, v_cache, block_table, start_pos, scale)
//       q [L, H, D] bf16 (any row and head strides) at positions start_pos .. start_pos+L-1
//       of one sequence; its K/V are already in the cache (the step writes them first) and
//       are read through block_table. Query i sees keys 0 ..= start_pos + i. Returns
//       [L, H, D] bf16.
//   tide::prefill_attention_supported() -> bool: compiled with AMX and the kernel granted
//       the tile state (Linux asks each process to request it).
//
// Layout of the work. A KV head's G query heads share its K/V, so the rows of a task are
// (position, query head) pairs of one KV head, 16 at a time: every K/V tile loaded serves
// 16 rows. K and V are first repacked, once per call, into the layouts the tile multiply
// takes as its right operand (pairs of bf16 along the reduced dimension): K^T per 16 keys
// and 32 dims, V per 32 keys and 16 dims. Then per 64 keys: S = Q K^T on tiles, an online
// softmax step in AVX-512 (fp32, base 2), P (bf16) V accumulated onto the fp32 output rows.
// Blocks past a row's last visible key are skipped for the whole tile; only the blocks that
// cross the diagonal are masked.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#define TIDE_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

#if defined(TIDE_AMX)

constexpr int kRows = 16;  // query rows per task (one tile's rows)
constexpr int kKeys = 64;  // keys per softmax step
constexpr int kTile = 512;  // bf16 elements in one 16 x 64-byte tile

// Linux hands a process the AMX tile state only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); oneDNN asks too, asking twice is harmless.
bool tiles_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
}

struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Eight tiles, all 16 rows x 64 bytes: 0 the left operand (Q or P), 1 the right (K^T or V),
// 2 a score tile, 3 an output tile (wide heads), 4-7 the output of heads up to 64 wide.
void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// 2^x for x <= 0: 2^round(x) times a cubic in the rest, relative error about 1e-4 (the
// probabilities are rounded to bf16, 4e-3, anyway). x = -inf gives NaN: mask those lanes.
inline __m512 exp2_neg(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);  // [-0.5, 0.5]
  __m512 p = _mm512_set1_ps(5.5504109e-2f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022651e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

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
  int64_t blocks = 0, dk = 0, dv = 0;  // key blocks, 32-dim chunks of K, 16-dim slices of V
  const at::BFloat16* k_tile(int64_t h, int64_t kb, int64_t sub, int64_t c) const {
    return kt + (((h * blocks + kb) * 4 + sub) * dk + c) * kTile;
  }
  const at::BFloat16* v_tile(int64_t h, int64_t kb, int64_t half, int64_t c) const {
    return vv + (((h * blocks + kb) * 2 + half) * dv + c) * kTile;
  }
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
// Keys past the context are zeros.
Packed pack_kv(const at::Tensor& k_cache, const at::Tensor& v_cache, const int64_t* table, int64_t ctx) {
  const int64_t KVH = k_cache.size(0), NB = k_cache.size(1), BS = k_cache.size(2), D = k_cache.size(3);
  Packed p;
  p.blocks = (ctx + kKeys - 1) / kKeys;
  p.dk = D / 32;
  p.dv = D / 16;
  static thread_local Scratch k_scratch, v_scratch;
  p.kt = k_scratch.get(KVH * p.blocks * kKeys * D);
  p.vv = v_scratch.get(KVH * p.blocks * kKeys * D);
  const auto* kc = k_cache.data_ptr<at::BFloat16>();
  const auto* vc = v_cache.data_ptr<at::BFloat16>();
  at::parallel_for(0, KVH * p.blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / p.blocks, kb = item % p.blocks;
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
          auto* dst = const_cast<at::BFloat16*>(p.k_tile(h, kb, sub, c));
          for (int kk = 0; kk < 16; ++kk) _mm512_storeu_si512(dst + 32 * kk, w[kk]);
        }
      for (int64_t half = 0; half < 2; ++half)
        for (int64_t c = 0; c < p.dv; ++c) {
          auto* dst = const_cast<at::BFloat16*>(p.v_tile(h, kb, half, c));
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
  });
  return p;
}

// Lane r of each vector is query row r of the task.
struct RowState {
  __m512 m;  // the running maximum (scaled, base 2) the probabilities are taken against
  __m512 l;  // sum of probabilities
  int32_t last_key[kRows];  // the last key each row sees
};

struct Sum {
  static __m512 op(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
};
struct Max {
  static __m512 op(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
};

// Lane t: v[t]'s lanes reduced by Op (a transpose folded into the reduction).
template <typename Op>
inline __m512 across_rows(const __m512* v) {
  __m512 r[8], s[4];
  for (int i = 0; i < 8; ++i)
    r[i] = Op::op(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int j = 0; j < 4; ++j)
    s[j] = Op::op(_mm512_shuffle_ps(r[2 * j], r[2 * j + 1], 0x44), _mm512_shuffle_ps(r[2 * j], r[2 * j + 1], 0xEE));
  const __m512 t0 = Op::op(_mm512_shuffle_f32x4(s[0], s[1], 0x88), _mm512_shuffle_f32x4(s[0], s[1], 0xDD));
  const __m512 t1 = Op::op(_mm512_shuffle_f32x4(s[2], s[3], 0x88), _mm512_shuffle_f32x4(s[2], s[3], 0xDD));
  return Op::op(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD));
}

inline __mmask16 visible(int64_t key0, int32_t last_key) {
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i key = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int>(key0)));
  return _mm512_cmple_epi32_mask(key, _mm512_set1_epi32(last_key));
}

// A row's maximum moves only when the block's exceeds it by more than this (base 2): the
// probabilities stay below 2^8 and the output is rescaled a few times per row, not per block.
constexpr float kSlack = 8.f;

// One softmax step over a 64-key block: scores s (16 x 64, unscaled) -> probabilities pb
// (bf16, 16 x 64). Returns the rows whose maximum moved, with their factors in alpha.
__mmask16 softmax_step(const float* s, at::BFloat16* pb, int64_t key0, bool mask, float scale_log2, RowState& st,
                       __m512& alpha) {
  __m512 row_max[kRows];
  for (int r = 0; r < kRows; ++r) {
    __m512 x[4];
    for (int c = 0; c < 4; ++c) {
      x[c] = _mm512_loadu_ps(s + r * kKeys + 16 * c);
      if (mask) x[c] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), visible(key0 + 16 * c, st.last_key[r]), x[c]);
    }
    row_max[r] = _mm512_max_ps(_mm512_max_ps(x[0], x[1]), _mm512_max_ps(x[2], x[3]));
  }
  const __m512 bmax = _mm512_mul_ps(across_rows<Max>(row_max), _mm512_set1_ps(scale_log2));
  const __mmask16 moved = _mm512_cmp_ps_mask(bmax, _mm512_add_ps(st.m, _mm512_set1_ps(kSlack)), _CMP_GT_OQ);
  if (moved) {
    const __m512 m_new = _mm512_mask_mov_ps(st.m, moved, bmax);
    // 0 where m was -inf (the first block): clamped, as exp2_neg takes no -inf.
    alpha = exp2_neg(_mm512_max_ps(_mm512_sub_ps(st.m, m_new), _mm512_set1_ps(-150.f)));
    st.l = _mm512_mul_ps(st.l, alpha);
    st.m = m_new;
  }
  alignas(64) float m[kRows];
  _mm512_store_ps(m, st.m);
  __m512 sums[kRows];
  const __m512 c = _mm512_set1_ps(scale_log2);
  for (int r = 0; r < kRows; ++r) {
    const __m512 neg_m = _mm512_set1_ps(-m[r]);
    __m512 sum = _mm512_setzero_ps();
    for (int cc = 0; cc < 4; cc += 2) {
      __m512 p0 = exp2_neg(_mm512_fmadd_ps(_mm512_loadu_ps(s + r * kKeys + 16 * cc), c, neg_m));
      __m512 p1 = exp2_neg(_mm512_fmadd_ps(_mm512_loadu_ps(s + r * kKeys + 16 * cc + 16), c, neg_m));
      if (mask) {
        p0 = _mm512_maskz_mov_ps(visible(key0 + 16 * cc, st.last_key[r]), p0);
        p1 = _mm512_maskz_mov_ps(visible(key0 + 16 * cc + 16, st.last_key[r]), p1);
      }
      sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
      _mm512_storeu_si512(pb + r * kKeys + 16 * cc, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    }
    sums[r] = sum;
  }
  st.l = _mm512_add_ps(st.l, across_rows<Sum>(sums));
  return moved;
}

// Multiplies output row r (16 x D floats) by lane r of alpha, for the rows in `rows`.
void rescale_rows(float* o, int64_t D, __mmask16 rows, __m512 alpha) {
  alignas(64) float a[kRows];
  _mm512_store_ps(a, alpha);
  for (int r = 0; r < kRows; ++r) {
    if (!((rows >> r) & 1)) continue;
    const __m512 f = _mm512_set1_ps(a[r]);
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(o + r * D + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * D + d), f));
  }
}

// S (16 x 64) = Q K^T for one key block, into s.
inline void scores(const at::BFloat16* qt, int64_t D, const Packed& kv, int64_t h, int64_t kb, float* s) {
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
void accumulate_in_memory(float* o, int64_t D, const at::BFloat16* pb, const Packed& kv, int64_t h, int64_t kb) {
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

// One task's rows against key blocks [0, kb_end) of the packed K/V: the output rows are
// left unnormalised in o (16 x D), the running maximum and sum in st.
template <int DV>  // DV = head_dim / 16 where the output stays in tiles (1..4); 0: in memory
void tile_pass(const at::BFloat16* qt, int64_t D, const Packed& kv, int64_t h, int64_t kb_end, float scale_log2,
               RowState& st, float* o, float* s, at::BFloat16* pb) {
  st.m = _mm512_set1_ps(-INFINITY);
  st.l = _mm512_setzero_ps();
  if constexpr (DV > 0) ResidentOut<DV>::zero();
  else std::fill(o, o + kRows * D, 0.f);
  const int64_t first_last = st.last_key[0];
  for (int64_t kb = 0; kb < kb_end; ++kb) {
    scores(qt, D, kv, h, kb, s);
    __m512 alpha;
    const bool mask = (kb + 1) * kKeys - 1 > first_last;
    const __mmask16 moved = softmax_step(s, pb, kb * kKeys, mask, scale_log2, st, alpha);
    if constexpr (DV > 0) {
      if (moved && kb > 0) {
        ResidentOut<DV>::store(o);
        rescale_rows(o, D, moved, alpha);
        ResidentOut<DV>::load(o);
      }
      ResidentOut<DV>::accumulate(pb, kv, h, kb);
    } else {
      if (moved && kb > 0) rescale_rows(o, D, moved, alpha);
      accumulate_in_memory(o, D, pb, kv, h, kb);
    }
  }
  if constexpr (DV > 0) ResidentOut<DV>::store(o);
}

// Rows of a task: (position or decode row i, query head g) pairs of KV head h, r = i * G + g.
struct TaskRows {
  const at::BFloat16* q;
  int64_t qs0, qs1, G, R, D;
  // Copies the task's query rows into qt (rows past R: zeros) and returns how many are real.
  int load(int64_t h, int64_t r0, at::BFloat16* qt) const {
    for (int r = 0; r < kRows; ++r) {
      if (r0 + r < R) {
        const int64_t i = (r0 + r) / G, g = (r0 + r) % G;
        std::memcpy(qt + r * D, q + i * qs0 + (h * G + g) * qs1, D * sizeof(at::BFloat16));
      } else {
        std::memset(qt + r * D, 0, D * sizeof(at::BFloat16));
      }
    }
    return static_cast<int>(std::min<int64_t>(kRows, R - r0));
  }
};

// out row = o row / l, rounded to bf16.
inline void write_row(const float* o, float l, int64_t D, at::BFloat16* dst) {
  const __m512 inv = _mm512_set1_ps(1.f / l);
  for (int64_t d = 0; d < D; d += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(o + d), inv);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), (__m256i)_mm512_cvtneps_pbh(v));
  }
}

template <int DV>
void attend_chunk(const at::Tensor& q, const Packed& kv, int64_t KVH, int64_t start, float scale, at::Tensor& out) {
  const int64_t L = q.size(0), H = q.size(1), D = q.size(2), G = H / KVH;
  const TaskRows rows{q.data_ptr<at::BFloat16>(), q.stride(0), q.stride(1), G, L * G, D};
  const int64_t tiles = (rows.R + kRows - 1) / kRows;
  auto* op = out.data_ptr<at::BFloat16>();
  const float scale_log2 = scale * 1.4426950408889634f;
  at::parallel_for(0, KVH * tiles, 1, [&](int64_t begin, int64_t end) {
    configure_tiles();
    std::vector<at::BFloat16> qt(kRows * D), pb(kRows * kKeys);
    std::vector<float> s(kRows * kKeys), o(kRows * D);
    RowState st;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / tiles, r0 = (item % tiles) * kRows;
      const int real = rows.load(h, r0, qt.data());
      // Query i sees keys ..= start + i; rows past the end see what the last real one sees.
      for (int r = 0; r < kRows; ++r) st.last_key[r] = static_cast<int32_t>(start + (r0 + std::min(r, real - 1)) / G);
      tile_pass<DV>(qt.data(), D, kv, h, st.last_key[kRows - 1] / kKeys + 1, scale_log2, st, o.data(), s.data(),
                    pb.data());
      alignas(64) float l[kRows];
      _mm512_store_ps(l, st.l);
      for (int r = 0; r < real; ++r) {
        const int64_t i = (r0 + r) / G, g = (r0 + r) % G;
        write_row(o.data() + r * D, l[r], D, op + i * out.stride(0) + (h * G + g) * out.stride(1));
      }
    }
    _tile_release();
  });
}

// Continues one row's online softmax (maximum m, sum l, output orow) over its own keys
// [from, len) of the block table, 16 at a time: scores by bf16 dot products, one transpose.
void own_keys(const at::BFloat16* qrow, int64_t D, const at::BFloat16* k_head, const at::BFloat16* v_head,
              const int64_t* table, int64_t BS, int64_t from, int64_t len, float scale_log2, float& m, float& l,
              float* orow) {
  for (int64_t t0 = from; t0 < len; t0 += 16) {
    const int cnt = static_cast<int>(std::min<int64_t>(16, len - t0));
    int64_t off[16];
    __m512 part[16];
    for (int j = 0; j < 16; ++j) {
      part[j] = _mm512_setzero_ps();
      if (j >= cnt) continue;
      const int64_t t = t0 + j;
      off[j] = (table[t / BS] * BS + t % BS) * D;
      for (int64_t d = 0; d < D; d += 32)
        part[j] = _mm512_dpbf16_ps(part[j], (__m512bh)_mm512_loadu_si512(qrow + d),
                                   (__m512bh)_mm512_loadu_si512(k_head + off[j] + d));
    }
    const __mmask16 keep = cnt == 16 ? 0xFFFF : static_cast<__mmask16>((1u << cnt) - 1);
    const __m512 x = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), keep,
                                        _mm512_mul_ps(across_rows<Sum>(part), _mm512_set1_ps(scale_log2)));
    const float block_max = _mm512_reduce_max_ps(x);
    if (block_max > m) {  // rare once the shared keys are in: move the maximum exactly
      const float alpha = std::exp2(m - block_max);
      l *= alpha;
      for (int64_t d = 0; d < D; d += 16)
        _mm512_storeu_ps(orow + d, _mm512_mul_ps(_mm512_loadu_ps(orow + d), _mm512_set1_ps(alpha)));
      m = block_max;
    }
    const __m512 p = _mm512_maskz_mov_ps(keep, exp2_neg(_mm512_sub_ps(x, _mm512_set1_ps(m))));
    l += _mm512_reduce_add_ps(p);
    alignas(64) float pa[16];
    _mm512_store_ps(pa, p);
    for (int j = 0; j < cnt; ++j) {
      const __m512 pj = _mm512_set1_ps(pa[j]);
      for (int64_t d = 0; d < D; d += 16) {
        const __m512 v = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(v_head + off[j] + d))), 16));
        _mm512_storeu_ps(orow + d, _mm512_fmadd_ps(pj, v, _mm512_loadu_ps(orow + d)));
      }
    }
  }
}

// Decode rows whose first `shared` keys are the same cached blocks (a shared system prompt):
// the shared keys on tiles for every row at once, then each row's own keys one by one.
template <int DV>
void attend_shared_decode(const at::Tensor& q, const Packed& kv, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const int64_t* tables, int64_t max_blocks, const int32_t* lens, int64_t shared, float scale,
                          at::Tensor& out) {
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(0), G = H / KVH;
  const int64_t NB = k_cache.size(1), BS = k_cache.size(2);
  const TaskRows rows{q.data_ptr<at::BFloat16>(), q.stride(0), q.stride(1), G, n * G, D};
  const int64_t tiles = (rows.R + kRows - 1) / kRows;
  const auto* kc = k_cache.data_ptr<at::BFloat16>();
  const auto* vc = v_cache.data_ptr<at::BFloat16>();
  auto* op = out.data_ptr<at::BFloat16>();
  const float scale_log2 = scale * 1.4426950408889634f;
  at::parallel_for(0, KVH * tiles, 1, [&](int64_t begin, int64_t end) {
    configure_tiles();
    std::vector<at::BFloat16> qt(kRows * D), pb(kRows * kKeys);
    std::vector<float> s(kRows * kKeys), o(kRows * D);
    RowState st;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / tiles, r0 = (item % tiles) * kRows;
      const int real = rows.load(h, r0, qt.data());
      for (int r = 0; r < kRows; ++r) st.last_key[r] = static_cast<int32_t>(shared - 1);
      tile_pass<DV>(qt.data(), D, kv, h, (shared + kKeys - 1) / kKeys, scale_log2, st, o.data(), s.data(), pb.data());
      alignas(64) float m[kRows], l[kRows];
      _mm512_store_ps(m, st.m);
      _mm512_store_ps(l, st.l);
      for (int r = 0; r < real; ++r) {
        const int64_t i = (r0 + r) / G, g = (r0 + r) % G;
        const int64_t* table = tables + i * max_blocks;
        float* orow = o.data() + r * D;
        const at::BFloat16* qrow = qt.data() + r * D;
        float mr = m[r], lr = l[r];
        own_keys(qrow, D, kc + h * NB * BS * D, vc + h * NB * BS * D, table, BS, shared, lens[i], scale_log2, mr, lr,
                 orow);
        write_row(orow, lr, D, op + i * out.stride(0) + (h * G + g) * out.stride(1));
      }
    }
    _tile_release();
  });
}

#endif  // TIDE_AMX

bool prefill_attention_supported() {
#if defined(TIDE_AMX)
  return tiles_granted();
#else
  return false;
#endif
}

void check_inputs(const char* op, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache) {
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

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& block_table, int64_t start_pos, double scale) {
  TORCH_CHECK(prefill_attention_supported(), "prefill_attention: this build or CPU has no AMX tiles");
  check_inputs("prefill_attention", q, k_cache, v_cache);
  const int64_t L = q.size(0), KVH = k_cache.size(0), BS = k_cache.size(2);
  TORCH_CHECK(block_table.scalar_type() == at::kLong && block_table.is_contiguous(),
              "prefill_attention: block_table int64, contiguous");
  const int64_t ctx = start_pos + L;
  TORCH_CHECK(start_pos >= 0 && block_table.numel() * BS >= ctx, "prefill_attention: block_table covers ",
              block_table.numel() * BS, " tokens, the chunk needs ", ctx);
  at::Tensor out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
#if defined(TIDE_AMX)
  if (L == 0) return out;
  const Packed kv = pack_kv(k_cache, v_cache, block_table.data_ptr<int64_t>(), ctx);
  const float fscale = static_cast<float>(scale);
  switch (q.size(2)) {
    case 32: attend_chunk<2>(q, kv, KVH, start_pos, fscale, out); break;
    case 64: attend_chunk<4>(q, kv, KVH, start_pos, fscale, out); break;
    default: attend_chunk<0>(q, kv, KVH, start_pos, fscale, out);
  }
#endif
  return out;
}

at::Tensor decode_shared_prefix(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t shared,
                                double scale) {
  TORCH_CHECK(prefill_attention_supported(), "decode_shared_prefix: this build or CPU has no AMX tiles");
  check_inputs("decode_shared_prefix", q, k_cache, v_cache);
  const int64_t n = q.size(0), BS = k_cache.size(2);
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous() && block_tables.dim() == 2 &&
                  block_tables.size(0) == n,
              "decode_shared_prefix: block_tables must be contiguous int64 [n, max_blocks]");
  TORCH_CHECK(context_lens.scalar_type() == at::kInt && context_lens.is_contiguous() && context_lens.numel() == n,
              "decode_shared_prefix: context_lens must be contiguous int32 [n]");
  TORCH_CHECK(n > 0 && shared > 0 && shared % BS == 0 && shared / BS <= block_tables.size(1),
              "decode_shared_prefix: shared must be a positive multiple of block_size within the tables, got ", shared);
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  const int64_t max_blocks = block_tables.size(1);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(lens[i] >= shared && lens[i] <= max_blocks * BS, "decode_shared_prefix: row ", i, " has context ",
                lens[i], ", outside ", shared, "..", max_blocks * BS);
    TORCH_CHECK(std::equal(tables, tables + shared / BS, tables + i * max_blocks),
                "decode_shared_prefix: row ", i, " does not share the first ", shared / BS, " blocks of row 0");
  }
  at::Tensor out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
#if defined(TIDE_AMX)
  const Packed kv = pack_kv(k_cache, v_cache, tables, shared);
  const float fscale = static_cast<float>(scale);
  switch (q.size(2)) {
    case 32: attend_shared_decode<2>(q, kv, k_cache, v_cache, tables, max_blocks, lens, shared, fscale, out); break;
    case 64: attend_shared_decode<4>(q, kv, k_cache, v_cache, tables, max_blocks, lens, shared, fscale, out); break;
    default: attend_shared_decode<0>(q, kv, k_cache, v_cache, tables, max_blocks, lens, shared, fscale, out);
  }
#endif
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def("decode_shared_prefix(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, "
        "int shared, float scale) -> Tensor");
  m.def("prefill_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, int start_pos, "
        "float scale) -> Tensor");
  m.def("prefill_attention_supported() -> bool", &prefill_attention_supported);
}

TORCH_LIBRARY_IMPL(tide, CPU, m) {
  m.impl("prefill_attention", &prefill_attention);
  m.impl("decode_shared_prefix", &decode_shared_prefix);
}
