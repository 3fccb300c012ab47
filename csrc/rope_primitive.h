// RowRope: rotary embeddings with each batch entry at its own offset (rowwise_kernel.h), on MLX's
#pragma once
#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

// rotary embedding of x [B, heads, L, dim], entry b at offsets[b] (or offset); each row depends
// on its own values and position alone
mx::array row_rope(const mx::array& x, int dims, bool traditional, float base, float scale, int offset,
                   std::optional<mx::array> offsets);

}  // namespace mlxcel
