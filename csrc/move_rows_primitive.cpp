// MoveRows (move_rows_primitive.h): after a draft tree's verify forward the caches hold every
// node's key and value; the accepted path's rows move down to consecutive positions after the
// root, so the cache is what a chain of the same tokens would have left. One op for every layer's
// buffers, in place: MLX's gather and slice update would copy each whole buffer (the gather keeps
// a reference to it), a few rows of work turned into the whole cache's bytes.
#include "move_rows_primitive.h"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "runtime.h"

namespace mlxcel {

namespace {

class MoveRows : public mx::Primitive {
 public:
  MoveRows(mx::Stream s, std::vector<int> rows, int first) : mx::Primitive(s), rows_(std::move(rows)), first_(first) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const BufferWrites writes = take_buffers(inputs, 0, outputs, 0, inputs.size());
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) enc.set_input_array(a);
    for (auto& o : outputs) enc.set_output_array(o);
    std::vector<char*> bufs;  // bytes: float32 or float16 rows (the cache type), moved as they are
    std::vector<mx::Shape> shapes;
    std::vector<int64_t> item;
    for (auto& o : outputs) {
      bufs.push_back(o.data<char>());
      shapes.push_back(o.shape());
      item.push_back(static_cast<int64_t>(o.itemsize()));
    }
    enc.dispatch([writes, bufs = std::move(bufs), shapes = std::move(shapes), item = std::move(item), rows = rows_, first = first_]() {
      writes.copy();
      for (size_t b = 0; b < bufs.size(); ++b) {
        const int64_t H = shapes[b][1], cap = shapes[b][2], D = shapes[b][3] * item[b];  // D: a row's bytes
        for (int64_t h = 0; h < H; ++h) {
          char* head = bufs[b] + h * cap * D;
          for (size_t j = 0; j < rows.size(); ++j)
            if (rows[j] != first + static_cast<int>(j))
              std::memmove(head + (first + static_cast<int64_t>(j)) * D, head + static_cast<int64_t>(rows[j]) * D, D);
        }
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("move_rows runs on the CPU only");
  }

  const char* name() const override { return "MoveRows"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const MoveRows&>(other);
    return rows_ == o.rows_ && first_ == o.first_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes;
    for (const auto& a : inputs) shapes.push_back(a.shape());
    return shapes;
  }

 private:
  std::vector<int> rows_;
  int first_;
};

}  // namespace

std::vector<mx::array> move_rows(const std::vector<mx::array>& bufs, const std::vector<int>& rows, int first) {
  const char* what = "move_rows: ";
  if (bufs.empty()) return {};
  for (const auto& b : bufs) {
    KvType t;
    if (!kv_type_of(b, &t) || b.ndim() != 4 || b.shape(0) != 1)
      throw std::invalid_argument(std::string(what) + "buffers must be KV buffers (float32, float16, bfloat16, int8 or uint8) [1, heads, capacity, row]");
  }
  for (size_t j = 0; j < rows.size(); ++j) {
    const bool increasing = j == 0 || rows[j] > rows[j - 1];
    for (const auto& b : bufs)
      if (first < 0 || rows[j] < first + static_cast<int>(j) || rows[j] >= b.shape(2) || !increasing)
        throw std::invalid_argument(std::string(what) + "rows must be increasing, inside the buffers, at or after first + their index");
  }
  auto s = mx::default_stream(mx::Device::cpu);
  std::vector<mx::Shape> shapes;
  for (const auto& b : bufs) shapes.push_back(b.shape());
  std::vector<mx::Dtype> dtypes;
  for (const auto& b : bufs) dtypes.push_back(b.dtype());
  return mx::array::make_arrays(std::move(shapes), dtypes, std::make_shared<MoveRows>(s, rows, first), bufs);
}

}  // namespace mlxcel
