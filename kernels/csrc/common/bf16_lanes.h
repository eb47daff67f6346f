// 16 fp32 lanes from and to the engine's dtypes (AVX-512), shared by decode attention
// (attention/decode_avx512.h) and the fused elementwise ops (elementwise/elementwise.cpp).
#pragma once

#include <ATen/ATen.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace tide_lanes {

template <typename T>
inline float to_float(T v) {
  return static_cast<float>(v);
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
#if defined(__AVX512BF16__)
inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }
inline __m512 widen_bf16(__m256bh v) {
  const __m256i raw = reinterpret_cast<const __m256i&>(v);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
// 16 floats to T, rounded to nearest even as static_cast<T> rounds them.
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(at::BFloat16* p, __m512 v) {
  const __m256bh r = _mm512_cvtneps_pbh(v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<const __m256i&>(r));
}
#endif
inline __m512 load16(const at::BFloat16* p) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
#endif

}  // namespace tide_lanes
