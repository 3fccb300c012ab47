// Row-exact float matmul (fmm_kernel.h). Built once per ISA (isa_begin.h); only called after
// isa.cpp chose the build.
//
// A tile is GT weight groups (16 rows each) times up to MT activation rows: GT x MT accumulators
// of 16 lanes, each lane one output element, each advanced by one FMA per value of K in order.
// The weight vectors are loaded (and widened) once per value of K for the whole tile. Decode
// steps (one row) take a wider tile of groups instead, so several independent FMA chains hide
// the FMA latency. No tile shape changes an element's sequence of FMAs.
#include <algorithm>
#include <vector>

#include "fmm_kernel.h"
#include "thread_pool.h"
// after every other header: the ISA's target applies to this file's own code only
#include "isa_begin.h"
#include "simd.h"

namespace mlxcel {
namespace MLXCEL_ISA {

namespace {

#if MLXCEL_ISA_AVX512
constexpr int kTileGroups = 4, kTileRows = 4, kStepGroups = 8;  // 16 + 4 and 8 + 8 of 32 zmm
#else
constexpr int kTileGroups = 2, kTileRows = 2, kStepGroups = 4;  // a vf is two ymm: 8 + 4 and 8 + 8 of 16
#endif

template <FloatForm F>
inline vf load_w(const void* w, size_t at) {
  if constexpr (F == FloatForm::f32) return load(static_cast<const float*>(w) + at);
  else if constexpr (F == FloatForm::f16) return load_half_n(static_cast<const uint16_t*>(w) + at, 16);
  else return load_bf16(static_cast<const uint16_t*>(w) + at);
}

// groups g0..g0+gt-1 (gt <= GT) of one weight against activation rows x[0..rows-1] (rows <= MT)
template <FloatForm F, int GT, int MT>
void tile(const float* x, int K, int rows, const void* w, int g0, int gt, float* out, int N) {
  vf acc[GT][MT];
#pragma GCC unroll 8
  for (int j = 0; j < GT; ++j)
#pragma GCC unroll 4
    for (int m = 0; m < MT; ++m) acc[j][m] = zero();
  for (int k = 0; k < K; ++k) {
    vf wv[GT];
#pragma GCC unroll 8
    for (int j = 0; j < GT; ++j)
      if (j < gt) wv[j] = load_w<F>(w, (static_cast<size_t>(g0 + j) * K + k) * kGroup);
#pragma GCC unroll 4
    for (int m = 0; m < MT; ++m) {
      if (m < rows) {
        const vf xv = set1(x[static_cast<size_t>(m) * K + k]);
#pragma GCC unroll 8
        for (int j = 0; j < GT; ++j)
          if (j < gt) acc[j][m] = fmadd(xv, wv[j], acc[j][m]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < GT; ++j)
#pragma GCC unroll 4
    for (int m = 0; m < MT; ++m)
      if (j < gt && m < rows) {
        const int n0 = (g0 + j) * kGroup;
        store_n(out + static_cast<size_t>(m) * N + n0, acc[j][m], std::min(kGroup, N - n0));
      }
}

// groups g0..g1-1 of one weight against all M rows
template <FloatForm F>
void groups(const float* x, int M, int K, const FloatWeightRef& wr, int g0, int g1) {
  if (M == 1) {
    for (int g = g0; g < g1; g += kStepGroups) tile<F, kStepGroups, 1>(x, K, 1, wr.w, g, std::min(kStepGroups, g1 - g), wr.out, wr.N);
    return;
  }
  for (int g = g0; g < g1; g += kTileGroups)
    for (int m0 = 0; m0 < M; m0 += kTileRows)
      tile<F, kTileGroups, kTileRows>(x + static_cast<size_t>(m0) * K, K, std::min(kTileRows, M - m0), wr.w, g,
                                      std::min(kTileGroups, g1 - g), wr.out + static_cast<size_t>(m0) * wr.N, wr.N);
}

}  // namespace

void fmm_multi(const float* x, const FloatWeightRef* weights, int count, int M, int K, int threads) {
  // all weights' groups as one range of "global" groups, split evenly over the threads
  std::vector<int> starts(count + 1, 0);
  for (int i = 0; i < count; ++i) starts[i + 1] = starts[i] + float_groups(weights[i].N);
  const int total = starts[count];
  auto run = [&](int64_t r0, int64_t r1) {
    for (int i = 0; i < count; ++i) {
      const int a0 = static_cast<int>(std::max<int64_t>(r0, starts[i])) - starts[i];
      const int a1 = static_cast<int>(std::min<int64_t>(r1, starts[i + 1])) - starts[i];
      if (a0 >= a1) continue;
      switch (weights[i].form) {
        case FloatForm::f32: groups<FloatForm::f32>(x, M, K, weights[i], a0, a1); break;
        case FloatForm::f16: groups<FloatForm::f16>(x, M, K, weights[i], a0, a1); break;
        case FloatForm::bf16: groups<FloatForm::bf16>(x, M, K, weights[i], a0, a1); break;
      }
    }
  };
  // threads only pay off on big enough products (handing work to a thread costs microseconds)
  const double work = static_cast<double>(total) * kGroup * K * (M + 3);
  run_ranges(total, std::min({threads, total, static_cast<int>(work / 2.0e5)}), run);
}

}  // namespace MLXCEL_ISA
}  // namespace mlxcel
