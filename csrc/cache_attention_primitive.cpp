// RowExactCacheAttention: one layer's cache writes and attentions of a batched forward over
// sequences that each keep their own KV buffers (serve -np N), in one op.
#include "cache_attention_primitive.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "runtime.h"
#include "attention_kernel.h"
#include "tree_rows.h"

namespace mx = mlx::core;

namespace mlxcel {

namespace {

// One layer of a batched forward over sequences that each keep their own KV buffer (serve -np
// N), in one op instead of per-sequence cache updates, attentions and a concatenation. The block
// is E entries of L query rows; entry e belongs to sequence seq[e] and its rows stand at
// positions pos[e]..pos[e]+L-1. Every row's new key and value are written into its sequence's
// buffers at its position, then each row attends keys 0..its position of its own sequence
// (attention_rows: the one-row code of row_exact_attention). Two layouts use it: a padded block
// (entry e = sequence e, L rows) and a ragged one (entries of one row each, several of them the
// rows of one sequence's verify block, so nothing is padded).
// Inputs: q [E, Hq, L, D], new keys and values [E, Hkv, L, D], then the S key buffers and the S
// value buffers ([1, Hkv, cap_s, D]); outputs: the attention [E, Hq, L, D], then the updated key
// buffers and value buffers. A buffer nobody else holds is updated in place (donated), as MLX's
// own slice update does; one still referenced elsewhere is copied first.

class RowExactCacheAttention : public mx::Primitive {
 public:
  RowExactCacheAttention(mx::Stream s, std::vector<int> seq, std::vector<int> pos, float scale, TreeRows tree)
      : mx::Primitive(s), seq_(std::move(seq)), pos_(std::move(pos)), scale_(scale), tree_(std::move(tree)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& q = inputs[0];
    const int E = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
    const int Hkv = inputs[1].shape(1);
    const int S = static_cast<int>(inputs.size() - 3) / 2;
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    const BufferWrites writes = take_buffers(inputs, 3, outputs, 1, 2 * S);
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) enc.set_input_array(a);
    for (auto& o : outputs) enc.set_output_array(o);
    std::vector<void*> bufs(2 * S);
    for (int j = 0; j < 2 * S; ++j) bufs[j] = outputs[1 + j].data<void>();
    KvType kt = KvType::f32, vt = KvType::f32;
    kv_type_of(outputs[1], &kt);
    kv_type_of(outputs[1 + S], &vt);
    std::vector<int64_t> capacity(S);
    for (int b = 0; b < S; ++b) capacity[b] = outputs[1 + b].shape(2);
    enc.dispatch([q, kn = inputs[1], vn = inputs[2], writes, bufs = std::move(bufs),
                  capacity = std::move(capacity), seq = seq_, pos = pos_, scale = scale_, tree = tree_,
                  op = out.data<float>(), E, S, Hq, Hkv, L, D, kt, vt, threads = kernel_threads.load()]() {
      writes.copy();
      // every row's key and value into its sequence's buffers: [h, pos_e + i, :] = new[e, h, i, :]
      // (tree rows, L == 1: at the entry's slot)
      for (int which = 0; which < 2; ++which) {
        const auto& src = which == 0 ? kn : vn;
        const KvType t = which == 0 ? kt : vt;
        const float* base = src.data<float>();
        const auto& st = src.strides();
        for (int e = 0; e < E; ++e) {
          void* dst = bufs[which * S + seq[e]];
          for (int h = 0; h < Hkv; ++h)
            for (int i = 0; i < L; ++i)
              store_kv_row(kv_row_at(dst, capacity[seq[e]], h, tree.empty() ? pos[e] + i : tree.slot[e], D, t), t, base + e * st[0] + h * st[1] + i * st[2], D);
        }
      }
      std::vector<const void*> kp(E), vp(E);
      std::vector<int64_t> cap(E);
      for (int e = 0; e < E; ++e) {
        kp[e] = bufs[seq[e]];
        vp[e] = bufs[S + seq[e]];
        cap[e] = capacity[seq[e]];
      }
      RowsAttentionArgs a{};
      a.q = q.data<float>();
      for (int d = 0; d < 3; ++d) a.q_strides[d] = q.strides()[d];
      a.k = kp.data();
      a.v = vp.data();
      a.kt = kt;
      a.vt = vt;
      a.capacity = cap.data();
      a.offset = pos.data();
      a.out = op;
      a.B = E;
      a.Hq = Hq;
      a.Hkv = Hkv;
      a.L = L;
      a.D = D;
      a.scale = scale;
      const TreeTails tails(tree);
      if (!tree.empty()) {
        a.vis_base = tree.base.data();
        a.vis_tail = tails.ptr.data();
        a.vis_tail_n = tails.n.data();
      }
      auto t0 = std::chrono::steady_clock::now();
      attention_rows(a, threads);
      attention_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("row_exact_cache_attention runs on the CPU only");
  }

  const char* name() const override { return "RowExactCacheAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowExactCacheAttention&>(other);
    return seq_ == o.seq_ && pos_ == o.pos_ && scale_ == o.scale_ && tree_ == o.tree_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes{inputs[0].shape()};
    for (size_t i = 3; i < inputs.size(); ++i) shapes.push_back(inputs[i].shape());
    return shapes;
  }

 private:
  std::vector<int> seq_, pos_;
  float scale_;
  TreeRows tree_;
};

}  // namespace

std::vector<mx::array> row_exact_cache_attention(const mx::array& q, const mx::array& k_new, const mx::array& v_new,
                                                 const std::vector<mx::array>& k_bufs,
                                                 const std::vector<mx::array>& v_bufs, const std::vector<int>& seq,
                                                 const std::vector<int>& pos, float scale, const TreeRows& tree) {
  const char* what = "row_exact_cache_attention: ";
  if (q.ndim() != 4 || k_new.ndim() != 4 || v_new.ndim() != 4)
    throw std::invalid_argument(std::string(what) + "q, k_new, v_new must be [entries, heads, length, dim]");
  const int E = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3), Hkv = k_new.shape(1);
  const int S = static_cast<int>(k_bufs.size());
  if (k_new.shape() != v_new.shape() || k_new.shape(0) != E || k_new.shape(2) != L || k_new.shape(3) != D ||
      Hkv == 0 || Hq % Hkv != 0)
    throw std::invalid_argument(std::string(what) + "shapes do not match (query heads must be a multiple of KV heads)");
  if (static_cast<int>(v_bufs.size()) != S || static_cast<int>(seq.size()) != E || static_cast<int>(pos.size()) != E)
    throw std::invalid_argument(std::string(what) + "one value buffer per key buffer, one sequence and position per entry");
  for (const auto* x : {&q, &k_new, &v_new})
    if (x->dtype() != mx::float32) throw std::invalid_argument(std::string(what) + "float32 only");
  for (int b = 0; b < S; ++b)
    for (const auto* buf : {&k_bufs[b], &v_bufs[b]})
      if (buf->ndim() != 4 || buf->shape(0) != 1 || buf->shape(1) != Hkv)
        throw std::invalid_argument(std::string(what) + "buffer " + std::to_string(b) + " must be [1, Hkv, capacity, row]");
  KvType kt, vt;
  kv_types(k_bufs, v_bufs, what, &kt, &vt);
  check_kv_rows(k_bufs, v_bufs, D, kt, vt, what);
  if (!tree.empty() && L != 1)
    throw std::invalid_argument(std::string(what) + "tree rows are entries of one row each");
  for (int e = 0; e < E; ++e)
    if (seq[e] < 0 || seq[e] >= S || pos[e] < 0 ||
        (tree.empty() && (k_bufs[seq[e]].shape(2) < pos[e] + L || v_bufs[seq[e]].shape(2) < pos[e] + L)))
      throw std::invalid_argument(std::string(what) + "entry " + std::to_string(e) +
                                  ": no such sequence, or its buffer " + std::to_string(seq[e]) +
                                  " has no room for positions up to pos + L");
  if (!tree.empty()) {
    std::vector<int> capacity;
    for (int b = 0; b < S; ++b) capacity.push_back(std::min(k_bufs[b].shape(2), v_bufs[b].shape(2)));
    tree.check(what, seq, capacity);
  }
  auto s = mx::default_stream(mx::Device::cpu);
  // the kernel reads rows with a contiguous last axis; rope's and the projections' outputs are
  std::vector<mx::array> inputs{mx::contiguous(q, false, s), mx::contiguous(k_new, false, s),
                                mx::contiguous(v_new, false, s)};
  std::vector<mx::Shape> shapes{q.shape()};
  for (const auto* bufs : {&k_bufs, &v_bufs})
    for (const auto& buf : *bufs) {
      inputs.push_back(buf);
      shapes.push_back(buf.shape());
    }
  std::vector<mx::Dtype> dtypes{mx::float32};
  for (const auto* bufs : {&k_bufs, &v_bufs})
    for (const auto& buf : *bufs) dtypes.push_back(buf.dtype());
  return mx::array::make_arrays(std::move(shapes), dtypes,
                                std::make_shared<RowExactCacheAttention>(s, seq, pos, scale, tree), inputs);
}

}  // namespace mlxcel
