// The batched LoRA delta on CPU (op lora: cpp), a torch op "tide::lora_add_": each token row
// under an adapter slot gets, per sub-module i of the projection,
//   y[r, lo_i:hi_i] += (x[r] . a[s, i*R:(i+1)*R]^T) . b[s, lo_i:hi_i]^T
// in blocks of up to four rows under one adapter: the rows widened to float once, the rank
// products (shrink) as dot products over a's rows, then the expand as axpys over b's
// rank-major rows (b stored [slots, R, out], given as its [slots, out, R] view), all in
// float and rounded into y once. Each of a's and b's rows is read once per block, into
// four independent FMA chains; blocks run in parallel. kernels/lora.py documents the layout.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "common/bf16_lanes.h"

namespace {

constexpr int64_t RB = 4;  // rows of one adapter per pass: four independent FMA chains
constexpr int64_t CT = 32;  // output columns per expand tile

// One block of up to RB rows under the same slot (entries [e0, e0 + nb) of order).
template <typename T>
void lora_block(T* yp, const T* xp, const T* as_, const T* bs_, int64_t xs, int64_t ys, int64_t br,
                int64_t in, int64_t ranks, int64_t rank, const std::vector<int64_t>& lo,
                const std::vector<int64_t>& hi, const int64_t* rows, int64_t nb, float* xf, float* t) {
  for (int64_t r = 0; r < RB; ++r) {
    const T* xr = xp + rows[r < nb ? r : 0] * xs;
    for (int64_t k = 0; k < in; ++k) xf[r * in + k] = static_cast<float>(xr[k]);
  }
  const float *x0 = xf, *x1 = xf + in, *x2 = xf + 2 * in, *x3 = xf + 3 * in;
  for (int64_t j = 0; j < ranks; ++j) {
    const T* arow = as_ + j * in;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t k = 0; k < in; ++k) {
      const float av = static_cast<float>(arow[k]);
      s0 += av * x0[k];
      s1 += av * x1[k];
      s2 += av * x2[k];
      s3 += av * x3[k];
    }
    t[j] = s0, t[ranks + j] = s1, t[2 * ranks + j] = s2, t[3 * ranks + j] = s3;
  }
  for (size_t i = 0; i < lo.size(); ++i) {
    const float* tq[RB];
    for (int64_t r = 0; r < RB; ++r) tq[r] = t + r * ranks + static_cast<int64_t>(i) * rank;
    const T* bsub = bs_ + lo[i];
    const int64_t width = hi[i] - lo[i];
    // Column tiles of CT: the block's RB x CT sums stay in registers over the rank loop.
    for (int64_t c0 = 0; c0 < width; c0 += CT) {
      const int64_t cw = std::min(CT, width - c0);
      float sum[RB][CT] = {};
      for (int64_t j = 0; j < rank; ++j) {
        const T* brow = bsub + j * br + c0;
        const float t0 = tq[0][j], t1 = tq[1][j], t2 = tq[2][j], t3 = tq[3][j];
        if (cw == CT) {
#pragma omp simd
          for (int64_t c = 0; c < CT; ++c) {
            const float bv = static_cast<float>(brow[c]);
            sum[0][c] += t0 * bv, sum[1][c] += t1 * bv, sum[2][c] += t2 * bv, sum[3][c] += t3 * bv;
          }
        } else {
          for (int64_t c = 0; c < cw; ++c) {
            const float bv = static_cast<float>(brow[c]);
            sum[0][c] += t0 * bv, sum[1][c] += t1 * bv, sum[2][c] += t2 * bv, sum[3][c] += t3 * bv;
          }
        }
      }
      for (int64_t r = 0; r < nb; ++r) {
        T* yo = yp + rows[r] * ys + lo[i] + c0;
        for (int64_t c = 0; c < cw; ++c) yo[c] = static_cast<T>(static_cast<float>(yo[c]) + sum[r][c]);
      }
    }
  }
}

#if defined(__AVX512BF16__)
using namespace tide_lanes;

// lora_block for bf16 rows on AVX-512 BF16 (in % 32 == 0, every sub's width % 16 == 0): the
// shrink as vdpbf16ps dot products straight from the bf16 rows, the expand as 16-lane FMAs
// whose RB x 16 sums stay in registers over the rank loop.
void lora_block_bf16(at::BFloat16* yp, const at::BFloat16* xp, const at::BFloat16* as_, const at::BFloat16* bs_,
                     int64_t xs, int64_t ys, int64_t br, int64_t in, int64_t ranks, int64_t rank,
                     const std::vector<int64_t>& lo, const std::vector<int64_t>& hi, const int64_t* rows,
                     int64_t nb, float* t) {
  const at::BFloat16* xr[RB];
  for (int64_t r = 0; r < RB; ++r) xr[r] = xp + rows[r < nb ? r : 0] * xs;
  for (int64_t j = 0; j < ranks; ++j) {
    const at::BFloat16* arow = as_ + j * in;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t k = 0; k < in; k += 32) {
      const __m512bh av = as_bh(_mm512_loadu_si512(arow + k));
      s0 = _mm512_dpbf16_ps(s0, av, as_bh(_mm512_loadu_si512(xr[0] + k)));
      s1 = _mm512_dpbf16_ps(s1, av, as_bh(_mm512_loadu_si512(xr[1] + k)));
      s2 = _mm512_dpbf16_ps(s2, av, as_bh(_mm512_loadu_si512(xr[2] + k)));
      s3 = _mm512_dpbf16_ps(s3, av, as_bh(_mm512_loadu_si512(xr[3] + k)));
    }
    t[j] = _mm512_reduce_add_ps(s0), t[ranks + j] = _mm512_reduce_add_ps(s1);
    t[2 * ranks + j] = _mm512_reduce_add_ps(s2), t[3 * ranks + j] = _mm512_reduce_add_ps(s3);
  }
  for (size_t i = 0; i < lo.size(); ++i) {
    const float* tq = t + static_cast<int64_t>(i) * rank;
    for (int64_t c = lo[i]; c < hi[i]; c += 16) {
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t j = 0; j < rank; ++j) {
        const __m512 bv = load16(bs_ + j * br + c);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(tq[j]), bv, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(tq[ranks + j]), bv, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(tq[2 * ranks + j]), bv, a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(tq[3 * ranks + j]), bv, a3);
      }
      const __m512 sums[RB] = {a0, a1, a2, a3};
      for (int64_t r = 0; r < nb; ++r) {
        at::BFloat16* yo = yp + rows[r] * ys + c;
        store16(yo, _mm512_add_ps(load16(yo), sums[r]));
      }
    }
  }
}
#endif

template <typename T>
void lora_rows(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b,
               const std::vector<int64_t>& lo, const std::vector<int64_t>& hi, const int64_t* order,
               const std::vector<int64_t>& block_start, const std::vector<int64_t>& block_len,
               const std::vector<int64_t>& block_slot) {
  const int64_t in = x.size(1), ranks = a.size(1), rank = b.size(2);
  const T* xp = x.data_ptr<T>();
  const T* ap = a.data_ptr<T>();
  const T* bp = b.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const int64_t xs = x.stride(0), ys = y.stride(0), as = a.stride(0), bs = b.stride(0), br = b.stride(2);
  const int64_t blocks = static_cast<int64_t>(block_start.size());
  [[maybe_unused]] bool lanes = false;  // the AVX-512 BF16 block fits these shapes
#if defined(__AVX512BF16__)
  lanes = std::is_same_v<T, at::BFloat16> && in % 32 == 0;
  for (size_t i = 0; i < lo.size(); ++i) lanes = lanes && (hi[i] - lo[i]) % 16 == 0 && lo[i] % 16 == 0;
#endif
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> xf(RB * in), t(RB * ranks);
    for (int64_t k = begin; k < end; ++k) {
      const int64_t slot = block_slot[k];
#if defined(__AVX512BF16__)
      if constexpr (std::is_same_v<T, at::BFloat16>) {
        if (lanes) {
          lora_block_bf16(yp, xp, ap + slot * as, bp + slot * bs, xs, ys, br, in, ranks, rank, lo, hi,
                          order + block_start[k], block_len[k], t.data());
          continue;
        }
      }
#endif
      lora_block<T>(yp, xp, ap + slot * as, bp + slot * bs, xs, ys, br, in, ranks, rank, lo, hi,
                    order + block_start[k], block_len[k], xf.data(), t.data());
    }
  });
}

void lora_add_(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b,
               at::IntArrayRef sub_lo, at::IntArrayRef sub_hi, const at::Tensor& order,
               const at::Tensor& seg_start, const at::Tensor& seg_len, const at::Tensor& seg_slot) {
  TORCH_CHECK(x.scalar_type() == y.scalar_type() && a.scalar_type() == y.scalar_type() &&
                  b.scalar_type() == y.scalar_type(),
              "lora_add_: y, x, a and b share one dtype");
  TORCH_CHECK(x.stride(1) == 1 && y.stride(1) == 1 && a.is_contiguous(), "lora_add_: rows contiguous");
  TORCH_CHECK(b.stride(1) == 1, "lora_add_: b must be stored rank-major ([slots, R, out])");
  TORCH_CHECK(sub_lo.size() == sub_hi.size(), "lora_add_: one hi per lo");
  const int64_t segments = seg_slot.numel();
  const int64_t *st = seg_start.data_ptr<int64_t>(), *ln = seg_len.data_ptr<int64_t>(),
                *sl = seg_slot.data_ptr<int64_t>();
  std::vector<int64_t> block_start, block_len, block_slot;  // each segment in blocks of RB rows
  for (int64_t s = 0; s < segments; ++s)
    for (int64_t e = st[s]; e < st[s] + ln[s]; e += RB) {
      block_start.push_back(e);
      block_len.push_back(std::min(RB, st[s] + ln[s] - e));
      block_slot.push_back(sl[s]);
    }
  std::vector<int64_t> lo(sub_lo.begin(), sub_lo.end()), hi(sub_hi.begin(), sub_hi.end());
  const int64_t* ord = order.data_ptr<int64_t>();
  if (y.scalar_type() == at::kFloat)
    lora_rows<float>(y, x, a, b, lo, hi, ord, block_start, block_len, block_slot);
  else if (y.scalar_type() == at::kBFloat16)
    lora_rows<at::BFloat16>(y, x, a, b, lo, hi, ord, block_start, block_len, block_slot);
  else
    TORCH_CHECK(false, "lora_add_: float32 or bfloat16, got ", y.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tide, m) {
  m.def(
      "lora_add_(Tensor(a!) y, Tensor x, Tensor a, Tensor b, int[] sub_lo, int[] sub_hi, Tensor order, "
      "Tensor seg_start, Tensor seg_len, Tensor seg_slot) -> ()");
}

TORCH_LIBRARY_IMPL(tide, CPU, m) { m.impl("lora_add_", &lora_add_); }
