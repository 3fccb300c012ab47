// RowExactAttention: softmax(scale q k^T) v one query row at a time (attention_kernel.h), on
// MLX's CPU stream.
#include "attention_primitive.h"

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "runtime.h"
#include "attention_kernel.h"

namespace mx = mlx::core;

namespace mlxcel {

namespace {

// softmax(scale q k^T) v, one query row at a time (attention_kernel.h); q/k/v may be strided
// views (the KV cache's slices) as long as their last axis is contiguous.
class RowExactAttention : public mx::UnaryPrimitive {
 public:
  RowExactAttention(mx::Stream s, float scale, bool causal) : mx::UnaryPrimitive(s), scale_(scale), causal_(causal) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& q = inputs[0];
    const auto& k = inputs[1];
    const auto& v = inputs[2];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    AttentionArgs a{};
    a.B = q.shape(0);
    a.Hq = q.shape(1);
    a.L = q.shape(2);
    a.D = q.shape(3);
    a.Hkv = k.shape(1);
    a.S = k.shape(2);
    a.scale = scale_;
    a.causal = causal_;
    for (int d = 0; d < 3; ++d) {
      a.q_strides[d] = q.strides()[d];
      a.k_strides[d] = k.strides()[d];
      a.v_strides[d] = v.strides()[d];
    }
    for (const auto* x : {&q, &k, &v})
      if (x->strides()[3] != 1) throw std::runtime_error("row_exact_attention: the last axis must be contiguous");
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(q);
    enc.set_input_array(k);
    enc.set_input_array(v);
    enc.set_output_array(out);
    a.out = out.data<float>();
    kv_type_of(k, &a.kt);
    kv_type_of(v, &a.vt);
    enc.dispatch([a, q, k, v, threads = kernel_threads.load()]() mutable {
      a.q = q.data<float>();
      a.k = k.data<void>();
      a.v = v.data<void>();
      auto t0 = std::chrono::steady_clock::now();
      attention(a, threads);
      attention_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("row_exact_attention runs on the CPU only");
  }

  const char* name() const override { return "RowExactAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowExactAttention&>(other);
    return scale_ == o.scale_ && causal_ == o.causal_;
  }

 private:
  float scale_;
  bool causal_;
};

}  // namespace

mx::array row_exact_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    throw std::invalid_argument("row_exact_attention: q, k, v must be [B, heads, length, dim]");
  KvType kt, vt;
  if (q.dtype() != mx::float32 || !kv_type_of(k, &kt) || !kv_type_of(v, &vt))
    throw std::invalid_argument("row_exact_attention: float32 queries; float32, float16, bfloat16, q8_0 (int8) or q4_0 (uint8) keys and values");
  const int D = q.shape(3);
  if (k.shape(0) != v.shape(0) || k.shape(1) != v.shape(1) || k.shape(2) != v.shape(2) || q.shape(0) != k.shape(0) ||
      k.shape(3) != kv_row(D, kt) || v.shape(3) != kv_row(D, vt) || k.shape(1) == 0 || q.shape(1) % k.shape(1) != 0)
    throw std::invalid_argument("row_exact_attention: shapes do not match (query heads must be a multiple of KV heads)");
  if ((kv_blocks(kt) || kv_blocks(vt)) && !kv_block_head_dim(D))
    throw std::invalid_argument("row_exact_attention: a q8_0 or q4_0 KV cache needs a head dim of 32, 64 or 128");
  if (causal && q.shape(2) > k.shape(2))
    throw std::invalid_argument("row_exact_attention: a causal block cannot be longer than its keys");
  auto s = mx::default_stream(mx::Device::cpu);
  return mx::array(q.shape(), mx::float32, std::make_shared<RowExactAttention>(s, scale, causal), {q, k, v});
}

mx::array kv_rows(const mx::array& x, mx::Dtype dtype) {
  KvType t;
  if (!kv_type_of(dtype, &t)) throw std::invalid_argument("kv_rows: float32, float16, bfloat16, int8 (q8_0) or uint8 (q4_0) rows");
  if (x.ndim() < 1) throw std::invalid_argument("kv_rows: rows [..., D]");
  const int D = x.shape(-1);
  if (kv_blocks(t) && D % 32 != 0) throw std::invalid_argument("kv_rows: q8_0 and q4_0 rows hold whole blocks of 32");
  mx::array xs = mx::contiguous(mx::astype(x, mx::float32));
  mx::eval(xs);
  const int64_t rows = D ? xs.size() / D : 0, width = kv_row(D, t);
  mx::Shape shape = x.shape();
  shape.back() = static_cast<int>(width);
  const int64_t row_bytes = width * kv_bytes(t);
  mx::array out(mx::allocator::malloc(static_cast<size_t>(rows * row_bytes)), shape, dtype);
  for (int64_t r = 0; r < rows; ++r) store_kv_row(out.data<char>() + r * row_bytes, t, xs.data<float>() + r * D, D);
  return out;
}

}  // namespace mlxcel
