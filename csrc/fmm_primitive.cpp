// RowExactFMM: y_i = x @ W_i^T on the row-exact float kernel (fmm_kernel.h), and FloatRows: rows
// of a packed float weight as float32 (embedding lookups, blocks too wide for the kernel), on
// MLX's CPU stream.
#include "fmm_primitive.h"

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "runtime.h"

namespace mlxcel {

FloatForm float_form(const mx::array& w, const char* what) {
  if (w.dtype() == mx::float32) return FloatForm::f32;
  if (w.dtype() == mx::float16) return FloatForm::f16;
  if (w.dtype() == mx::bfloat16) return FloatForm::bf16;
  throw std::invalid_argument(std::string(what) + ": float weights are float32, float16 or bfloat16");
}

namespace {

const void* raw(const mx::array& a) { return a.data<uint8_t>(); }

// a packed weight [G, K, 16] for N outputs of K inputs
void check_packed(const mx::array& w, int N, int K, const char* what) {
  if (w.ndim() != 3 || w.shape(2) != kGroup || w.shape(0) != float_groups(N) || (K >= 0 && w.shape(1) != K) ||
      !w.flags().row_contiguous)
    throw std::invalid_argument(std::string(what) + ": w must be [ceil(N/16), K, 16] from float_repack (N = " +
                                std::to_string(N) + ")");
}

class RowExactFMM : public mx::Primitive {
 public:
  RowExactFMM(mx::Stream s, std::vector<int> ns) : mx::Primitive(s), ns_(std::move(ns)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    const int K = x.shape(-1);
    const int M = static_cast<int>(x.size() / K);
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) enc.set_input_array(a);
    std::vector<FloatWeightRef> refs;
    for (size_t i = 0; i < outputs.size(); ++i) {
      auto& out = outputs[i];
      out.set_data(mx::allocator::malloc(out.nbytes()));
      enc.set_output_array(out);
      refs.push_back({raw(inputs[1 + i]), float_form(inputs[1 + i], "row_exact_fmm"), out.data<float>(), ns_[i]});
    }
    enc.dispatch([inputs, refs = std::move(refs), M, K, threads = kernel_threads.load()]() {
      std::vector<float> scratch;
      const float* xp = contiguous_rows(inputs[0], scratch);
      auto t0 = std::chrono::steady_clock::now();
      fmm_multi(xp, refs.data(), static_cast<int>(refs.size()), M, K, threads);
      qmm_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      qmm_calls += 1;
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("row_exact_fmm runs on the CPU only");
  }

  const char* name() const override { return "RowExactFMM"; }

  bool is_equivalent(const mx::Primitive& other) const override { return ns_ == static_cast<const RowExactFMM&>(other).ns_; }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes;
    for (int n : ns_) {
      auto shape = inputs[0].shape();
      shape.back() = n;
      shapes.push_back(shape);
    }
    return shapes;
  }

 private:
  std::vector<int> ns_;
};

class FloatRows : public mx::UnaryPrimitive {
 public:
  FloatRows(mx::Stream s, int n) : mx::UnaryPrimitive(s), n_(n) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& w = inputs[0];
    const auto& ids = inputs[1];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.set_input_array(w);
    enc.set_input_array(ids);
    enc.set_output_array(out);
    enc.dispatch([w, ids, op = out.data<float>(), N = n_, K = w.shape(1), R = static_cast<int>(ids.size())]() {
      std::vector<uint32_t> ic;
      const uint32_t* ip = contiguous_rows(ids, ic);
      for (int r = 0; r < R; ++r)
        if (ip[r] >= static_cast<uint32_t>(N)) throw std::out_of_range("float_rows: row id out of range");
      float_rows(raw(w), float_form(w, "float_rows"), ip, R, N, K, op);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("float_rows runs on the CPU only");
  }

  const char* name() const override { return "FloatRows"; }

  bool is_equivalent(const mx::Primitive& other) const override { return n_ == static_cast<const FloatRows&>(other).n_; }

 private:
  int n_;
};

}  // namespace

mx::array float_repack_weight(mx::array w) {
  const FloatForm form = float_form(w, "float_repack");
  if (w.ndim() != 2) throw std::invalid_argument("float_repack: w must be [N, K]");
  const int N = w.shape(0), K = w.shape(1);
  w = mx::contiguous(w);
  mx::eval(w);
  mx::array out(mx::allocator::malloc(static_cast<size_t>(float_groups(N)) * kGroup * K * float_bytes(form)),
                {float_groups(N), K, kGroup}, w.dtype());
  float_repack(raw(w), out.data<uint8_t>(), form, N, K);
  return out;
}

std::vector<mx::array> row_exact_fmm_multi(const mx::array& x, const std::vector<mx::array>& ws, const std::vector<int>& ns) {
  if (ws.empty() || ws.size() != ns.size()) throw std::invalid_argument("row_exact_fmm: one output count per weight");
  if (x.ndim() < 1 || x.shape(-1) < 1) throw std::invalid_argument("row_exact_fmm: x must be [..., K]");
  const int K = x.shape(-1);
  auto s = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs{mx::astype(x, mx::float32, s)};
  std::vector<mx::Shape> shapes;
  for (size_t i = 0; i < ws.size(); ++i) {
    float_form(ws[i], "row_exact_fmm");
    if (ns[i] < 1) throw std::invalid_argument("row_exact_fmm: N must be at least 1");
    check_packed(ws[i], ns[i], K, "row_exact_fmm");
    inputs.push_back(ws[i]);
    auto shape = x.shape();
    shape.back() = ns[i];
    shapes.push_back(shape);
  }
  std::vector<mx::Dtype> dtypes(ws.size(), mx::float32);
  return mx::array::make_arrays(std::move(shapes), dtypes, std::make_shared<RowExactFMM>(s, ns), inputs);
}

mx::array float_weight_rows(const mx::array& w, int N, std::optional<mx::array> ids) {
  float_form(w, "float_rows");
  if (N < 1) throw std::invalid_argument("float_rows: N must be at least 1");
  check_packed(w, N, -1, "float_rows");
  auto s = mx::default_stream(mx::Device::cpu);
  mx::array rows = ids ? mx::contiguous(mx::astype(*ids, mx::uint32, s), false, s) : mx::arange(N, mx::uint32, s);
  auto shape = rows.shape();
  shape.push_back(w.shape(1));
  return mx::array(shape, mx::float32, std::make_shared<FloatRows>(s, N), {w, rows});
}

}  // namespace mlxcel
