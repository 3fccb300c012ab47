// MoveRows: KV buffers' rows moved down in place (a draft tree's accepted path, compacted).
#pragma once
#include <vector>

#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

// For each float32 buffer [1, heads, capacity, D]: row rows[j] moved to row first + j, for every
// head (rows increasing, rows[j] >= first + j). Returns the buffers (written in place where only
// this op holds them, else copied first).
std::vector<mx::array> move_rows(const std::vector<mx::array>& bufs, const std::vector<int>& rows, int first);

}  // namespace mlxcel
