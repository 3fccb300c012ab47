// RowExactAttention: softmax(scale q k^T) v one query row at a time (attention_kernel.h), on
#pragma once
#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

// each row bit-identical to a one-row call at the same position (row i of a causal block sees
// keys 0..S-L+i)
mx::array row_exact_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal);

}  // namespace mlxcel
