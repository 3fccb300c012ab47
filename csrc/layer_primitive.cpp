// RowExactDecoderLayer: a llama-family decoder layer (layer_kernel.h) as one op on MLX's CPU
// stream: the layer's input rows and its sequences' KV buffers in, its output rows and the
// written buffers out. The rows of one op may be one sequence's (a decode step, a verify block, a
// prompt chunk) or several sequences' (a batched server step): every row goes through the same
// row-wise code, so both give it the same bits.
#include "layer_primitive.h"

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "fmm_primitive.h"
#include "layer_kernel.h"
#include "qmm_kernel.h"
#include "rope_primitive.h"
#include "runtime.h"
#include "tree_rows.h"

namespace mlxcel {

struct DecoderLayerState {
  std::vector<mx::array> held;  // every array the view points into
  DecoderLayerView view{};
  int hidden = 0;
  float rope_base = 0, rope_scale = 1;
  // an EAGLE-3 midlayer (view.in2_norm set): e is the op's last input
  bool two_inputs() const { return view.in2_norm != nullptr; }
};

namespace {

class RowExactDecoderLayer : public mx::Primitive {
 public:
  RowExactDecoderLayer(mx::Stream s, std::shared_ptr<const DecoderLayerState> st, std::vector<int> seq,
                       std::vector<int> pos, TreeRows tree)
      : mx::Primitive(s), st_(std::move(st)), seq_(std::move(seq)), pos_(std::move(pos)), tree_(std::move(tree)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const bool two = st_->two_inputs();
    const int S = static_cast<int>(inputs.size() - 1 - (two ? 1 : 0)) / 2;
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    const BufferWrites writes = take_buffers(inputs, 1, outputs, 1, 2 * S);
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) enc.set_input_array(a);
    for (auto& o : outputs) enc.set_output_array(o);
    std::vector<void*> bufs(2 * S);
    std::vector<int64_t> capacity(S);
    for (int j = 0; j < 2 * S; ++j) bufs[j] = outputs[1 + j].data<void>();
    KvType kt = KvType::f32, vt = KvType::f32;
    kv_type_of(outputs[1], &kt);
    kv_type_of(outputs[1 + S], &vt);
    for (int b = 0; b < S; ++b) capacity[b] = outputs[1 + b].shape(2);
    enc.dispatch([h = inputs[0], e = two ? inputs.back() : inputs[0], two, writes, bufs = std::move(bufs), capacity = std::move(capacity), st = st_,
                  seq = seq_, pos = pos_, tree = tree_, op = out.data<float>(), S, kt, vt, threads = kernel_threads.load()]() {
      writes.copy();
      std::vector<float> scratch, scratch_e;
      const float* hp = contiguous_rows(h, scratch);
      const float* ep = two ? contiguous_rows(e, scratch_e) : nullptr;
      const std::vector<int32_t> p32(pos.begin(), pos.end());
      const auto table = rope_table_for(p32, st->view.rope_dims, st->rope_base, st->rope_scale);
      LayerRows rows{};
      rows.h = hp;
      rows.e = ep;
      rows.out = op;
      rows.T = static_cast<int>(seq.size());
      rows.seq = seq.data();
      rows.pos = pos.data();
      rows.cos_sin = table->data();
      rows.k_bufs = bufs.data();
      rows.v_bufs = bufs.data() + S;
      rows.kt = kt;
      rows.vt = vt;
      rows.capacity = capacity.data();
      const TreeTails tails(tree);
      if (!tree.empty()) {
        rows.slot = tree.slot.data();
        rows.vis_base = tree.base.data();
        rows.vis_tail = tails.ptr.data();
        rows.vis_tail_n = tails.n.data();
      }
      auto t0 = std::chrono::steady_clock::now();
      decoder_layer(st->view, rows, threads);
      layer_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      layer_calls += 1;
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("the row-exact decoder layer runs on the CPU only");
  }

  const char* name() const override { return "RowExactDecoderLayer"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowExactDecoderLayer&>(other);
    return st_ == o.st_ && seq_ == o.seq_ && pos_ == o.pos_ && tree_ == o.tree_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes;
    for (const auto& a : inputs) shapes.push_back(a.shape());
    if (st_->two_inputs()) shapes.pop_back();  // e goes in only
    return shapes;
  }

 private:
  std::shared_ptr<const DecoderLayerState> st_;
  std::vector<int> seq_, pos_;
  TreeRows tree_;
};

const float* floats(const mx::array& a, int n, const char* what) {
  if (a.dtype() != mx::float32 || a.size() != static_cast<size_t>(n) || !a.flags().row_contiguous)
    throw std::invalid_argument(std::string("decoder_layer: ") + what + " must be float32 [" + std::to_string(n) + "]");
  return a.data<float>();
}

}  // namespace

DecoderLayer::DecoderLayer(const std::vector<mx::array>& ws, const std::vector<std::optional<mx::array>>& scales,
                           const std::vector<std::optional<mx::array>>& biases, const std::vector<int>& bits,
                           const std::vector<std::optional<mx::array>>& bias, const mx::array& attn_norm,
                           const mx::array& mlp_norm, std::optional<mx::array> q_norm,
                           std::optional<mx::array> k_norm, float eps, float qk_eps, int heads, int kv_heads,
                           int head_dim, int rope_dims, bool rope_traditional, float rope_base, float rope_scale,
                           float attn_scale, std::optional<mx::array> in2_norm) {
  const char* what = "decoder_layer: ";
  if (ws.size() != 7 || scales.size() != 7 || biases.size() != 7 || bits.size() != 7 || bias.size() != 7)
    throw std::invalid_argument(std::string(what) + "seven linears: q, k, v, o, gate, up, down");
  auto st = std::make_shared<DecoderLayerState>();
  std::vector<mx::array> all(ws);
  for (const auto* extra : {&scales, &biases})
    for (const auto& a : *extra)
      if (a) all.push_back(*a);
  all.push_back(attn_norm);
  all.push_back(mlp_norm);
  for (const auto& b : bias)
    if (b) all.push_back(*b);
  if (q_norm) all.push_back(*q_norm);
  if (k_norm) all.push_back(*k_norm);
  if (in2_norm) all.push_back(*in2_norm);
  mx::eval(all);
  st->held = all;
  const int hidden = attn_norm.size();
  LinearView* views[7] = {&st->view.q, &st->view.k, &st->view.v, &st->view.o,
                          &st->view.gate, &st->view.up, &st->view.down};
  for (int i = 0; i < 7; ++i) {
    const auto& w = ws[i];
    if (w.dtype() != mx::uint8) {  // a float weight in its stored precision (fmm_kernel.h): no scales
      const FloatForm form = float_form(w, "decoder_layer");
      if (w.ndim() != 3 || w.shape(2) != kGroup || !w.flags().row_contiguous || scales[i] || biases[i])
        throw std::invalid_argument(std::string(what) + "linear " + std::to_string(i) +
                                    ": a float weight is [N/16, K, 16] from float_repack, without scales or biases");
      const int N = w.shape(0) * kGroup, K = w.shape(1);
      *views[i] = LinearView{w.data<uint8_t>(), nullptr, nullptr, bias[i] ? floats(*bias[i], N, "a bias") : nullptr,
                             N, K, 0, false, true, static_cast<int>(form)};
      continue;
    }
    check_bits(bits[i]);
    if (!scales[i] || !biases[i])
      throw std::invalid_argument(std::string(what) + "linear " + std::to_string(i) + ": a quantized weight needs scales and biases");
    const auto &sc = *scales[i], &bi = *biases[i];  // empty biases: a symmetric weight
    if (w.ndim() != 2 || w.dtype() != mx::uint8 || !w.flags().row_contiguous)
      throw std::invalid_argument(std::string(what) + "weights must be uint8 [N, K*bits/8] from repack()");
    const int N = w.shape(0), K = static_cast<int>(w.shape(1) * 8 / bits[i]);
    if (K % 64 != 0 || !biases_fit(sc, bi) || sc.ndim() != 2 || sc.shape(0) != N || sc.shape(1) != K / 32 ||
        !sc.flags().row_contiguous || !bi.flags().row_contiguous)
      throw std::invalid_argument(std::string(what) + "linear " + std::to_string(i) +
                                  ": scales/biases must be float32 (or both float16) [N, K/32], K a multiple of 64");
    *views[i] = LinearView{w.data<uint8_t>(), sc.data<void>(), no_biases(bi) ? nullptr : bi.data<void>(),
                           bias[i] ? floats(*bias[i], N, "a bias") : nullptr, N, K, bits[i],
                           sc.dtype() == mx::float16};
  }
  auto& v = st->view;
  const int qd = heads * head_dim, kvd = kv_heads * head_dim;
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0 || rope_dims <= 0 ||
      rope_dims > head_dim || rope_dims % 2 != 0)
    throw std::invalid_argument(std::string(what) + "heads must be a multiple of kv_heads; 0 < rope_dims <= head_dim, even");
  const int in = in2_norm ? 2 * hidden : hidden;  // q/k/v's inputs
  if (v.q.K != in || v.k.K != in || v.v.K != in || v.q.N != qd || v.k.N != kvd || v.v.N != kvd ||
      v.o.K != qd || v.o.N != hidden || v.gate.K != hidden || v.up.K != hidden || v.up.N != v.gate.N ||
      v.down.K != v.gate.N || v.down.N != hidden)
    throw std::invalid_argument(std::string(what) + "the linears' shapes do not make a decoder layer");
  v.attn_norm = floats(attn_norm, hidden, "attn_norm");
  v.mlp_norm = floats(mlp_norm, hidden, "mlp_norm");
  v.q_norm = q_norm ? floats(*q_norm, head_dim, "q_norm") : nullptr;
  v.k_norm = k_norm ? floats(*k_norm, head_dim, "k_norm") : nullptr;
  v.in2_norm = in2_norm ? floats(*in2_norm, hidden, "in2_norm") : nullptr;
  v.eps = eps;
  v.qk_eps = qk_eps;
  v.Hq = heads;
  v.Hkv = kv_heads;
  v.D = head_dim;
  v.rope_dims = rope_dims;
  v.rope_traditional = rope_traditional;
  v.attn_scale = attn_scale;
  st->hidden = hidden;
  st->rope_base = rope_base;
  st->rope_scale = rope_scale;
  state_ = st;
}

std::vector<mx::array> DecoderLayer::operator()(const mx::array& h, const std::vector<mx::array>& k_bufs,
                                                const std::vector<mx::array>& v_bufs, const std::vector<int>& seq,
                                                const std::vector<int>& pos, const TreeRows& tree,
                                                std::optional<mx::array> e) const {
  const char* what = "decoder_layer: ";
  const auto& v = state_->view;
  if (h.dtype() != mx::float32 || h.ndim() < 1 || h.shape(-1) != state_->hidden)
    throw std::invalid_argument(std::string(what) + "h must be float32 [..., " + std::to_string(state_->hidden) + "]");
  const int T = static_cast<int>(h.size() / state_->hidden);
  if (state_->two_inputs() != static_cast<bool>(e) ||
      (e && (e->ndim() < 1 || e->shape(-1) != state_->hidden || static_cast<int>(e->size()) != T * state_->hidden)))
    throw std::invalid_argument(std::string(what) + (state_->two_inputs() ? "an EAGLE-3 layer takes e, float [..., hidden] like h"
                                                                         : "e is for EAGLE-3 layers (in2_norm) only"));
  const int S = static_cast<int>(k_bufs.size());
  if (static_cast<int>(seq.size()) != T || static_cast<int>(pos.size()) != T || v_bufs.size() != k_bufs.size() || S == 0)
    throw std::invalid_argument(std::string(what) + "one sequence and position per row, one value buffer per key buffer");
  for (int b = 0; b < S; ++b)
    for (const auto* buf : {&k_bufs[b], &v_bufs[b]})
      if (buf->ndim() != 4 || buf->shape(0) != 1 || buf->shape(1) != v.Hkv ||
          k_bufs[b].shape(2) != v_bufs[b].shape(2))
        throw std::invalid_argument(std::string(what) + "buffer " + std::to_string(b) +
                                    " must be [1, kv_heads, capacity, row]");
  KvType kt, vt;
  kv_types(k_bufs, v_bufs, what, &kt, &vt);
  check_kv_rows(k_bufs, v_bufs, v.D, kt, vt, what);
  for (int t = 0; t < T; ++t)
    if (seq[t] < 0 || seq[t] >= S || pos[t] < 0 || (tree.empty() && pos[t] >= k_bufs[seq[t]].shape(2)))
      throw std::invalid_argument(std::string(what) + "row " + std::to_string(t) +
                                  ": no such sequence, or its buffer has no room at its position");
  if (!tree.empty()) {
    std::vector<int> capacity;
    for (const auto& b : k_bufs) capacity.push_back(b.shape(2));
    tree.check(what, seq, capacity);
  }
  auto s = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs{mx::astype(h, mx::float32, s)};
  for (const auto* bufs : {&k_bufs, &v_bufs})
    for (const auto& buf : *bufs) inputs.push_back(buf);
  std::vector<mx::Shape> shapes;
  for (const auto& a : inputs) shapes.push_back(a.shape());
  std::vector<mx::Dtype> dtypes;
  for (const auto& a : inputs) dtypes.push_back(a.dtype());
  if (e) inputs.push_back(mx::astype(*e, mx::float32, s));  // in only: not among the outputs
  return mx::array::make_arrays(std::move(shapes), dtypes,
                                std::make_shared<RowExactDecoderLayer>(s, state_, seq, pos, tree), inputs);
}

}  // namespace mlxcel
