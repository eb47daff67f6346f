// e^x and SiLU(gate) * up on 16 fp32 lanes, shared by silu_mul (elementwise/elementwise.cpp)
// and the GEMV's and GEMM's fused gate|up epilogue (gate_up_silu_bf16), so both round alike.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

namespace tide_vec {

// e^x as 2^n * e^r with |r| <= ln2/2 and a degree-6 Taylor polynomial, relative error
// about 1e-7; inputs below -87 give e^-87, large ones overflow to inf.
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// gate / (1 + e^-gate), in fp32.
inline __m512 silu512(__m512 gate) {
  return _mm512_div_ps(gate, _mm512_add_ps(_mm512_set1_ps(1.f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), gate))));
}

#if defined(__AVX512BF16__)
// bf16 SiLU(gate) * up as torch spells it in bf16: gate and up already bf16 values (in
// fp32 lanes), the SiLU rounded to bf16 before the multiply, the product rounded once.
inline __m256bh silu_mul_bf16(__m512 gate, __m512 up) {
  const __m256bh act = _mm512_cvtneps_pbh(silu512(gate));
  const __m512 actf = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(act)), 16));
  return _mm512_cvtneps_pbh(_mm512_mul_ps(actf, up));
}
#endif

}  // namespace tide_vec

#endif
