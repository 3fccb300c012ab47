// The state the primitives share (runtime.h).
#include "runtime.h"

#include <stdexcept>

namespace mlxcel {

std::atomic<int> kernel_threads{1};
std::atomic<long long> qmm_ns{0}, qmm_calls{0};
std::atomic<long long> attention_ns{0};
std::atomic<long long> layer_ns{0}, layer_calls{0};
std::atomic<long long> buffers_donated{0}, buffers_copied{0};

void check_bits(int bits) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("bits must be 4 or 8");
}

}  // namespace mlxcel
