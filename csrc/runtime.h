// What the MLX primitives share: the thread count the kernels run with, the counters the
// profiling calls read, and reading an mx::array's rows as one contiguous buffer.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "attention_kernel.h"
#include "mlx/mlx.h"

namespace mlxcel {

extern std::atomic<int> kernel_threads;  // set_threads(): the thread count every kernel runs with
extern std::atomic<long long> qmm_ns, qmm_calls;  // time in the matmul kernel (kernel_time())
extern std::atomic<long long> attention_ns;
extern std::atomic<long long> layer_ns, layer_calls;  // time in the fused decoder layers (layer_time())    // time in the attention kernels (attention_time())
extern std::atomic<long long> buffers_donated, buffers_copied;  // by the cache attention (buffer_updates())

// Whether a multi-output op may write into input `in` in place (a cache buffer nobody else holds).
// MLX's is_donatable() asks for a descriptor referenced once, but every output of a multi-output
// primitive keeps its own copy of the inputs (array::make_arrays), so an input that only this
// op's outputs hold shows one reference per output. The descriptor's count is read through
// array's one member, a std::shared_ptr<ArrayDesc> (mlx/array.h); the rest is is_donatable's test.
inline bool donatable_by(const mlx::core::array& in, size_t outputs) {
  static_assert(sizeof(mlx::core::array) == sizeof(std::shared_ptr<void>), "mlx::core::array is one shared_ptr");
  const long refs = reinterpret_cast<const std::shared_ptr<void>&>(in).use_count();
  return refs == static_cast<long>(outputs) && in.data_shared_ptr().use_count() == 1 &&
         in.data_shared_ptr()->is_owned() && in.flags().row_contiguous;
}

// The KV buffers an op writes (the cache attention, the decoder layer): outputs first_out..+n
// take inputs first_in..+n's memory in place where only this op holds it (donatable_by), as
// MLX's own slice update does, else fresh memory that copy() fills from the input (call it in
// the dispatched task, before any write). Counts both in buffers_donated / buffers_copied.
struct BufferWrites {
  std::vector<mlx::core::array> from;
  std::vector<void*> to;
  void copy() const;
};
BufferWrites take_buffers(const std::vector<mlx::core::array>& inputs, size_t first_in,
                          std::vector<mlx::core::array>& outputs, size_t first_out, size_t n);

// The KV element type a buffer dtype holds (KvType: float32, float16, bfloat16, int8 for q8_0,
// uint8 for q4_0), or false for any other dtype
inline bool kv_type_of(mlx::core::Dtype d, KvType* t) {
  if (d == mlx::core::float32) *t = KvType::f32;
  else if (d == mlx::core::float16) *t = KvType::f16;
  else if (d == mlx::core::bfloat16) *t = KvType::bf16;
  else if (d == mlx::core::int8) *t = KvType::q8_0;
  else if (d == mlx::core::uint8) *t = KvType::q4_0;
  else return false;
  return true;
}
inline bool kv_type_of(const mlx::core::array& buf, KvType* t) { return kv_type_of(buf.dtype(), t); }

// The buffers an op writes, of one type for the keys and one for the values (per layer: every
// sequence's cache of a layer has the cache type chosen at load); else std::invalid_argument
// naming `what`
void kv_types(const std::vector<mlx::core::array>& k_bufs, const std::vector<mlx::core::array>& v_bufs,
              const char* what, KvType* kt, KvType* vt);
// Their rows hold kv_row(D) elements of their type (a q8_0 row: D int8 and D/32 scales), and a
// q8_0 or q4_0 cache has a head width its attention reads (kv_block_head_dim); else std::invalid_argument
void check_kv_rows(const std::vector<mlx::core::array>& k_bufs, const std::vector<mlx::core::array>& v_bufs, int D,
                   KvType kt, KvType vt, const char* what);

// A kernel weight's scales and biases: both float32, or both float16 (exact GGUF values)
inline bool scale_dtype_ok(const mlx::core::array& scales, const mlx::core::array& biases) {
  return scales.dtype() == biases.dtype() &&
         (scales.dtype() == mlx::core::float32 || scales.dtype() == mlx::core::float16);
}

// A symmetric weight's biases are not stored (qmm_kernel.h, symmetric_bias): an empty array of the
// scales' dtype stands for them; else they have the scales' shape
inline bool no_biases(const mlx::core::array& biases) { return biases.size() == 0; }
inline bool biases_fit(const mlx::core::array& scales, const mlx::core::array& biases) {
  return scale_dtype_ok(scales, biases) && (no_biases(biases) || biases.shape() == scales.shape());
}

// 4 or 8, else std::invalid_argument
void check_bits(int bits);

// x as a row-contiguous buffer: its own data when it already is one, else a gathered copy in
// `scratch` (any strides; runs inside a dispatched task, when x's contents exist)
template <typename T>
const T* contiguous_rows(const mlx::core::array& x, std::vector<T>& scratch) {
  if (x.flags().row_contiguous) return x.data<T>();
  scratch.resize(x.size());
  const auto& shape = x.shape();
  const auto& strides = x.strides();
  const int nd = x.ndim();
  std::vector<int> idx(nd, 0);
  const T* base = x.data<T>();
  for (size_t i = 0; i < x.size(); ++i) {
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) off += static_cast<int64_t>(idx[d]) * strides[d];
    scratch[i] = base[off];
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return scratch.data();
}

}  // namespace mlxcel
