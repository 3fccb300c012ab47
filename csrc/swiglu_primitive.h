// RowSwiGLU: silu(gate) * up, elementwise (rowwise_kernel.h), on MLX's CPU stream.
#pragma once
#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

// silu(gate) * up, elementwise (vectorised exp)
mx::array row_swiglu(const mx::array& gate, const mx::array& up);

}  // namespace mlxcel
