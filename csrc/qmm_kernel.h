// Row-exact quantized matmul kernels for x86 (AVX-512 VNNI): plain pointers, no MLX types.
#pragma once
#include <cstddef>
#include <atomic>
#include <cstdint>

namespace mlxcel {

// Blocks of at least this many rows go through AMX tiles (bit-identical to the VNNI path);
// INT_MAX when AMX is unavailable, not built or turned off. Set by the binding.
extern std::atomic<int> amx_rows;

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

// out[r, k] = scales[row, k/32] * q[row, k] + biases[row, k/32] for row = ids[r] (r < R), with
// the packed weight and the interleaved scales and biases.
// Scales and biases are float32, or float16 (half) where the weight's values all are exactly.
void dequantize_rows(const uint8_t* w, const void* scales, const void* biases, bool half, const uint32_t* ids, int R,
                     int N, int K, int bits, float* out);

// out[M, N] = x[M, K] @ W^T with W[n, k] = scales[n, k/32] * q[n, k] + biases[n, k/32] (packed
// weight, interleaved float32 scales and biases). Each output element is reduced in an order fixed
// by K alone: never by M, by the row's position, by tiling or by the thread count.
void qmm(const float* x, const uint8_t* w, const float* scales, const float* biases, float* out,
         int M, int N, int K, int bits, int threads);

// Several weights sharing one input (q/k/v, gate/up): x is quantized once; output i is exactly
// what qmm would give for weight i alone.
struct WeightRef {
  const uint8_t* w;
  const void* scales;  // float32, or float16 when half
  const void* biases;
  float* out;
  int N;
  bool half = false;
};
void qmm_multi(const float* x, const WeightRef* weights, int count, int M, int K, int bits, int threads);

}  // namespace mlxcel
