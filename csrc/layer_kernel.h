// One decoder layer of the llama family (llama, mistral, qwen2, qwen3) on the row-exact kernels,
// in one call: plain pointers, no MLX types (layer_primitive.cpp wraps it).
#pragma once
#include <cstdint>

#include "attention_kernel.h"

namespace mlxcel {

// A linear layer in a kernel's layout: y = x @ W^T (+ bias), W [N, K]. Quantized (qmm_kernel.h:
// w packed, its scales and biases, bits 4 or 8), or float (fmm_kernel.h: w packed in its stored
// precision `form`, no scales; `floating` set).
struct LinearView {
  const uint8_t* w;
  const void* scales;  // float32, or float16 when half (WeightRef)
  const void* biases;
  const float* bias;  // [N] or null
  int N, K, bits;
  bool half;
  bool floating = false;
  int form = 0;  // FloatForm of a float weight
};

struct DecoderLayerView {
  const float* attn_norm;  // [hidden]: RMSNorm before attention (of the second input e, when in2_norm is set)
  // EAGLE-3's midlayer (drafters/eagle3_net.py), or null: q/k/v read [attn_norm(e); in2_norm(h)]
  // (2 * hidden inputs), with h, the hidden state, still the residual
  const float* in2_norm = nullptr;
  const float* mlp_norm;   // [hidden]: RMSNorm before the MLP
  const float* q_norm;     // [head_dim] per-head RMSNorm of queries and keys (qwen3), or null
  const float* k_norm;
  float eps, qk_eps;
  LinearView q, k, v, o, gate, up, down;
  int Hq, Hkv, D;
  int rope_dims;
  bool rope_traditional;
  float attn_scale;
};

// T rows of one forward. Row t belongs to sequence seq[t] and stands at position pos[t]; its key
// and value go into that sequence's buffers ([Hkv, capacity, kv_row(D)]) at
// pos[t], and it attends keys 0..pos[t] of its sequence. A sequence's rows in one call must be
// at consecutive positions in order (a verify block, a prompt chunk).
// Tree rows (a draft tree verified in one forward; slot non-null): row t is rotated at pos[t] (its
// depth after the context) but written at buffer row slot[t], and attends rows 0..vis_base[t]-1
// and then rows vis_tail[t][0..vis_tail_n[t]-1] (its ancestors and itself): the keys, in the
// order, that the one-row step of its path attends, so its output is that step's bit for bit.
struct LayerRows {
  const float* h;  // [T, hidden] in
  const float* e = nullptr;  // [T, hidden]: the second input (in2_norm layers: a token's embedding)
  float* out;      // [T, hidden] out (h + attention + MLP)
  int T;
  const int* seq;
  const int* pos;
  const float* cos_sin;  // rope_table of pos: [T][rope_dims/2] cos, then [T][rope_dims/2] sin
  void* const* k_bufs;  // per sequence, of type kt (keys) and vt (values): KvType
  void* const* v_bufs;
  KvType kt = KvType::f32, vt = KvType::f32;
  const int64_t* capacity;     // per sequence: rows a head
  const int* slot = nullptr;   // tree rows (above); null: rows write and see as plain rows
  const int* vis_base = nullptr;
  const int* const* vis_tail = nullptr;
  const int* vis_tail_n = nullptr;
};

// decoder_layer: every step works on each row alone (RMSNorm, the row-exact matmuls, rope, the
// one-row attention, SwiGLU, the residual adds), so row t's output depends only on its own input,
// its position and its sequence's keys: any block, batch, thread count or ISA gives it the same bits.
// rms_norm_rows: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for R rows of n values (the sum
// in a fixed order).
#define MLXCEL_LAYER_KERNELS                                                              \
  void decoder_layer(const DecoderLayerView& layer, const LayerRows& rows, int threads); \
  void rms_norm_rows(const float* x, const float* w, float eps, int R, int n, float* out);
namespace avx512 {
MLXCEL_LAYER_KERNELS
}
namespace avx2 {
MLXCEL_LAYER_KERNELS
}
namespace avxvnni {
MLXCEL_LAYER_KERNELS
}
MLXCEL_LAYER_KERNELS

}  // namespace mlxcel
