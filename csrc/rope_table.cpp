// The rotary embedding's cos and sin table (rowwise_kernel.h): scalar, built for the baseline ISA,
// so both kernel builds rotate by the same values.
#include <cmath>
#include <cstdint>

#include "rowwise_kernel.h"

namespace mlxcel {

void rope_table(const int32_t* pos, int count, int dims, float base, float scale, float* out) {
  const int half = dims / 2;
  float* cs = out;
  float* sn = out + static_cast<int64_t>(count) * half;
  for (int i = 0; i < half; ++i) {
    // MLX's frequencies: base ** (-2i / dims) in float32
    const float freq = std::pow(base, -static_cast<float>(2 * i) / static_cast<float>(dims));
    for (int r = 0; r < count; ++r) {
      const float theta = static_cast<float>(pos[r]) * scale * freq;
      cs[static_cast<int64_t>(r) * half + i] = static_cast<float>(std::cos(static_cast<double>(theta)));
      sn[static_cast<int64_t>(r) * half + i] = static_cast<float>(std::sin(static_cast<double>(theta)));
    }
  }
}

}  // namespace mlxcel
