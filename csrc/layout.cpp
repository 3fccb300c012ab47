// The kernel's weight layout from and to MLX arrays (eager): repack, interleave, unpack
// (qmm_kernel.h has the layout itself).
#include "layout.h"

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

// MLX affine rows (uint32 [N, K*bits/32]) -> the kernel's layout (uint8 [N, K*bits/8]); eager.
mx::array repack_weight(mx::array w, int bits) {
  check_bits(bits);
  if (w.ndim() != 2 || w.dtype() != mx::uint32) throw std::invalid_argument("repack: w must be uint32 [N, K*bits/32]");
  const int N = w.shape(0);
  const int K = w.shape(1) * 32 / bits;
  if (K % 64 != 0) throw std::invalid_argument("repack: K must be a multiple of 64");
  w = mx::contiguous(w);
  mx::eval(w);
  const size_t rb = row_bytes(K, bits);
  mx::array out(mx::allocator::malloc(N * rb), {N, static_cast<int>(rb)}, mx::uint8);
  const uint8_t* src = w.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  repack(src, dst, N, K, bits);
  return out;
}

// Per-block scales or biases [N, K/32] into the kernel's interleaved order; eager.
mx::array interleave_blocks(mx::array a) {
  if (a.ndim() != 2 || a.dtype() != mx::float32) throw std::invalid_argument("interleave: float32 [N, K/32] only");
  a = mx::contiguous(a);
  mx::eval(a);
  mx::array out(mx::allocator::malloc(a.nbytes()), a.shape(), mx::float32);
  interleave(a.data<float>(), out.data<float>(), a.shape(0), a.shape(1));
  return out;
}

// The kernel's layout back to one uint8 value per weight, natural order [N, K]; eager.
mx::array unpack_weight(mx::array w, int bits) {
  check_bits(bits);
  if (w.ndim() != 2 || w.dtype() != mx::uint8) throw std::invalid_argument("unpack: w must be uint8 [N, K*bits/8]");
  const int N = w.shape(0);
  const int K = w.shape(1) * 8 / bits;
  w = mx::contiguous(w);
  mx::eval(w);
  mx::array out(mx::allocator::malloc(static_cast<size_t>(N) * K), {N, K}, mx::uint8);
  unpack(w.data<uint8_t>(), out.data<uint8_t>(), N, K, bits);
  return out;
}

}  // namespace mlxcel
