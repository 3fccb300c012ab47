// RowExactDecoderLayer: one llama-family decoder layer as one MLX op (layer_kernel.h).
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "mlx/mlx.h"
#include "tree_rows.h"

namespace mlxcel {

namespace mx = mlx::core;

struct DecoderLayerState;

// A layer's weights, held (evaluated) for its life; calling it adds one op to the graph.
class DecoderLayer {
 public:
  // in2_norm: an EAGLE-3 midlayer (layer_kernel.h), whose calls pass e, the rows' embeddings.
  // linears in the order q, k, v, o, gate, up, down: each the kernel's uint8 weight, interleaved
  // float32 scales and biases (RowExactLinear) and its bits, or a float weight [N/16, K, 16] in its
  // stored precision from float_repack and no scales or biases (RowExactFloatLinear); and an
  // optional float32 bias [N]
  DecoderLayer(const std::vector<mx::array>& ws, const std::vector<std::optional<mx::array>>& scales,
               const std::vector<std::optional<mx::array>>& biases, const std::vector<int>& bits,
               const std::vector<std::optional<mx::array>>& bias, const mx::array& attn_norm,
               const mx::array& mlp_norm, std::optional<mx::array> q_norm, std::optional<mx::array> k_norm, float eps,
               float qk_eps, int heads, int kv_heads, int head_dim, int rope_dims, bool rope_traditional,
               float rope_base, float rope_scale, float attn_scale,
               std::optional<mx::array> in2_norm = std::nullopt);

  // h [..., hidden] (T rows in all); row t of sequence seq[t] at position pos[t]; the key and
  // value buffers [1, kv_heads, capacity, head_dim] of the S sequences. Returns [h out, the S key
  // buffers, the S value buffers] (a buffer only this op holds is written in place). `tree`
  // (optional): the rows are a draft tree's (layer_kernel.h, "Tree rows").
  std::vector<mx::array> operator()(const mx::array& h, const std::vector<mx::array>& k_bufs,
                                    const std::vector<mx::array>& v_bufs, const std::vector<int>& seq,
                                    const std::vector<int>& pos, const TreeRows& tree = {},
                                    std::optional<mx::array> e = std::nullopt) const;

 private:
  std::shared_ptr<const DecoderLayerState> state_;
};

}  // namespace mlxcel
