// DequantizeRows: rows of a repacked weight as float32 (an embedding lookup, or a block too wide
// for the row kernel), on MLX's CPU stream.
#include "dequantize_primitive.h"

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
      std::vector<uint16_t> hsc_c, hbi_c;
      std::vector<uint32_t> ic;
      const uint8_t* wp = contiguous_rows(w, wc);
      const bool half = sc.dtype() == mx::float16;
      const void* sp = half ? static_cast<const void*>(contiguous_rows(sc, hsc_c)) : contiguous_rows(sc, sc_c);
      const void* bp = no_biases(bi) ? nullptr
                       : half ? static_cast<const void*>(contiguous_rows(bi, hbi_c))
                              : contiguous_rows(bi, bi_c);
      const uint32_t* ip = contiguous_rows(ids, ic);
      for (int r = 0; r < R; ++r)
        if (ip[r] >= static_cast<uint32_t>(N)) throw std::out_of_range("dequantize_rows: row id out of range");
      dequantize_rows(wp, sp, bp, half, ip, R, N, K, bits, op);
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

}  // namespace

mx::array dequantize_weight_rows(const mx::array& w, const mx::array& scales, const mx::array& biases, int bits,
                          std::optional<mx::array> ids) {
  check_bits(bits);
  if (w.ndim() != 2 || w.dtype() != mx::uint8 || !biases_fit(scales, biases))
    throw std::invalid_argument("dequantize_rows: w uint8 [N, K*bits/8] from repack, float32 (or float16) scales/biases");
  const int N = w.shape(0);
  const int K = w.shape(1) * 8 / bits;
  auto s = mx::default_stream(mx::Device::cpu);
  mx::array rows = ids ? mx::contiguous(mx::astype(*ids, mx::uint32, s), false, s) : mx::arange(N, mx::uint32, s);
  auto shape = rows.shape();
  shape.push_back(K);
  return mx::array(shape, mx::float32, std::make_shared<DequantizeRows>(s, bits), {w, scales, biases, rows});
}

}  // namespace mlxcel
