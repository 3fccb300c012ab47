// RowRope: rotary embeddings with each batch entry at its own offset (rowwise_kernel.h), on MLX's
// CPU stream.
#include "rope_primitive.h"

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "runtime.h"
#include <list>
#include <mutex>

#include "rowwise_kernel.h"

namespace mx = mlx::core;

namespace mlxcel {

namespace {

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
    rope_table(pos.data(), static_cast<int>(pos.size()), dims, base, scale, table->data());
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
                  scale = scale_, offset = offset_, threads = kernel_threads.load()]() {
      const int B = x.shape(0), H = x.shape(1), L = x.shape(2), D = x.shape(3);
      std::vector<int32_t> pos(static_cast<size_t>(B) * L);
      for (int b = 0; b < B; ++b) {
        const int32_t o = offsets ? offsets->data<int32_t>()[offsets->size() == 1 ? 0 : b] : offset;
        for (int l = 0; l < L; ++l) pos[static_cast<size_t>(b) * L + l] = o + l;
      }
      const auto table = g_rope_tables.get(pos, dims, base, scale);
      const int64_t st[3] = {x.strides()[0], x.strides()[1], x.strides()[2]};
      rope(x.data<float>(), st, op, B, H, L, D, dims, trad, table->data(), threads);
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

}  // namespace

std::shared_ptr<const std::vector<float>> rope_table_for(const std::vector<int32_t>& pos, int dims, float base,
                                                         float scale) {
  return g_rope_tables.get(pos, dims, base, scale);
}

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

}  // namespace mlxcel
