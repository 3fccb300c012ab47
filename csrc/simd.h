// 16 float lanes for the kernels, on AVX-512 (one zmm) or AVX2 (two ymm), with the same
// arithmetic: every op is lane-wise IEEE float32 (add, mul, fma, div, max, round-to-nearest-even
// conversions), and the two horizontal sums (reduce_add, hsum16) add in one fixed tree written out
// here for both ISAs. So a kernel written once against these types gives the same bits on either
// ISA, and its row-exactness (a row's sums in an order fixed by its own sizes) holds on both.
//
// Included by the kernel files after isa_begin.h (which picks the ISA and its target pragma);
// everything is in namespace mlxcel::MLXCEL_ISA, so the two builds of a kernel file never share an
// inline function compiled for the other ISA.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace mlxcel {
namespace MLXCEL_ISA {

#if MLXCEL_ISA_AVX512
struct vf {
  __m512 v;
};
struct vi {
  __m512i v;
};
inline vf zero() { return {_mm512_setzero_ps()}; }
inline vf set1(float x) { return {_mm512_set1_ps(x)}; }
inline vf load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store(float* p, vf a) { _mm512_storeu_ps(p, a.v); }
inline __mmask16 first(int n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << n) - 1);
}
// the first n lanes (n <= 16), the others 0; nothing past them is read
inline vf load_n(const float* p, int n) { return {_mm512_maskz_loadu_ps(first(n), p)}; }
inline void store_n(float* p, vf a, int n) { _mm512_mask_storeu_ps(p, first(n), a.v); }
inline vf load_half_n(const uint16_t* p, int n) { return {_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first(n), p))}; }
// 16 bfloat16 values as float32 (exact: a bfloat16 is the top half of a float32)
inline vf load_bf16(const uint16_t* p) {
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16))};
}
inline vf add(vf a, vf b) { return {_mm512_add_ps(a.v, b.v)}; }
inline vf sub(vf a, vf b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline vf mul(vf a, vf b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline vf div(vf a, vf b) { return {_mm512_div_ps(a.v, b.v)}; }
inline vf fmadd(vf a, vf b, vf c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }  // a * b + c, one rounding
inline vf max(vf a, vf b) { return {_mm512_max_ps(a.v, b.v)}; }
inline vf min(vf a, vf b) { return {_mm512_min_ps(a.v, b.v)}; }
inline vf abs(vf a) { return {_mm512_abs_ps(a.v)}; }
inline vf round_even(vf a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline vi to_int(vf a) { return {_mm512_cvtps_epi32(a.v)}; }  // MXCSR: round to nearest even
inline vf to_float(vi a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline vf bits_float(vi a) { return {_mm512_castsi512_ps(a.v)}; }
inline vi add(vi a, vi b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline vi set1i(int x) { return {_mm512_set1_epi32(x)}; }
template <int S>
inline vi shl(vi a) { return {_mm512_slli_epi32(a.v, S)}; }
inline vi clamp(vi a, int lo, int hi) { return {_mm512_max_epi32(_mm512_min_epi32(a.v, _mm512_set1_epi32(hi)), _mm512_set1_epi32(lo))}; }
// lanes where x >= t keep r, the others are 0
inline vf keep_ge(vf x, float t, vf r) { return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x.v, _mm512_set1_ps(t), _CMP_GE_OQ), r.v)}; }
// the first n lanes of a, the others 0
inline vf keep_n(vf a, int n) { return {_mm512_maskz_mov_ps(first(n), a.v)}; }
// lanes < n: max(acc, x); the others acc
inline vf max_n(vf acc, vf x, int n) { return {_mm512_mask_max_ps(acc.v, first(n), acc.v, x.v)}; }
inline float lane0(vf a) { return _mm512_cvtss_f32(a.v); }
// the two 8-lane halves (lanes 0-7, 8-15)
inline __m256 lo8(vf a) { return _mm512_castps512_ps256(a.v); }
inline __m256 hi8(vf a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)); }
inline int reduce_add(vi a) { return _mm512_reduce_add_epi32(a.v); }  // integers: any order
inline float reduce_max(vf a) { return _mm512_reduce_max_ps(a.v); }   // max: any order
// 32 int32 values (each within int8) to 32 int8, in order
inline void store_i8(int8_t* p, vi a, vi b) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(a.v));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 16), _mm512_cvtepi32_epi8(b.v));
}
#else
struct vf {
  __m256 lo, hi;
};
struct vi {
  __m256i lo, hi;
};
inline vf zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline vf set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline vf load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store(float* p, vf a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
// lane masks for maskload/maskstore: the first n of 8 lanes
inline __m256i first8(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline vf load_n(const float* p, int n) {
  if (n >= 16) return load(p);
  return {_mm256_maskload_ps(p, first8(n)), _mm256_maskload_ps(p + 8, first8(n - 8))};
}
inline void store_n(float* p, vf a, int n) {
  if (n >= 16) return store(p, a);
  _mm256_maskstore_ps(p, first8(n), a.lo);
  _mm256_maskstore_ps(p + 8, first8(n - 8), a.hi);
}
inline vf load_half_n(const uint16_t* p, int n) {
  __m256i h;
  if (n >= 16) {  // every block of a full row group: no copy
    h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {  // no 16-bit masked load in AVX2: the last partial group goes through a zeroed copy
    alignas(32) uint16_t buf[16] = {};
    std::memcpy(buf, p, sizeof(uint16_t) * (n > 0 ? n : 0));
    h = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
  }
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}
// (a function, not a lambda: a lambda does not take the file's target pragma)
inline __m256 bf16x8(const uint16_t* q) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))), 16));
}
inline vf load_bf16(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
inline vf add(vf a, vf b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline vf sub(vf a, vf b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline vf mul(vf a, vf b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline vf div(vf a, vf b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline vf fmadd(vf a, vf b, vf c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
// vmaxps/vminps: the second operand when either is NaN or both are zeros, as on AVX-512
inline vf max(vf a, vf b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline vf min(vf a, vf b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline vf abs(vf a) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
inline vf round_even(vf a) {
  return {_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
          _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline vi to_int(vf a) { return {_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }
inline vf to_float(vi a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline vf bits_float(vi a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
inline vi add(vi a, vi b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline vi set1i(int x) { return {_mm256_set1_epi32(x), _mm256_set1_epi32(x)}; }
template <int S>
inline vi shl(vi a) { return {_mm256_slli_epi32(a.lo, S), _mm256_slli_epi32(a.hi, S)}; }
inline vi clamp(vi a, int lo, int hi) {
  const __m256i l = _mm256_set1_epi32(lo), h = _mm256_set1_epi32(hi);
  return {_mm256_max_epi32(_mm256_min_epi32(a.lo, h), l), _mm256_max_epi32(_mm256_min_epi32(a.hi, h), l)};
}
inline vf keep_ge(vf x, float t, vf r) {
  const __m256 tv = _mm256_set1_ps(t);
  return {_mm256_and_ps(_mm256_cmp_ps(x.lo, tv, _CMP_GE_OQ), r.lo), _mm256_and_ps(_mm256_cmp_ps(x.hi, tv, _CMP_GE_OQ), r.hi)};
}
inline vf keep_n(vf a, int n) {
  return {_mm256_and_ps(_mm256_castsi256_ps(first8(n)), a.lo), _mm256_and_ps(_mm256_castsi256_ps(first8(n - 8)), a.hi)};
}
inline vf max_n(vf acc, vf x, int n) {
  return {_mm256_blendv_ps(acc.lo, _mm256_max_ps(acc.lo, x.lo), _mm256_castsi256_ps(first8(n))),
          _mm256_blendv_ps(acc.hi, _mm256_max_ps(acc.hi, x.hi), _mm256_castsi256_ps(first8(n - 8)))};
}
inline float lane0(vf a) { return _mm256_cvtss_f32(a.lo); }
inline __m256 lo8(vf a) { return a.lo; }
inline __m256 hi8(vf a) { return a.hi; }
inline int reduce_add(vi a) {
  const __m256i s = _mm256_add_epi32(a.lo, a.hi);
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(t);
}
inline float reduce_max(vf a) {
  const __m256 s = _mm256_max_ps(a.lo, a.hi);
  __m128 t = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_max_ps(t, _mm_shuffle_ps(t, t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm_max_ps(t, _mm_shuffle_ps(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(t);
}
// 8 int32 + 8 int32 (each within int16) to 16 int16 in order
inline __m256i pack16(__m256i a, __m256i b) { return _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), _MM_SHUFFLE(3, 1, 2, 0)); }
inline void store_i8(int8_t* p, vi a, vi b) {
  const __m256i q = _mm256_packs_epi16(pack16(a.lo, a.hi), pack16(b.lo, b.hi));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(q, _MM_SHUFFLE(3, 1, 2, 0)));
}
#endif

// KV-cache rows in their stored type (--cache-type-k/-v): float32 as it is, float16 widened
// exactly (every float16 is a float32). One name for both, so the attention is written once.
inline vf load_kv(const float* p) { return load(p); }
inline vf load_kv_n(const float* p, int n) { return load_n(p, n); }
inline vf load_kv(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
#if MLXCEL_ISA_AVX512
  return {_mm512_cvtph_ps(h)};
#else
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
#endif
}
inline vf load_kv_n(const uint16_t* p, int n) { return load_half_n(p, n); }
// q8_0 (int8_t) and q4_0 (uint8_t) rows: blocks of 32 values with their scales (row16)
template <typename T>
inline constexpr bool kv_block_type = std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t>;
// bfloat16 bits, a type of their own so the kernels' overloads tell it from float16
struct bf16_bits {
  uint16_t bits;
};
inline vf load_kv(const bf16_bits* p) { return load_bf16(reinterpret_cast<const uint16_t*>(p)); }
inline vf load_kv_n(const bf16_bits* p, int n) {
  alignas(32) uint16_t buf[16] = {};
  std::memcpy(buf, p, sizeof(uint16_t) * (n > 0 ? (n < 16 ? n : 16) : 0));
  return load_bf16(buf);
}

// Values cc*16..cc*16+15 of a KV row of D values, as float32: the element types above at
// row + 16 cc; a q8_0 or q4_0 row as its integers times their block's scale, exact in float32.
template <int D, typename T>
inline vf row16(const T* row, int cc) {
  return load_kv(row + 16 * cc);
}
// the float16 scale of block `block` of a row whose scales start at `scales`, in every lane
inline vf block_scale(const void* scales, int block) {
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(scales) + 2 * block, sizeof h);
  return set1(_cvtsh_ss(h));
}
// 16 bytes as float32 (int8, or uint8 less `bias`), exactly
template <bool SIGNED>
inline vf bytes16(__m128i b, int bias) {
#if MLXCEL_ISA_AVX512
  const __m512i x = SIGNED ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
  return {_mm512_cvtepi32_ps(_mm512_sub_epi32(x, _mm512_set1_epi32(bias)))};
#else
  const __m128i hi = _mm_srli_si128(b, 8);
  const __m256i lo8 = SIGNED ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
  const __m256i hi8 = SIGNED ? _mm256_cvtepi8_epi32(hi) : _mm256_cvtepu8_epi32(hi);
  const __m256i bv = _mm256_set1_epi32(bias);
  return {_mm256_cvtepi32_ps(_mm256_sub_epi32(lo8, bv)), _mm256_cvtepi32_ps(_mm256_sub_epi32(hi8, bv))};
#endif
}
// q4_0 (uint8_t: D/2 bytes, byte j of block b holding values 32b + j and 32b + j + 16, then D/32
// float16 scales): (q - 8) * d
template <int D>
inline vf row16(const uint8_t* row, int cc) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * (cc / 2)));
  if (cc & 1) b = _mm_srli_epi16(b, 4);
  return mul(bytes16<false>(_mm_and_si128(b, _mm_set1_epi8(0x0F)), 8), block_scale(row + D / 2, cc / 2));
}
// q8_0 (int8_t: D int8, then D/32 float16 scales): q * d
template <int D>
inline vf row16(const int8_t* row, int cc) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * cc));
  return mul(bytes16<true>(b, 0), block_scale(row + D, cc / 2));
}

// n float32 values into a KV row of the cache's type: float32 copied, float16 rounded to nearest
// even (as MLX's astype rounds), once, when the row is written; every later read sees those bytes
inline void store_kv(float* dst, const float* src, int n) { std::memcpy(dst, src, sizeof(float) * n); }
inline void store_kv(uint16_t* dst, const float* src, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// bfloat16: the top half of the float32, rounded to nearest even (MLX's conversion; NaN stays NaN)
inline void store_kv(bf16_bits* dst, const float* src, int n) {
  for (int i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof u);
    dst[i].bits = (u & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>((u >> 16) | 0x40u)
                                                  : static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
}
// q4_0 (llama.cpp's quantize_row_q4_0_ref): per block of 32, d = m / -8 with m the value of the
// largest magnitude, stored as float16; q = min(15, trunc(x / d + 8.5)); n a multiple of 32. The
// row: n/2 bytes (byte j of a block: value j low, value j + 16 high), then n/32 scales.
inline void store_kv(uint8_t* dst, const float* src, int n) {
  for (int b = 0; b < n / 32; ++b) {
    const float* x = src + 32 * b;
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < 32; ++i)
      if (amax < std::fabs(x[i])) {
        amax = std::fabs(x[i]);
        m = x[i];
      }
    const float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    std::memcpy(dst + n / 2 + 2 * b, &h, sizeof h);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[16 + j] * id + 8.5f)));
      dst[16 * b + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}
// q8_0 (llama.cpp's quantize_row_q8_0): per block of 32, d = max|x| / 127 stored as float16,
// q = round(x / d) (half away from zero); n a multiple of 32. The row: n int8, then n/32 scales.
inline void store_kv(int8_t* dst, const float* src, int n) {
  for (int b = 0; b < n / 32; ++b) {
    const float* x = src + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    std::memcpy(dst + n + 2 * b, &h, sizeof h);
    for (int i = 0; i < 32; ++i)
      dst[32 * b + i] = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, std::round(x[i] * id))));
  }
}

// The sum of a's 16 lanes in one fixed tree (h = lanes i + (i+8); then q = h_i + h_(i+4); then
// (q0 + q2) + (q1 + q3)): GCC's _mm512_reduce_add_ps order, written out so both ISAs share it.
inline float reduce_add(vf a) {
  const __m256 h = _mm256_add_ps(hi8(a), lo8(a));
  const __m128 q = _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
  const __m128 p = _mm_add_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));  // q0+q2, q1+q3
  return _mm_cvtss_f32(p) + _mm_cvtss_f32(_mm_shuffle_ps(p, p, _MM_SHUFFLE(1, 1, 1, 1)));
}

// 16 vectors -> one whose lane j is the sum of v[j]'s 16 lanes, each in the same tree:
// p_u = (v_u + v_(u+8)) + (v_(u+4) + v_(u+12)) for u < 4, then (p0 + p1) + (p2 + p3). So a key's
// score does not depend on which 16 keys it was summed beside.
// hsum16's first step for one vector: its 16 lanes folded to 4 (v_u + v_(u+8)) + (v_(u+4) + v_(u+12))
inline __m128 fold16(vf v) {
  const __m256 h = _mm256_add_ps(lo8(v), hi8(v));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
// the rest of hsum16, from the 16 vectors' folds (a kernel can fold each vector as it is made
// and keep 16 bytes of it instead of 64)
inline vf hsum16_folded(const __m128* p) {
  __m256 out[2];
#pragma GCC unroll 2
  for (int half = 0; half < 2; ++half) {
    const __m128* q = p + 8 * half;
    // hadd pairs neighbours: [a0+a1, a2+a3, b0+b1, b2+b3] per 128-bit lane
    const __m256 y01 = _mm256_set_m128(q[1], q[0]), y23 = _mm256_set_m128(q[3], q[2]);
    const __m256 y45 = _mm256_set_m128(q[5], q[4]), y67 = _mm256_set_m128(q[7], q[6]);
    const __m256 s0 = _mm256_hadd_ps(y01, y23), s1 = _mm256_hadd_ps(y45, y67);
    // lanes: v0 v2 v4 v6 | v1 v3 v5 v7 (of this half)
    const __m256 t = _mm256_hadd_ps(s0, s1);
    out[half] = _mm256_permutevar8x32_ps(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
#if MLXCEL_ISA_AVX512
  return {_mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(out[0])), _mm256_castps_pd(out[1]), 1))};
#else
  return {out[0], out[1]};
#endif
}
inline vf hsum16(const vf* v) {
  __m128 p[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) p[j] = fold16(v[j]);
  return hsum16_folded(p);
}

// exp(x) for x already in [-88, 88]: x*log2(e) = n + f with |f| <= 1/2, 2^n * P(f) with MLX's
// CPU coefficients; 2^n is built in the exponent field (n = -127 leaves it 0, so the result is 0)
inline vf exp_poly(vf x) {
  const vf y = mul(x, set1(1.442695f));
  const vf n = round_even(y);
  const vf f = sub(y, n);
  vf p = set1(1.535336188319500e-4f);
  p = fmadd(p, f, set1(1.339887440266574e-3f));
  p = fmadd(p, f, set1(9.618437357674640e-3f));
  p = fmadd(p, f, set1(5.550332471162809e-2f));
  p = fmadd(p, f, set1(2.402264791363012e-1f));
  p = fmadd(p, f, set1(6.931472028550421e-1f));
  p = fmadd(p, f, set1(1.0f));
  return mul(p, bits_float(shl<23>(add(to_int(n), set1i(127)))));
}

}  // namespace MLXCEL_ISA
}  // namespace mlxcel
