// Row-wise kernels (AVX-512 or AVX2, the same bits) for the row-exact path: SwiGLU and rotary
// embeddings. Plain pointers.
#pragma once
#include <cstdint>

namespace mlxcel {

// swiglu: out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], n elements,
// contiguous. exp is MLX's CPU Cephes polynomial (x * log2(e) = n + f, 2^n * P(f)), vectorised.
//

// rope: rotary embedding of x [B, H, L, D] (D contiguous; strides for B, H, L in elements) into out
// [B, H, L, D] contiguous. Row (b, l) stands at position pos[b * L + l]; the first `dims` values
// of each head rotate by angles pos * scale * base^(-2i/dims) (pairs (i, i + dims/2), or (2i, 2i+1)
// when traditional), the rest are copied. cos_sin holds [positions][dims/2] cos then sin values
// for those positions, from rope_table.
#define MLXCEL_ROWWISE_KERNELS                                                                              \
  void swiglu(const float* gate, const float* up, float* out, int64_t n);                                  \
  void rope(const float* x, const int64_t* strides, float* out, int B, int H, int L, int D, int dims,       \
            bool traditional, const float* cos_sin, int threads);
namespace avx512 {
MLXCEL_ROWWISE_KERNELS
}
namespace avx2 {
MLXCEL_ROWWISE_KERNELS
}
namespace avxvnni {
MLXCEL_ROWWISE_KERNELS
}
MLXCEL_ROWWISE_KERNELS

// The cos and sin table for `count` positions (scalar, baseline: rope_table.cpp): [count][dims/2] cos, then [count][dims/2] sin.
// Angles in float32 as MLX forms them (position * scale * frequency), cos and sin in double.
void rope_table(const int32_t* pos, int count, int dims, float base, float scale, float* out);

}  // namespace mlxcel
