// The MLX side of the row-exact kernels: custom primitives whose eval_cpu runs them on MLX's
// CPU stream (RowExactQMM: the quantized matmul, one or several weights per input;
// RowExactAttention; DequantizeRows), the eager repack/unpack helpers, and the Python binding
// (nanobind, in MLX's type domain so mx.array passes straight through). The kernels themselves
// (qmm_kernel, attention_kernel) see only pointers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <climits>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <list>
#include <mutex>
#include <cstring>
#include <chrono>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "attention_kernel.h"
#include "rowwise_kernel.h"
#include "qmm_kernel.h"

namespace mx = mlx::core;
namespace nb = nanobind;
using namespace nb::literals;

namespace mlxcel {
bool cpu_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

bool amx_supported() {
  static const bool ok = [] {
#if MLXCEL_AMX && defined(__linux__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!cpu_supported() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((d >> 24) & 1u) || !((d >> 25) & 1u)) return false;  // AMX-TILE, AMX-INT8
    // Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

std::atomic<int> amx_rows{INT_MAX};
}  // namespace mlxcel

namespace {

std::atomic<int> g_threads{1};
std::atomic<long long> g_ns{0}, g_calls{0};  // time in the matmul kernel (kernel_time(), for profiling)
std::atomic<long long> g_att_ns{0};          // time in the attention kernels (attention_time())

// x as a row-contiguous float buffer: its own data when it already is one, else a gathered copy
// (any strides; runs inside the dispatched task, when x's contents exist)
template <typename T>
const T* contiguous_rows(const mx::array& x, std::vector<T>& scratch) {
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

// y_i = x @ W_i^T for one input and 1..n weights of the same bits (inputs: x, then w, scales,
// biases per weight; one output per weight)
class RowExactQMM : public mx::Primitive {
 public:
  RowExactQMM(mx::Stream s, int bits) : mx::Primitive(s), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    const int count = static_cast<int>(outputs.size());
    const int K = x.shape(-1);
    const int M = static_cast<int>(x.size() / K);
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) enc.set_input_array(a);
    std::vector<mlxcel::WeightRef> refs;
    for (int i = 0; i < count; ++i) {
      auto& out = outputs[i];
      out.set_data(mx::allocator::malloc(out.nbytes()));
      enc.set_output_array(out);
      refs.push_back({nullptr, nullptr, nullptr, out.data<float>(), inputs[1 + 3 * i].shape(0)});
    }
    // parameters are evaluated, contiguous buffers; a strided view (a test's, a user's) is copied
    enc.dispatch([inputs, refs = std::move(refs), M, K, bits = bits_, threads = g_threads.load()]() mutable {
      std::vector<float> scratch;
      const float* xp = contiguous_rows(inputs[0], scratch);
      std::vector<std::vector<uint8_t>> wcopy(refs.size());
      std::vector<std::vector<float>> scopy(refs.size()), bcopy(refs.size());
      for (size_t i = 0; i < refs.size(); ++i) {
        refs[i].w = contiguous_rows(inputs[1 + 3 * i], wcopy[i]);
        refs[i].scales = contiguous_rows(inputs[2 + 3 * i], scopy[i]);
        refs[i].biases = contiguous_rows(inputs[3 + 3 * i], bcopy[i]);
      }
      auto t0 = std::chrono::steady_clock::now();
      mlxcel::qmm_multi(xp, refs.data(), static_cast<int>(refs.size()), M, K, bits, threads);
      g_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      g_calls += 1;
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("row_exact_qmm runs on the CPU only");
  }

  const char* name() const override { return "RowExactQMM"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return bits_ == static_cast<const RowExactQMM&>(other).bits_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes;
    for (size_t i = 1; i < inputs.size(); i += 3) {
      auto shape = inputs[0].shape();
      shape.back() = inputs[i].shape(0);
      shapes.push_back(shape);
    }
    return shapes;
  }

 private:
  int bits_;
};

// Rows of a repacked weight as float32: an embedding lookup (ids given) or the whole matrix
// (ids = 0..N-1) for blocks too wide for the row kernel, where BLAS on float32 is faster.
class DequantizeRows : public mx::UnaryPrimitive {
 public:
  DequantizeRows(mx::Stream s, int bits) : mx::UnaryPrimitive(s), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& w = inputs[0];
    const auto& sc = inputs[1];
    const auto& bi = inputs[2];
    const auto& ids = inputs[3];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    const int K = out.shape(-1);
    const int R = static_cast<int>(ids.size());
    const int N = w.shape(0);
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(w);
    enc.set_input_array(sc);
    enc.set_input_array(bi);
    enc.set_input_array(ids);
    enc.set_output_array(out);
    enc.dispatch([w, sc, bi, ids, op = out.data<float>(), R, K, N, bits = bits_]() {
      std::vector<uint8_t> wc;
      std::vector<float> sc_c, bi_c;
      std::vector<uint32_t> ic;
      const uint8_t* wp = contiguous_rows(w, wc);
      const float* sp = contiguous_rows(sc, sc_c);
      const float* bp = contiguous_rows(bi, bi_c);
      const uint32_t* ip = contiguous_rows(ids, ic);
      for (int r = 0; r < R; ++r)
        if (ip[r] >= static_cast<uint32_t>(N)) throw std::out_of_range("dequantize_rows: row id out of range");
      mlxcel::dequantize_rows(wp, sp, bp, ip, R, N, K, bits, op);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("dequantize_rows runs on the CPU only");
  }

  const char* name() const override { return "DequantizeRows"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return bits_ == static_cast<const DequantizeRows&>(other).bits_;
  }

 private:
  int bits_;
};

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
    mlxcel::AttentionArgs a{};
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
    enc.dispatch([a, q, k, v, threads = g_threads.load()]() mutable {
      a.q = q.data<float>();
      a.k = k.data<float>();
      a.v = v.data<float>();
      auto t0 = std::chrono::steady_clock::now();
      mlxcel::attention(a, threads);
      g_att_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
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

mx::array row_exact_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    throw std::invalid_argument("row_exact_attention: q, k, v must be [B, heads, length, dim]");
  if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32)
    throw std::invalid_argument("row_exact_attention: float32 only");
  if (k.shape() != v.shape() || q.shape(0) != k.shape(0) || q.shape(3) != k.shape(3) || k.shape(1) == 0 ||
      q.shape(1) % k.shape(1) != 0)
    throw std::invalid_argument("row_exact_attention: shapes do not match (query heads must be a multiple of KV heads)");
  if (causal && q.shape(2) > k.shape(2))
    throw std::invalid_argument("row_exact_attention: a causal block cannot be longer than its keys");
  auto s = mx::default_stream(mx::Device::cpu);
  return mx::array(q.shape(), mx::float32, std::make_shared<RowExactAttention>(s, scale, causal), {q, k, v});
}

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
std::atomic<long long> g_buffers_donated{0}, g_buffers_copied{0};

// MLX's is_donatable() asks for a descriptor referenced once, but every output of a multi-output
// primitive keeps its own copy of the inputs (array::make_arrays), so an input that only this
// op's outputs hold shows one reference per output. The descriptor's count is read through
// array's one member, a std::shared_ptr<ArrayDesc> (mlx/array.h); the rest is is_donatable's test.
bool donatable_by(const mx::array& in, size_t outputs) {
  static_assert(sizeof(mx::array) == sizeof(std::shared_ptr<void>), "mlx::core::array is one shared_ptr");
  const long refs = reinterpret_cast<const std::shared_ptr<void>&>(in).use_count();
  return refs == static_cast<long>(outputs) && in.data_shared_ptr().use_count() == 1 &&
         in.data_shared_ptr()->is_owned() && in.flags().row_contiguous;
}

class RowExactCacheAttention : public mx::Primitive {
 public:
  RowExactCacheAttention(mx::Stream s, std::vector<int> seq, std::vector<int> pos, float scale)
      : mx::Primitive(s), seq_(std::move(seq)), pos_(std::move(pos)), scale_(scale) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& q = inputs[0];
    const int E = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
    const int Hkv = inputs[1].shape(1);
    const int S = static_cast<int>(inputs.size() - 3) / 2;
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    std::vector<mx::array> copy_from;  // buffers that could not be donated
    std::vector<int> copy_to;
    for (int j = 0; j < 2 * S; ++j) {
      const auto& in = inputs[3 + j];
      auto& o = outputs[1 + j];
      if (donatable_by(in, outputs.size())) {
        o.copy_shared_buffer(in);
        g_buffers_donated += 1;
      } else {
        o.set_data(mx::allocator::malloc(o.nbytes()));
        copy_from.push_back(in);
        copy_to.push_back(1 + j);
        g_buffers_copied += 1;
      }
    }
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) enc.set_input_array(a);
    for (auto& o : outputs) enc.set_output_array(o);
    std::vector<float*> bufs(2 * S);
    for (int j = 0; j < 2 * S; ++j) bufs[j] = outputs[1 + j].data<float>();
    std::vector<int64_t> head_stride(S);
    for (int b = 0; b < S; ++b) head_stride[b] = static_cast<int64_t>(outputs[1 + b].shape(2)) * D;
    std::vector<float*> copy_dst;
    for (int j : copy_to) copy_dst.push_back(outputs[j].data<float>());
    enc.dispatch([q, kn = inputs[1], vn = inputs[2], copy_from = std::move(copy_from),
                  copy_dst = std::move(copy_dst), bufs = std::move(bufs), head_stride = std::move(head_stride),
                  seq = seq_, pos = pos_, scale = scale_, op = out.data<float>(), E, S, Hq, Hkv, L, D,
                  threads = g_threads.load()]() {
      for (size_t c = 0; c < copy_from.size(); ++c) {
        std::vector<float> scratch;
        const float* src = contiguous_rows(copy_from[c], scratch);
        std::memcpy(copy_dst[c], src, copy_from[c].nbytes());
      }
      // every row's key and value into its sequence's buffers: [h, pos_e + i, :] = new[e, h, i, :]
      for (int which = 0; which < 2; ++which) {
        const auto& src = which == 0 ? kn : vn;
        const float* base = src.data<float>();
        const auto& st = src.strides();
        for (int e = 0; e < E; ++e) {
          float* dst = bufs[which * S + seq[e]];
          for (int h = 0; h < Hkv; ++h)
            for (int i = 0; i < L; ++i)
              std::memcpy(dst + h * head_stride[seq[e]] + static_cast<int64_t>(pos[e] + i) * D,
                          base + e * st[0] + h * st[1] + i * st[2], sizeof(float) * D);
        }
      }
      std::vector<const float*> kp(E), vp(E);
      std::vector<int64_t> stride(E);
      for (int e = 0; e < E; ++e) {
        kp[e] = bufs[seq[e]];
        vp[e] = bufs[S + seq[e]];
        stride[e] = head_stride[seq[e]];
      }
      mlxcel::RowsAttentionArgs a{};
      a.q = q.data<float>();
      for (int d = 0; d < 3; ++d) a.q_strides[d] = q.strides()[d];
      a.k = kp.data();
      a.v = vp.data();
      a.head_stride = stride.data();
      a.offset = pos.data();
      a.out = op;
      a.B = E;
      a.Hq = Hq;
      a.Hkv = Hkv;
      a.L = L;
      a.D = D;
      a.scale = scale;
      auto t0 = std::chrono::steady_clock::now();
      mlxcel::attention_rows(a, threads);
      g_att_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("row_exact_cache_attention runs on the CPU only");
  }

  const char* name() const override { return "RowExactCacheAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowExactCacheAttention&>(other);
    return seq_ == o.seq_ && pos_ == o.pos_ && scale_ == o.scale_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes{inputs[0].shape()};
    for (size_t i = 3; i < inputs.size(); ++i) shapes.push_back(inputs[i].shape());
    return shapes;
  }

 private:
  std::vector<int> seq_, pos_;
  float scale_;
};

std::vector<mx::array> row_exact_cache_attention(const mx::array& q, const mx::array& k_new, const mx::array& v_new,
                                                 const std::vector<mx::array>& k_bufs,
                                                 const std::vector<mx::array>& v_bufs, const std::vector<int>& seq,
                                                 const std::vector<int>& pos, float scale) {
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
      if (buf->dtype() != mx::float32 || buf->ndim() != 4 || buf->shape(0) != 1 || buf->shape(1) != Hkv ||
          buf->shape(3) != D)
        throw std::invalid_argument(std::string(what) + "buffer " + std::to_string(b) + " must be float32 [1, Hkv, capacity, D]");
  for (int e = 0; e < E; ++e)
    if (seq[e] < 0 || seq[e] >= S || pos[e] < 0 || k_bufs[seq[e]].shape(2) < pos[e] + L ||
        v_bufs[seq[e]].shape(2) < pos[e] + L)
      throw std::invalid_argument(std::string(what) + "entry " + std::to_string(e) +
                                  ": no such sequence, or its buffer " + std::to_string(seq[e]) +
                                  " has no room for positions up to pos + L");
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
  std::vector<mx::Dtype> dtypes(shapes.size(), mx::float32);
  return mx::array::make_arrays(std::move(shapes), dtypes,
                                std::make_shared<RowExactCacheAttention>(s, seq, pos, scale), inputs);
}

// silu(gate) * up, elementwise (rowwise_kernel.h)
class RowSwiGLU : public mx::UnaryPrimitive {
 public:
  explicit RowSwiGLU(mx::Stream s) : mx::UnaryPrimitive(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& g = inputs[0];
    const auto& u = inputs[1];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(g);
    enc.set_input_array(u);
    enc.set_output_array(out);
    enc.dispatch([g, u, op = out.data<float>(), n = static_cast<int64_t>(out.size())]() {
      mlxcel::swiglu(g.data<float>(), u.data<float>(), op, n);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("row_swiglu runs on the CPU only");
  }

  const char* name() const override { return "RowSwiGLU"; }

  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

mx::array row_swiglu(const mx::array& gate, const mx::array& up) {
  if (gate.dtype() != mx::float32 || up.dtype() != mx::float32 || gate.shape() != up.shape())
    throw std::invalid_argument("row_swiglu: float32 gate and up of one shape");
  auto s = mx::default_stream(mx::Device::cpu);
  return mx::array(gate.shape(), mx::float32, std::make_shared<RowSwiGLU>(s),
                   {mx::contiguous(gate, false, s), mx::contiguous(up, false, s)});
}

// Rotary embeddings with each batch entry at its own offset (rowwise_kernel.h). The cos/sin
// table of a forward's positions is made once and kept for its other layers (a few recent tables).
struct RopeTables {
  struct Entry {
    int dims;
    float base, scale;
    std::vector<int32_t> pos;
    std::shared_ptr<const std::vector<float>> table;
  };
  std::mutex m;
  std::list<Entry> entries;

  // shared, so a table evicted by another caller stays valid for the one using it
  std::shared_ptr<const std::vector<float>> get(const std::vector<int32_t>& pos, int dims, float base, float scale) {
    std::lock_guard<std::mutex> lock(m);
    for (auto it = entries.begin(); it != entries.end(); ++it)
      if (it->dims == dims && it->base == base && it->scale == scale && it->pos == pos) {
        entries.splice(entries.begin(), entries, it);
        return entries.front().table;
      }
    auto table = std::make_shared<std::vector<float>>(pos.size() * static_cast<size_t>(dims));
    mlxcel::rope_table(pos.data(), static_cast<int>(pos.size()), dims, base, scale, table->data());
    entries.push_front(Entry{dims, base, scale, pos, table});
    if (entries.size() > 4) entries.pop_back();
    return table;
  }
};
RopeTables g_rope_tables;

class RowRope : public mx::UnaryPrimitive {
 public:
  RowRope(mx::Stream s, int dims, bool traditional, float base, float scale, int offset)
      : mx::UnaryPrimitive(s), dims_(dims), traditional_(traditional), base_(base), scale_(scale), offset_(offset) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    std::optional<mx::array> offsets;
    if (inputs.size() > 1) offsets = inputs[1];
    enc.dispatch([x, offsets, op = out.data<float>(), dims = dims_, trad = traditional_, base = base_,
                  scale = scale_, offset = offset_, threads = g_threads.load()]() {
      const int B = x.shape(0), H = x.shape(1), L = x.shape(2), D = x.shape(3);
      std::vector<int32_t> pos(static_cast<size_t>(B) * L);
      for (int b = 0; b < B; ++b) {
        const int32_t o = offsets ? offsets->data<int32_t>()[offsets->size() == 1 ? 0 : b] : offset;
        for (int l = 0; l < L; ++l) pos[static_cast<size_t>(b) * L + l] = o + l;
      }
      const auto table = g_rope_tables.get(pos, dims, base, scale);
      const int64_t st[3] = {x.strides()[0], x.strides()[1], x.strides()[2]};
      mlxcel::rope(x.data<float>(), st, op, B, H, L, D, dims, trad, table->data(), threads);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("row_rope runs on the CPU only");
  }

  const char* name() const override { return "RowRope"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowRope&>(other);
    return dims_ == o.dims_ && traditional_ == o.traditional_ && base_ == o.base_ && scale_ == o.scale_ &&
           offset_ == o.offset_;
  }

 private:
  int dims_;
  bool traditional_;
  float base_, scale_;
  int offset_;
};

mx::array row_rope(const mx::array& x, int dims, bool traditional, float base, float scale, int offset,
                   std::optional<mx::array> offsets) {
  if (x.ndim() != 4 || x.dtype() != mx::float32)
    throw std::invalid_argument("row_rope: x must be float32 [B, heads, length, dim]");
  if (dims <= 0 || dims % 2 != 0 || dims > x.shape(3))
    throw std::invalid_argument("row_rope: dims must be even and at most the head width");
  auto s = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs{x.strides()[3] == 1 ? x : mx::contiguous(x, false, s)};
  if (offsets) {
    if (offsets->ndim() > 1 || (offsets->size() != 1 && static_cast<int>(offsets->size()) != x.shape(0)))
      throw std::invalid_argument("row_rope: offsets must be one per batch entry");
    // a batched forward passes one evaluated int32 vector to every layer's two ropes: used as it
    // is, instead of two more graph nodes per call (120 a forward on the default model)
    const bool ready = offsets->ndim() == 1 && offsets->dtype() == mx::int32 && offsets->is_available() &&
                       offsets->flags().row_contiguous;
    inputs.push_back(ready ? *offsets : mx::contiguous(mx::astype(mx::reshape(*offsets, {-1}, s), mx::int32, s), false, s));
  }
  return mx::array(x.shape(), mx::float32, std::make_shared<RowRope>(s, dims, traditional, base, scale, offset),
                   inputs);
}

void check_bits(int bits) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("bits must be 4 or 8");
}

std::vector<mx::array> row_exact_qmm_multi(const mx::array& x, const std::vector<mx::array>& ws,
                                           const std::vector<mx::array>& scales, const std::vector<mx::array>& biases,
                                           int bits) {
  check_bits(bits);
  if (ws.empty() || ws.size() != scales.size() || ws.size() != biases.size())
    throw std::invalid_argument("row_exact_qmm: one scales and biases array per weight");
  if (x.ndim() < 1) throw std::invalid_argument("row_exact_qmm: x must be [..., K]");
  const int K = x.shape(-1);
  if (K % 64 != 0) throw std::invalid_argument("row_exact_qmm: K=" + std::to_string(K) + " is not a multiple of 64");
  std::vector<mx::array> inputs;
  auto s = mx::default_stream(mx::Device::cpu);
  inputs.push_back(mx::astype(x, mx::float32, s));
  std::vector<mx::Shape> shapes;
  for (size_t i = 0; i < ws.size(); ++i) {
    const auto &w = ws[i], &sc = scales[i], &bi = biases[i];
    if (w.ndim() != 2 || w.dtype() != mx::uint8 || static_cast<size_t>(w.shape(1)) != mlxcel::row_bytes(K, bits))
      throw std::invalid_argument("row_exact_qmm: w must be uint8 [N, K*bits/8] from repack()");
    if (sc.dtype() != mx::float32 || bi.dtype() != mx::float32 || sc.ndim() != 2 || sc.shape(0) != w.shape(0) ||
        sc.shape(1) != K / 32 || bi.shape() != sc.shape())
      throw std::invalid_argument("row_exact_qmm: scales/biases must be float32 [N, K/32]");
    inputs.push_back(w);
    inputs.push_back(sc);
    inputs.push_back(bi);
    auto shape = x.shape();
    shape.back() = w.shape(0);
    shapes.push_back(shape);
  }
  std::vector<mx::Dtype> dtypes(ws.size(), mx::float32);
  // the weights are evaluated parameters (row contiguous); eval_cpu checks rather than copies
  return mx::array::make_arrays(std::move(shapes), dtypes, std::make_shared<RowExactQMM>(s, bits), inputs);
}

mx::array row_exact_qmm(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                        int bits) {
  return row_exact_qmm_multi(x, {w}, {scales}, {biases}, bits)[0];
}

mx::array dequantize_rows(const mx::array& w, const mx::array& scales, const mx::array& biases, int bits,
                          std::optional<mx::array> ids) {
  check_bits(bits);
  if (w.ndim() != 2 || w.dtype() != mx::uint8 || scales.dtype() != mx::float32 || biases.dtype() != mx::float32)
    throw std::invalid_argument("dequantize_rows: w uint8 [N, K*bits/8] from repack, float32 scales/biases");
  const int N = w.shape(0);
  const int K = w.shape(1) * 8 / bits;
  auto s = mx::default_stream(mx::Device::cpu);
  mx::array rows = ids ? mx::contiguous(mx::astype(*ids, mx::uint32, s), false, s) : mx::arange(N, mx::uint32, s);
  auto shape = rows.shape();
  shape.push_back(K);
  return mx::array(shape, mx::float32, std::make_shared<DequantizeRows>(s, bits), {w, scales, biases, rows});
}

// MLX affine rows (uint32 [N, K*bits/32]) -> the kernel's layout (uint8 [N, K*bits/8]); eager.
mx::array repack(mx::array w, int bits) {
  check_bits(bits);
  if (w.ndim() != 2 || w.dtype() != mx::uint32) throw std::invalid_argument("repack: w must be uint32 [N, K*bits/32]");
  const int N = w.shape(0);
  const int K = w.shape(1) * 32 / bits;
  if (K % 64 != 0) throw std::invalid_argument("repack: K must be a multiple of 64");
  w = mx::contiguous(w);
  mx::eval(w);
  const size_t rb = mlxcel::row_bytes(K, bits);
  mx::array out(mx::allocator::malloc(N * rb), {N, static_cast<int>(rb)}, mx::uint8);
  const uint8_t* src = w.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  mlxcel::repack(src, dst, N, K, bits);
  return out;
}

// Per-block scales or biases [N, K/32] into the kernel's interleaved order; eager.
mx::array interleave(mx::array a) {
  if (a.ndim() != 2 || a.dtype() != mx::float32) throw std::invalid_argument("interleave: float32 [N, K/32] only");
  a = mx::contiguous(a);
  mx::eval(a);
  mx::array out(mx::allocator::malloc(a.nbytes()), a.shape(), mx::float32);
  mlxcel::interleave(a.data<float>(), out.data<float>(), a.shape(0), a.shape(1));
  return out;
}

// The kernel's layout back to one uint8 value per weight, natural order [N, K]; eager.
mx::array unpack(mx::array w, int bits) {
  check_bits(bits);
  if (w.ndim() != 2 || w.dtype() != mx::uint8) throw std::invalid_argument("unpack: w must be uint8 [N, K*bits/8]");
  const int N = w.shape(0);
  const int K = w.shape(1) * 8 / bits;
  w = mx::contiguous(w);
  mx::eval(w);
  mx::array out(mx::allocator::malloc(static_cast<size_t>(N) * K), {N, K}, mx::uint8);
  mlxcel::unpack(w.data<uint8_t>(), out.data<uint8_t>(), N, K, bits);
  return out;
}

}  // namespace

NB_MODULE(_qmm, m) {
  m.doc() = "Row-exact int8 x 4/8-bit affine matmul for MLX on x86 CPUs (AVX-512 VNNI)";
  m.def("row_exact_qmm", &row_exact_qmm, "x"_a, "w"_a, "scales"_a, "biases"_a, "bits"_a,
        "x @ W.T for W = scales * q + biases per block of 32 (w from repack); each output row is "
        "bit-identical whatever the number of rows");
  m.def("row_exact_qmm_multi", &row_exact_qmm_multi, "x"_a, "ws"_a, "scales"_a, "biases"_a, "bits"_a,
        "[x @ W_i.T] for weights sharing one input (x quantized once); each equals row_exact_qmm alone");
  m.def("row_exact_attention", &row_exact_attention, "q"_a, "k"_a, "v"_a, "scale"_a, "causal"_a,
        "softmax(scale q k^T) v computed one query row at a time (row i of a causal block sees keys "
        "0..S-L+i): each row bit-identical to a one-row call at the same position");
  m.def("row_exact_cache_attention", &row_exact_cache_attention, "q"_a, "k_new"_a, "v_new"_a, "k_bufs"_a,
        "v_bufs"_a, "seq"_a, "pos"_a, "scale"_a,
        "entries of L rows, entry e of sequence seq[e] at positions pos[e]..: their new keys/values "
        "written into that sequence's buffers and each row attended over keys 0..its position of its "
        "own sequence: [attention, k_bufs..., v_bufs...]; rows equal row_exact_attention over each "
        "sequence alone");
  m.def("buffer_updates", []() { return std::make_pair(g_buffers_donated.load(), g_buffers_copied.load()); },
        "(buffers updated in place, buffers copied first) by row_exact_cache_attention so far");
  m.def("row_swiglu", &row_swiglu, "gate"_a, "up"_a, "silu(gate) * up, elementwise (vectorised exp)");
  m.def("row_rope", &row_rope, "x"_a, "dims"_a, "traditional"_a, "base"_a, "scale"_a, "offset"_a = 0,
        "offsets"_a = nb::none(),
        "rotary embedding of x [B, heads, L, dim], entry b at offsets[b] (or offset); each row depends "
        "on its own values and position alone");
  m.def("dequantize_rows", &dequantize_rows, "w"_a, "scales"_a, "biases"_a, "bits"_a, "ids"_a = nb::none(),
        "rows ids (default: all) of a repacked weight as float32 [..., K]");
  m.def("repack", &repack, "w"_a, "bits"_a, "MLX affine uint32 rows -> the kernel's uint8 layout (eager)");
  m.def("interleave", &interleave, "a"_a,
        "per-block scales or biases float32 [N, K/32] -> the kernel's order (16 rows side by side per block; eager)");
  m.def("unpack", &unpack, "w"_a, "bits"_a, "the kernel's layout -> uint8 values [N, K] (eager)");
  m.def("cpu_supported", &mlxcel::cpu_supported, "whether this CPU has AVX-512 F/BW/VL and VNNI");
  m.def("amx_supported", &mlxcel::amx_supported,
        "whether AMX int8 tiles are usable here (CPU and OS; the extension built with them)");
  m.def("set_amx_rows", [](int n) {
          mlxcel::amx_rows.store(n > 0 && mlxcel::amx_supported() ? n : INT_MAX);
          return mlxcel::amx_rows.load() != INT_MAX;
        }, "n"_a, "blocks of at least n rows go through AMX tiles (0: never); returns whether AMX is on");
  m.def("amx_rows", []() { const int n = mlxcel::amx_rows.load(); return n == INT_MAX ? 0 : n; });
  m.def("set_threads", [](int n) { g_threads.store(n < 1 ? 1 : n); }, "n"_a);
  m.def("threads", []() { return g_threads.load(); });
  m.def("kernel_time", []() { return std::make_pair(g_ns.load() * 1e-9, g_calls.load()); },
        "(seconds spent in the row kernel, calls) since the process started");
  m.def("attention_time", []() { return g_att_ns.load() * 1e-9; },
        "seconds spent in the row-exact attention kernels since the process started");
}
