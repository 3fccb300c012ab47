// The kernel's weight layout, scalar (qmm_kernel.h; the layout itself is described in
// qmm_kernel.cpp): MLX affine rows into it and back, and scales and biases into its order. Built
// for the baseline ISA: it runs at load time on any CPU.
#include <cstring>

#include "qmm_kernel.h"

namespace mlxcel {

void repack(const uint8_t* mlx_rows, uint8_t* out, int N, int K, int bits) {
  const size_t rb = row_bytes(K, bits);
  std::memset(out, 0, rb * N);
  for (int n = 0; n < N; ++n) {
    const int g = n / kGroup, r = group_rows(N, g), i = n % kGroup;
    uint8_t* base = out + static_cast<size_t>(g) * kGroup * rb;
    const uint8_t* src = mlx_rows + static_cast<size_t>(n) * rb;
    for (int k = 0; k < K; ++k) {
      const uint8_t q = bits == 8 ? src[k] : (k % 2 ? src[k / 2] >> 4 : src[k / 2] & 0x0F);
      bool high;
      uint8_t* byte = base + value_offset(i, k, r, bits, &high);
      *byte |= high ? static_cast<uint8_t>(q << 4) : q;
    }
  }
}

void unpack(const uint8_t* packed, uint8_t* q, int N, int K, int bits) {
  const size_t rb = row_bytes(K, bits);
  for (int n = 0; n < N; ++n) {
    const int g = n / kGroup, r = group_rows(N, g), i = n % kGroup;
    const uint8_t* base = packed + static_cast<size_t>(g) * kGroup * rb;
    for (int k = 0; k < K; ++k) {
      bool high;
      const uint8_t byte = base[value_offset(i, k, r, bits, &high)];
      q[static_cast<size_t>(n) * K + k] = bits == 8 ? byte : (high ? byte >> 4 : byte & 0x0F);
    }
  }
}

void interleave(const float* rows, float* out, int N, int nb) {
  for (int n = 0; n < N; ++n) {
    const int g = n / kGroup, r = group_rows(N, g), i = n % kGroup;
    for (int b = 0; b < nb; ++b)
      out[static_cast<size_t>(g) * kGroup * nb + static_cast<size_t>(b) * r + i] = rows[static_cast<size_t>(n) * nb + b];
  }
}

}  // namespace mlxcel
