// Row-wise kernels: see rowwise_kernel.h. Built once per ISA (isa_begin.h, simd.h: the same bits
// on each); only called after isa.cpp chose the build. Each output element depends on its own inputs (and, for rope, its row's
// position) alone, so a row comes out the same in any block.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "rowwise_kernel.h"
#include "thread_pool.h"
// after every other header: the ISA's target applies to this file's own code only
#include "isa_begin.h"
#include "simd.h"

namespace mlxcel {
namespace MLXCEL_ISA {

namespace {

// exp(x), x clipped to [-88, 88] (0 below about -87.3, as MLX's exp)
inline vf exp_ps(vf x) { return exp_poly(min(max(x, set1(-88.0f)), set1(88.0f))); }

}  // namespace

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  const vf one = set1(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const vf g = load(gate + i);
    const vf s = div(one, add(one, exp_ps(sub(zero(), g))));
    store(out + i, mul(mul(g, s), load(up + i)));
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    const vf g = load_n(gate + i, left);
    const vf s = div(one, add(one, exp_ps(sub(zero(), g))));
    store_n(out + i, mul(mul(g, s), load_n(up + i, left)), left);
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
            const vf a = load(xr + i), c = load(xr + half + i);
            const vf co = load(cs + i), si = load(sn + i);
            store(o + i, sub(mul(a, co), mul(c, si)));
            store(o + half + i, add(mul(a, si), mul(c, co)));
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

}  // namespace MLXCEL_ISA
}  // namespace mlxcel
