// Weights moved into one arena of transparent huge pages (Linux), in the order given.
#pragma once
#include <cstddef>
#include <vector>

#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

struct HugePagesResult {
  std::vector<mx::array> arrays;  // the copies (or the inputs, when no arena could be made)
  size_t bytes = 0;               // the arena's size, 0 when none was made
  size_t huge_bytes = 0;          // how much of it the kernel backs with huge pages
};

// Copies `arrays` (evaluated, row-contiguous) back to back, each 64-byte aligned, into one
// mapping advised MADV_HUGEPAGE (and collapsed where the fault-time allocation fell short).
HugePagesResult to_huge_pages(std::vector<mx::array> arrays);

// bytes the arenas still alive map (for memory figures: MLX's allocator does not count them)
size_t huge_pages_bytes();

}  // namespace mlxcel
