// RowExactQMM: y_i = x @ W_i^T on the row-exact kernel (qmm_kernel.h), one or several weights per
// input, on MLX's CPU stream.
#include "qmm_primitive.h"

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "runtime.h"
#include "qmm_kernel.h"

namespace mx = mlx::core;

namespace mlxcel {

namespace {

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
    std::vector<WeightRef> refs;
    for (int i = 0; i < count; ++i) {
      auto& out = outputs[i];
      out.set_data(mx::allocator::malloc(out.nbytes()));
      enc.set_output_array(out);
      refs.push_back({nullptr, nullptr, nullptr, out.data<float>(), inputs[1 + 3 * i].shape(0)});
    }
    // parameters are evaluated, contiguous buffers; a strided view (a test's, a user's) is copied
    enc.dispatch([inputs, refs = std::move(refs), M, K, bits = bits_, threads = kernel_threads.load()]() mutable {
      std::vector<float> scratch;
      const float* xp = contiguous_rows(inputs[0], scratch);
      std::vector<std::vector<uint8_t>> wcopy(refs.size());
      std::vector<std::vector<float>> scopy(refs.size()), bcopy(refs.size());
      std::vector<std::vector<uint16_t>> hscopy(refs.size()), hbcopy(refs.size());
      for (size_t i = 0; i < refs.size(); ++i) {
        refs[i].w = contiguous_rows(inputs[1 + 3 * i], wcopy[i]);
        refs[i].half = inputs[2 + 3 * i].dtype() == mx::float16;
        const bool sym = no_biases(inputs[3 + 3 * i]);
        if (refs[i].half) {
          refs[i].scales = contiguous_rows(inputs[2 + 3 * i], hscopy[i]);
          refs[i].biases = sym ? nullptr : contiguous_rows(inputs[3 + 3 * i], hbcopy[i]);
        } else {
          refs[i].scales = contiguous_rows(inputs[2 + 3 * i], scopy[i]);
          refs[i].biases = sym ? nullptr : contiguous_rows(inputs[3 + 3 * i], bcopy[i]);
        }
      }
      auto t0 = std::chrono::steady_clock::now();
      qmm_multi(xp, refs.data(), static_cast<int>(refs.size()), M, K, bits, threads);
      qmm_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      qmm_calls += 1;
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

}  // namespace

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
    if (w.ndim() != 2 || w.dtype() != mx::uint8 || static_cast<size_t>(w.shape(1)) != row_bytes(K, bits))
      throw std::invalid_argument("row_exact_qmm: w must be uint8 [N, K*bits/8] from repack()");
    if (!biases_fit(sc, bi) || sc.ndim() != 2 || sc.shape(0) != w.shape(0) || sc.shape(1) != K / 32)
      throw std::invalid_argument(
          "row_exact_qmm: scales/biases must be float32 (or both float16) [N, K/32] (empty biases: symmetric)");
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

}  // namespace mlxcel
