// Row-exact attention for decode and verify blocks (AVX-512 or AVX2, the same bits): plain
// pointers, no MLX types.
#pragma once
#include <cstdint>

namespace mlxcel {

// The element type of a KV buffer (--cache-type-k / --cache-type-v): float32; float16 or bfloat16
// (held as their uint16_t bits); or llama.cpp's blocks of 32 values with one float16 scale d:
// q8_0 (int8 q, a value q * d) and q4_0 (4-bit q, a value (q - 8) * d; byte j of a block holds
// values j and j + 16 in its low and high nibbles). A q8_0 row of D values is D int8 followed by
// its D/32 scales (D + D/16 bytes; kv_row), a q4_0 row D/2 bytes and then the scales. Keys and
// values are widened to float32 as they are read, exactly (an int8 times a float16 fits float32's
// mantissa), so the arithmetic below is the same for every type: a row rounded once, when it was
// written, reads back the same bits every time.
enum class KvType : int { f32 = 0, f16 = 1, bf16 = 2, q8_0 = 3, q4_0 = 4 };
inline bool kv_blocks(KvType t) { return t == KvType::q8_0 || t == KvType::q4_0; }
// bytes of one element: the unit of a buffer's strides and offsets (q8_0, q4_0: bytes)
inline int kv_bytes(KvType t) { return t == KvType::f32 ? 4 : kv_blocks(t) ? 1 : 2; }
// elements of one row of D values
inline int64_t kv_row(int D, KvType t) {
  return t == KvType::q8_0 ? D + D / 16 : t == KvType::q4_0 ? D / 2 + D / 16 : D;
}
// element `n` of a buffer of type t
inline const void* kv_at(const void* base, int64_t n, KvType t) { return static_cast<const char*>(base) + n * kv_bytes(t); }
inline void* kv_at(void* base, int64_t n, KvType t) { return static_cast<char*>(base) + n * kv_bytes(t); }
// row r of head h in a buffer [heads, capacity, kv_row(D, t)]
inline void* kv_row_at(void* base, int64_t capacity, int h, int64_t r, int D, KvType t) {
  return kv_at(base, (h * capacity + r) * kv_row(D, t), t);
}
// whether the attention reads a q8_0 or q4_0 row of this head width (its chunked kernels only)
inline bool kv_block_head_dim(int D) { return D == 32 || D == 64 || D == 128; }

struct AttentionArgs {
  const float* q;  // [B, Hq, L, D] with the strides below (elements); D contiguous
  const void* k;   // [B, Hkv, S, kv_row(D, kt)], of type kt
  const void* v;   // [B, Hkv, S, kv_row(D, vt)], of type vt
  float* out;      // [B, Hq, L, D], contiguous
  int B, Hq, Hkv, L, S, D;
  int64_t q_strides[3], k_strides[3], v_strides[3];  // for dims B, H, L/S (in elements of their type)
  float scale;
  bool causal;  // row i sees keys 0..S-L+i; otherwise every row sees all S keys
  KvType kt = KvType::f32, vt = KvType::f32;
};

// attention(): softmax(scale * q k^T) v per query row. Each row is computed alone, over its
// visible keys in order, so its result depends only on those keys: row i of a verify block equals
// the one-row decode step at the same position bit for bit. Query heads map to KV heads as
// h / (Hq / Hkv).

// A batched block whose sequences each keep their own cache buffer (serve's batched steps):
// sequence b's L query rows follow offset[b] cached keys, row i sees keys 0..offset[b]+i of its
// own buffer [Hkv, cap_b, kv_row(D)]. Each row goes through the same one-row code as attention(), so it
// equals that sequence's own call bit for bit (attention_rows()).
struct RowsAttentionArgs {
  const float* q;  // [B, Hq, L, D] with q_strides for B, H, L; D contiguous
  int64_t q_strides[3];
  const void* const* k;        // per sequence: [Hkv, cap_b, kv_row(D, kt)], contiguous, of type kt
  const void* const* v;        // of type vt
  KvType kt = KvType::f32, vt = KvType::f32;
  const int64_t* capacity;     // per sequence: cap_b (rows a head)
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
// store_kv_row: n float32 values into a KV row of type t at dst (float16, bfloat16: rounded to
// nearest even, as MLX's astype rounds; q8_0, q4_0: llama.cpp's quantize_row_q8_0 / _q4_0, n a
// multiple of 32, of the row rotated first where n is a head dim attention reads them at, and
// attention() / attention_rows() read such rows in that basis: attention_kernel.cpp, rotate()),
// the one place a key or value is rounded to the cache's type.
#define MLXCEL_ATTENTION_KERNELS                                \
  void attention(const AttentionArgs& a, int threads);          \
  void attention_rows(const RowsAttentionArgs& a, int threads); \
  void store_kv_row(void* dst, KvType t, const float* src, int n);
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
