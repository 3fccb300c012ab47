// The state the primitives share (runtime.h).
#include "runtime.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace mlxcel {

std::atomic<int> kernel_threads{1};
std::atomic<long long> qmm_ns{0}, qmm_calls{0};
std::atomic<long long> attention_ns{0};
std::atomic<long long> layer_ns{0}, layer_calls{0};
std::atomic<long long> buffers_donated{0}, buffers_copied{0};

BufferWrites take_buffers(const std::vector<mlx::core::array>& inputs, size_t first_in,
                          std::vector<mlx::core::array>& outputs, size_t first_out, size_t n) {
  BufferWrites w;
  for (size_t j = 0; j < n; ++j) {
    const auto& in = inputs[first_in + j];
    auto& o = outputs[first_out + j];
    if (donatable_by(in, outputs.size())) {
      o.copy_shared_buffer(in);
      buffers_donated += 1;
    } else {
      o.set_data(mlx::core::allocator::malloc(o.nbytes()));
      w.from.push_back(in);
      w.to.push_back(o.data<void>());
      buffers_copied += 1;
    }
  }
  return w;
}

void BufferWrites::copy() const {
  for (size_t c = 0; c < from.size(); ++c) {
    if (from[c].itemsize() == 2) {  // a float16 cache
      std::vector<uint16_t> scratch;
      std::memcpy(to[c], contiguous_rows(from[c], scratch), from[c].nbytes());
    } else {
      std::vector<float> scratch;
      std::memcpy(to[c], contiguous_rows(from[c], scratch), from[c].nbytes());
    }
  }
}

void kv_types(const std::vector<mlx::core::array>& k_bufs, const std::vector<mlx::core::array>& v_bufs,
              const char* what, KvType* kt, KvType* vt) {
  for (size_t b = 0; b < k_bufs.size(); ++b) {
    KvType k, v;
    if (!kv_type_of(k_bufs[b], &k) || !kv_type_of(v_bufs[b], &v))
      throw std::invalid_argument(std::string(what) + "KV buffers must be float32, float16, bfloat16, int8 (q8_0) or uint8 (q4_0)");
    if (b == 0) {
      *kt = k;
      *vt = v;
    } else if (k != *kt || v != *vt) {
      throw std::invalid_argument(std::string(what) + "every sequence's key buffers must share one type, and its value buffers one type");
    }
  }
}

void check_kv_rows(const std::vector<mlx::core::array>& k_bufs, const std::vector<mlx::core::array>& v_bufs, int D,
                   KvType kt, KvType vt, const char* what) {
  if ((kv_blocks(kt) || kv_blocks(vt)) && !kv_block_head_dim(D))
    throw std::invalid_argument(std::string(what) + "a q8_0 or q4_0 KV cache needs a head dim of 32, 64 or 128, not " + std::to_string(D));
  for (size_t b = 0; b < k_bufs.size(); ++b)
    if (k_bufs[b].shape(3) != kv_row(D, kt) || v_bufs[b].shape(3) != kv_row(D, vt))
      throw std::invalid_argument(std::string(what) + "buffer " + std::to_string(b) + "'s rows must hold " +
                                  std::to_string(kv_row(D, kt)) + " key and " + std::to_string(kv_row(D, vt)) +
                                  " value elements for a head dim of " + std::to_string(D));
}

void check_bits(int bits) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("bits must be 4 or 8");
}

}  // namespace mlxcel
