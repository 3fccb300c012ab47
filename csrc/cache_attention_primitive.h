// RowExactCacheAttention: one layer's cache writes and attentions of a batched forward over
#pragma once
#include <optional>
#include <vector>

#include "mlx/mlx.h"
#include "tree_rows.h"

namespace mlxcel {

namespace mx = mlx::core;

// [attention, k_bufs..., v_bufs...]: entries of L rows, entry e of sequence seq[e] at positions
// pos[e]..; rows equal row_exact_attention over each sequence alone. `tree` (optional, entries of
// one row): draft-tree rows, written at their slots and attending their prefix and tails
// (layer_kernel.h, "Tree rows").
std::vector<mx::array> row_exact_cache_attention(const mx::array& q, const mx::array& k_new, const mx::array& v_new,
                                                 const std::vector<mx::array>& k_bufs,
                                                 const std::vector<mx::array>& v_bufs, const std::vector<int>& seq,
                                                 const std::vector<int>& pos, float scale, const TreeRows& tree = {});

}  // namespace mlxcel
