// Row-exact quantized matmul kernels for x86 (AVX-512 VNNI, or AVX2): plain pointers, no MLX types.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace mlxcel {

// Blocks of at least this many rows go through AMX tiles (bit-identical to the VNNI path);
// INT_MAX when AMX is unavailable, not built or turned off. Set by the binding.
extern std::atomic<int> amx_rows;

// The layout's geometry (see qmm_kernel.cpp), shared by the packing helpers (qmm_layout.cpp) and
// every ISA's kernels; baseline code.
constexpr int kBlock = 32;  // values per scale and bias
constexpr int kGroup = 16;  // weight rows side by side
inline int group_rows(int N, int g) { return std::min(kGroup, N - g * kGroup); }
inline size_t block_bytes(int r, int bits) { return static_cast<size_t>(r) * (bits == 8 ? 32 : 16); }

// the byte holding value k of row i of a group of r rows, and whether it is the high nibble
inline size_t value_offset(int i, int k, int r, int bits, bool* high) {
  const int blk = k / kBlock, kk = k % kBlock, run = kk / 4, e = kk % 4;
  if (bits == 8) {
    *high = false;
    return blk * block_bytes(r, 8) + static_cast<size_t>(run) * 4 * r + 4 * i + e;
  }
  *high = (run % 2) == 1;
  return blk * block_bytes(r, 4) + static_cast<size_t>(run / 2) * 4 * r + 4 * i + e;
}

// Bytes of one weight row of K values (the packed matrix is N rows of this many bytes in all,
// interleaved by groups of 16 rows: see qmm_kernel.cpp).
inline size_t row_bytes(int K, int bits) { return static_cast<size_t>(K) * bits / 8; }

// MLX's affine rows (bits 8: byte k = q[k]; bits 4: byte k = q[2k] | q[2k+1] << 4), N of them,
// into the kernel's layout. K % 64 == 0.
void repack(const uint8_t* mlx_rows, uint8_t* out, int N, int K, int bits);

// The quantized values back in natural order, [N, K] (for tests and checks).
void unpack(const uint8_t* packed, uint8_t* q, int N, int K, int bits);

// Per-block scales or biases [N, nb] (row-major) into the kernel's order: per group of 16 rows,
// block by block, the group's 16 values side by side.
void interleave(const float* rows, float* out, int N, int nb);

// A symmetric weight (a GGUF's Q4_0 and Q8_0: w = d * (q - 2^(bits-1))) stores no biases: each is
// its scale times this, exactly (a power of two), so the kernels compute it instead of reading it.
constexpr float symmetric_bias(int bits) { return bits == 8 ? -128.0f : -8.0f; }

// One weight of a product: the packed weight, its interleaved scales and biases, where the output
// goes ([M, N] row-major).
struct WeightRef {
  const uint8_t* w;
  const void* scales;  // float32, or float16 when half
  const void* biases;  // as the scales, or null for a symmetric weight (symmetric_bias)
  float* out;
  int N;
  bool half = false;
};

// The kernels, one build per instruction set (isa_begin.h), and under the same names in mlxcel
// itself the dispatchers that call the build isa.h chose (what the primitives call):
//   dequantize_rows: out[r, k] = scales[row, k/32] * q[row, k] + biases[row, k/32] for row =
//     ids[r] (r < R), with the packed weight and its interleaved scales and biases (float32, or
//     float16 (half) where the weight's values all are exactly).
//   qmm_multi: out_i[M, N_i] = x[M, K] @ W_i^T, W_i[n, k] = scales[n, k/32] * q[n, k] + biases[n,
//     k/32], for weights sharing one input (q/k/v, gate/up): x is quantized once, and output i is
//     exactly what weight i alone gives. Each output element is reduced in an order fixed by K
//     alone: never by M, by the row's position, by tiling, by the thread count or by the ISA.
#define MLXCEL_QMM_KERNELS                                                                                    \
  void dequantize_rows(const uint8_t* w, const void* scales, const void* biases, bool half, const uint32_t* ids, \
                       int R, int N, int K, int bits, float* out);                                           \
  void qmm_multi(const float* x, const WeightRef* weights, int count, int M, int K, int bits, int threads);
namespace avx512 {
MLXCEL_QMM_KERNELS
}
namespace avx2 {
MLXCEL_QMM_KERNELS
}
namespace avxvnni {
MLXCEL_QMM_KERNELS
}
MLXCEL_QMM_KERNELS

}  // namespace mlxcel
