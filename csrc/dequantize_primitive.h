// DequantizeRows: rows of a repacked weight as float32 (an embedding lookup, or a block too wide
#pragma once
#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

// rows `ids` (default: all) of a repacked weight as float32 [..., K]
mx::array dequantize_weight_rows(const mx::array& w, const mx::array& scales, const mx::array& biases, int bits,
                          std::optional<mx::array> ids);

}  // namespace mlxcel
