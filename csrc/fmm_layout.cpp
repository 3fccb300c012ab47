// The float kernel's weight layout (fmm_kernel.h), scalar: rows into it and back. Built for the
// baseline ISA (load time and lookups, on any CPU), so float16 is widened here in software.
#include <cstring>

#include "fmm_kernel.h"

namespace mlxcel {

namespace {

// IEEE half to float, exact (normals, subnormals, infinities, NaNs)
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while ((man & 0x400) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float value(const void* w, FloatForm form, size_t at) {
  if (form == FloatForm::f32) return static_cast<const float*>(w)[at];
  const uint16_t v = static_cast<const uint16_t*>(w)[at];
  if (form == FloatForm::f16) return half_to_float(v);
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

void float_repack(const void* rows, void* out, FloatForm form, int N, int K) {
  const size_t e = float_bytes(form);
  auto* o = static_cast<uint8_t*>(out);
  const auto* src = static_cast<const uint8_t*>(rows);
  std::memset(o, 0, static_cast<size_t>(float_groups(N)) * kGroup * K * e);
  for (int n = 0; n < N; ++n) {
    const size_t g = n / kGroup, i = n % kGroup;
    for (int k = 0; k < K; ++k)
      std::memcpy(o + ((g * K + k) * kGroup + i) * e, src + (static_cast<size_t>(n) * K + k) * e, e);
  }
}

void float_rows(const void* w, FloatForm form, const uint32_t* ids, int R, int N, int K, float* out) {
  for (int r = 0; r < R; ++r) {
    const size_t n = ids[r], g = n / kGroup, i = n % kGroup;
    for (int k = 0; k < K; ++k) out[static_cast<size_t>(r) * K + k] = value(w, form, (g * K + k) * kGroup + i);
  }
}

}  // namespace mlxcel
