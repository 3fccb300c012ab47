// The kernel's weight layout from and to MLX arrays (eager): repack, interleave, unpack
#pragma once
#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

// MLX affine rows (uint32 [N, K*bits/32]) -> the kernel's layout (uint8 [N, K*bits/8])
mx::array repack_weight(mx::array w, int bits);

// per-block scales or biases float32 [N, K/32] -> the kernel's order (16 rows side by side per block)
mx::array interleave_blocks(mx::array a);

// the kernel's layout -> one uint8 value per weight, natural order [N, K]
mx::array unpack_weight(mx::array w, int bits);

}  // namespace mlxcel
