// Row-exact float matmul for x86 (AVX-512 or AVX2): float32 activations times weights kept in
// their stored precision (float16, bfloat16 or float32), plain pointers, no MLX types.
#pragma once
#include <cstddef>
#include <cstdint>

#include "qmm_kernel.h"

namespace mlxcel {

// A weight's stored precision; values widen exactly to float32 (F16C for float16, a shift for
// bfloat16), so the products are the stored model's own.
enum class FloatForm : int { f32 = 0, f16 = 1, bf16 = 2 };
inline size_t float_bytes(FloatForm f) { return f == FloatForm::f32 ? 4 : 2; }

// Layout: rows in groups of 16 (kGroup; the last group padded with zero rows), and within a group
// value k of its 16 rows side by side: [ceil(N/16), K, 16] values. One vector load then holds one
// column of 16 rows, so a broadcast activation and one FMA advance 16 outputs, with no horizontal
// sum anywhere.
inline int float_groups(int N) { return (N + kGroup - 1) / kGroup; }

// Baseline code (load time, any CPU): row-major [N, K] values of `form` into the layout, and rows
// ids[r] (r < R) of a packed weight back as float32 [R, K] (embedding lookups, wide blocks).
void float_repack(const void* rows, void* out, FloatForm form, int N, int K);
void float_rows(const void* w, FloatForm form, const uint32_t* ids, int R, int N, int K, float* out);

// One weight of a product: the packed weight, its form, where the output goes ([M, N] row-major).
struct FloatWeightRef {
  const void* w;
  FloatForm form;
  float* out;
  int N;
};

// fmm_multi: out_i[M, N_i] = x[M, K] @ W_i^T for weights sharing one input (q/k/v, gate/up). Each
// output element is acc = fma(x[m, k], W[n, k], acc) for k = 0, 1, ..., K-1 from 0: an order fixed
// by K alone, never by M, the tiling, the threads or the ISA, so row m of an M-row product is the
// one-row product of row m bit for bit.
#define MLXCEL_FMM_KERNELS \
  void fmm_multi(const float* x, const FloatWeightRef* weights, int count, int M, int K, int threads);
namespace avx512 {
MLXCEL_FMM_KERNELS
}
namespace avx2 {
MLXCEL_FMM_KERNELS
}
namespace avxvnni {
MLXCEL_FMM_KERNELS
}
MLXCEL_FMM_KERNELS

}  // namespace mlxcel
