// Row-exact attention for decode and verify blocks (AVX-512): plain pointers, no MLX types.
#pragma once
#include <cstdint>

namespace mlxcel {

struct AttentionArgs {
  const float* q;  // [B, Hq, L, D] with the strides below (elements); D contiguous
  const float* k;  // [B, Hkv, S, D]
  const float* v;  // [B, Hkv, S, D]
  float* out;      // [B, Hq, L, D], contiguous
  int B, Hq, Hkv, L, S, D;
  int64_t q_strides[3], k_strides[3], v_strides[3];  // for dims B, H, L/S
  float scale;
  bool causal;  // row i sees keys 0..S-L+i; otherwise every row sees all S keys
};

// softmax(scale * q k^T) v per query row. Each row is computed alone, over its visible keys in
// order, so its result depends only on those keys: row i of a verify block equals the one-row
// decode step at the same position bit for bit. Query heads map to KV heads as h / (Hq / Hkv).
void attention(const AttentionArgs& a, int threads);

}  // namespace mlxcel
