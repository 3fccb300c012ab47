// Row-wise kernels: see rowwise_kernel.h. Compiled with -mavx512f (CMakeLists.txt); only called
// after cpu_supported(). Each output element depends on its own inputs (and, for rope, its row's
// position) alone, so a row comes out the same in any block.
#include "rowwise_kernel.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "simd_exp.h"
#include "thread_pool.h"

namespace mlxcel {

namespace {

// exp(x), x clipped to [-88, 88] (0 below about -87.3, as MLX's exp)
inline __m512 exp_ps(__m512 x) {
  return exp_poly_ps(_mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0f)), _mm512_set1_ps(88.0f)));
}

}  // namespace

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(g, s), _mm512_loadu_ps(up + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_mul_ps(g, s), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void rope_table(const int32_t* pos, int count, int dims, float base, float scale, float* out) {
  const int half = dims / 2;
  float* cs = out;
  float* sn = out + static_cast<int64_t>(count) * half;
  for (int i = 0; i < half; ++i) {
    // MLX's frequencies: base ** (-2i / dims) in float32
    const float freq = std::pow(base, -static_cast<float>(2 * i) / static_cast<float>(dims));
    for (int r = 0; r < count; ++r) {
      const float theta = static_cast<float>(pos[r]) * scale * freq;
      cs[static_cast<int64_t>(r) * half + i] = static_cast<float>(std::cos(static_cast<double>(theta)));
      sn[static_cast<int64_t>(r) * half + i] = static_cast<float>(std::sin(static_cast<double>(theta)));
    }
  }
}

void rope(const float* x, const int64_t* st, float* out, int B, int H, int L, int D, int dims, bool traditional,
          const float* cos_sin, int threads) {
  const int half = dims / 2;
  const int64_t rows = static_cast<int64_t>(B) * L;
  const float* sn_base = cos_sin + rows * half;
  auto run = [&](int64_t p0, int64_t p1) {  // p = (b, h) pairs
    for (int64_t p = p0; p < p1; ++p) {
      const int b = static_cast<int>(p / H), h = static_cast<int>(p % H);
      for (int l = 0; l < L; ++l) {
        const float* xr = x + b * st[0] + h * st[1] + l * st[2];
        float* o = out + ((static_cast<int64_t>(b) * H + h) * L + l) * D;
        const float* cs = cos_sin + (static_cast<int64_t>(b) * L + l) * half;
        const float* sn = sn_base + (static_cast<int64_t>(b) * L + l) * half;
        if (!traditional) {
          int i = 0;
          for (; i + 16 <= half; i += 16) {
            const __m512 a = _mm512_loadu_ps(xr + i), c = _mm512_loadu_ps(xr + half + i);
            const __m512 co = _mm512_loadu_ps(cs + i), si = _mm512_loadu_ps(sn + i);
            _mm512_storeu_ps(o + i, _mm512_sub_ps(_mm512_mul_ps(a, co), _mm512_mul_ps(c, si)));
            _mm512_storeu_ps(o + half + i, _mm512_add_ps(_mm512_mul_ps(a, si), _mm512_mul_ps(c, co)));
          }
          for (; i < half; ++i) {
            const float a = xr[i], c = xr[half + i];
            o[i] = a * cs[i] - c * sn[i];
            o[half + i] = a * sn[i] + c * cs[i];
          }
        } else {
          for (int i = 0; i < half; ++i) {
            const float a = xr[2 * i], c = xr[2 * i + 1];
            o[2 * i] = a * cs[i] - c * sn[i];
            o[2 * i + 1] = a * sn[i] + c * cs[i];
          }
        }
        if (dims < D) std::memcpy(o + dims, xr + dims, sizeof(float) * (D - dims));
      }
    }
  };
  const int64_t pairs = static_cast<int64_t>(B) * H;
  const double work = static_cast<double>(pairs) * L * D;
  run_ranges(pairs, static_cast<int>(std::min<int64_t>({static_cast<int64_t>(threads), pairs,
                                                         static_cast<int64_t>(work / 2.0e5)})),
             run);
}

}  // namespace mlxcel
