// Row-exact attention for decode and verify blocks (AVX-512 or AVX2, the same bits): plain
// pointers, no MLX types.
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

// attention(): softmax(scale * q k^T) v per query row. Each row is computed alone, over its
// visible keys in order, so its result depends only on those keys: row i of a verify block equals
// the one-row decode step at the same position bit for bit. Query heads map to KV heads as
// h / (Hq / Hkv).

// A batched block whose sequences each keep their own cache buffer (serve's batched steps):
// sequence b's L query rows follow offset[b] cached keys, row i sees keys 0..offset[b]+i of its
// own buffer [Hkv, cap_b, D]. Each row goes through the same one-row code as attention(), so it
// equals that sequence's own call bit for bit (attention_rows()).
struct RowsAttentionArgs {
  const float* q;  // [B, Hq, L, D] with q_strides for B, H, L; D contiguous
  int64_t q_strides[3];
  const float* const* k;       // per sequence: [Hkv, cap_b, D], contiguous
  const float* const* v;
  const int64_t* head_stride;  // per sequence: cap_b * D
  const int* offset;           // per sequence: keys before this block
  float* out;                  // [B, Hq, L, D], contiguous
  int B, Hq, Hkv, L, D;
  float scale;
  // Tree rows (L == 1 only; null: every row sees the prefix above). Entry e sees the buffer's rows
  // 0..vis_base[e]-1 and then rows vis_tail[e][0..vis_tail_n[e]-1], in that order: a draft-tree
  // node sees the context and its own ancestors, as key 0..n of the one-row step for its path
  // (the same keys in the same order, so the same bits).
  const int* vis_base = nullptr;
  const int* const* vis_tail = nullptr;
  const int* vis_tail_n = nullptr;
};

// One build per ISA (isa_begin.h), and the dispatchers under the same names (isa.cpp).
#define MLXCEL_ATTENTION_KERNELS                     \
  void attention(const AttentionArgs& a, int threads); \
  void attention_rows(const RowsAttentionArgs& a, int threads);
namespace avx512 {
MLXCEL_ATTENTION_KERNELS
}
namespace avx2 {
MLXCEL_ATTENTION_KERNELS
}
namespace avxvnni {
MLXCEL_ATTENTION_KERNELS
}
MLXCEL_ATTENTION_KERNELS

}  // namespace mlxcel
