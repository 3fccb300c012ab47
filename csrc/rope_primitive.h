// RowRope: rotary embeddings with each batch entry at its own offset (rowwise_kernel.h), on MLX's
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

// rotary embedding of x [B, heads, L, dim], entry b at offsets[b] (or offset); each row depends
// on its own values and position alone
mx::array row_rope(const mx::array& x, int dims, bool traditional, float base, float scale, int offset,
                   std::optional<mx::array> offsets);

// The cos/sin table (rope_table) of these positions, shared with the other layers of a forward:
// the last few tables are kept, so 30 layers at the same positions make it once.
std::shared_ptr<const std::vector<float>> rope_table_for(const std::vector<int32_t>& pos, int dims, float base,
                                                         float scale);

}  // namespace mlxcel
