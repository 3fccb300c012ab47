// MLX's CPU exp polynomial on 16 lanes (AVX-512), shared by the attention and row-wise kernels.
#pragma once
#include <immintrin.h>

namespace mlxcel {

// exp(x) for x already in [-88, 88]: x*log2(e) = n + f with |f| <= 1/2, 2^n * P(f) with MLX's
// CPU coefficients; 2^n is built in the exponent field (n = -127 leaves it 0, so the result is 0)
inline __m512 exp_poly_ps(__m512 x) {
  const __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(1.442695f));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

}  // namespace mlxcel
