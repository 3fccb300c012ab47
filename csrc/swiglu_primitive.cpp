// RowSwiGLU: silu(gate) * up, elementwise (rowwise_kernel.h), on MLX's CPU stream.
#include "swiglu_primitive.h"

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "runtime.h"
#include "rowwise_kernel.h"

namespace mx = mlx::core;

namespace mlxcel {

namespace {

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
      swiglu(g.data<float>(), u.data<float>(), op, n);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("row_swiglu runs on the CPU only");
  }

  const char* name() const override { return "RowSwiGLU"; }

  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

}  // namespace

mx::array row_swiglu(const mx::array& gate, const mx::array& up) {
  if (gate.dtype() != mx::float32 || up.dtype() != mx::float32 || gate.shape() != up.shape())
    throw std::invalid_argument("row_swiglu: float32 gate and up of one shape");
  auto s = mx::default_stream(mx::Device::cpu);
  return mx::array(gate.shape(), mx::float32, std::make_shared<RowSwiGLU>(s),
                   {mx::contiguous(gate, false, s), mx::contiguous(up, false, s)});
}

}  // namespace mlxcel
